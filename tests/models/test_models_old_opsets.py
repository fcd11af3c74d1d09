"""Issue 33: a model older than opset 17 is raised to it with onnx's version converter on
`import` (a note says so), and iree-compile failures on an imported model do not tell the user
to fix MLIR they never wrote."""

from __future__ import annotations

import pytest
from conftest import assert_clean_error, run_cli

onnx = pytest.importorskip("onnx", reason='onnx is not installed (pip install "pyree_build[onnx]")')
pytest.importorskip("onnxruntime", reason='onnxruntime is not installed (pip install "pyree_build[onnx]")')

from onnx import TensorProto, helper  # noqa: E402
from support import onnx_models as models  # noqa: E402


def _max_pool(opset: int) -> onnx.ModelProto:
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=4)
    onnx.checker.check_model(model)
    return model


def test_an_opset_9_model_is_converted_imported_and_verified(tmp_path):
    onnx.save(_max_pool(9), tmp_path / "pool.onnx")
    # As it is, IREE 3.13 cannot lower the opset-9 MaxPool (asking for opset 9 keeps it).
    kept = run_cli("import", tmp_path / "pool.onnx", "-o", tmp_path / "kept.mlir", "--opset-version", "9")
    assert_clean_error(kept, "ONNX node 'pool' (MaxPool) cannot be lowered")
    result = run_cli("import", tmp_path / "pool.onnx", "-o", tmp_path / "pool.mlir")
    assert result.returncode == 0, result
    assert "note:" in result.stderr and "opset 9 is older than 17" in result.stderr and "version converter" in result.stderr
    text = (tmp_path / "pool.mlir").read_text()
    assert "torch.onnx_meta.opset_version = 17" in text and 'loc("pool")' in text  # node names survive the conversion
    assert run_cli("compile", tmp_path / "pool.mlir", "-o", tmp_path / "pool.vmfb").returncode == 0
    verified = run_cli("verify", tmp_path / "pool.vmfb", "--onnx", tmp_path / "pool.onnx")
    assert verified.returncode == 0, verified


def test_a_current_model_imports_without_a_note(tmp_path):
    onnx.save(_max_pool(17), tmp_path / "pool.onnx")
    result = run_cli("import", tmp_path / "pool.onnx", "-o", tmp_path / "pool.mlir")
    assert result.returncode == 0 and "note:" not in result.stderr, result


def test_a_compile_failure_on_an_imported_model_does_not_ask_to_fix_its_mlir(tmp_path):
    models.save(models.mlp(), tmp_path / "mlp.onnx")
    assert run_cli("import", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.mlir").returncode == 0
    # An op this IREE cannot lower, as a newer importer could write it.
    text = (tmp_path / "mlp.mlir").read_text()
    assert text.count('torch.operator "onnx.Softmax"') == 1
    (tmp_path / "odd.mlir").write_text(text.replace('torch.operator "onnx.Softmax"', 'torch.operator "onnx.NoSuchOp"'))
    (tmp_path / "odd_params.irpa").write_bytes((tmp_path / "mlp_params.irpa").read_bytes())  # its weights, beside it
    result = run_cli("compile", tmp_path / "odd.mlir", "-o", tmp_path / "odd.vmfb")
    assert_clean_error(result, "imported from an ONNX model (no MLIR of yours)", "--opset-version")
    assert "fix the MLIR" not in result.stderr and not (tmp_path / "odd.vmfb").exists()
    # A program written by hand still gets the plain advice.
    (tmp_path / "hand.mlir").write_text(
        "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = arith.nosuch %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n"
    )
    assert_clean_error(run_cli("compile", tmp_path / "hand.mlir", "-o", tmp_path / "hand.vmfb"), "fix the MLIR at the location shown")
