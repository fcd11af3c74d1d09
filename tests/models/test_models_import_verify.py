"""Issue 21, items 1 and 4: `import` (ONNX -> MLIR, each op named by its node, checked by IREE's
input conversion) and `verify` (a module against onnxruntime), from the CLI, Python and CMake,
on models built with the onnx helper API (tests/support/onnx_models.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, assert_clean_error, run_cli

onnx = pytest.importorskip("onnx", reason='onnx is not installed (pip install "pyree_build[onnx]")')
pytest.importorskip("onnxruntime", reason='onnxruntime is not installed (pip install "pyree_build[onnx]")')

import numpy as np  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from support import onnx_models as models  # noqa: E402

import pyree_build as pb  # noqa: E402
from pyree_build.core import toolchain  # noqa: E402
from pyree_build.models import verify_inputs  # noqa: E402


def _import_and_compile(tmp_path: Path, name: str, model: onnx.ModelProto) -> tuple[Path, Path, Path]:
    onnx_file = Path(models.save(model, tmp_path / f"{name}.onnx"))
    mlir, vmfb = tmp_path / f"{name}.mlir", tmp_path / f"{name}.vmfb"
    result = run_cli("import", onnx_file, "-o", mlir)
    assert result.returncode == 0, result
    result = run_cli("compile", mlir, "-o", vmfb)
    assert result.returncode == 0, result
    return onnx_file, mlir, vmfb


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return _import_and_compile(tmp_path_factory.mktemp("mlp"), "mlp", models.mlp())


@pytest.mark.parametrize("name", sorted(models.BUILDERS))
def test_each_model_imports_compiles_and_verifies(tmp_path, name):
    model = models.BUILDERS[name]()
    onnx_file, mlir, vmfb = _import_and_compile(tmp_path, name, model)
    text = mlir.read_text()
    for node in model.graph.node:
        assert f'loc("{node.name}")' in text, node.name
    result = run_cli("verify", vmfb, "--onnx", onnx_file)
    assert result.returncode == 0, result
    # Three sets of inputs by default (uniform, wide, ties), and the peaks draws where a softmax
    # reads a graph input, each output compared on each.
    sets = 3 + len(verify_inputs.peak_places(model, onnx_file)) + verify_inputs.threshold_turns(model, onnx_file)
    assert (sets > 3) == (name == "softmax"), sets
    assert [line for line in result.stdout.splitlines() if line.startswith("inputs ")] == [
        line for line in result.stdout.splitlines() if line.startswith("inputs ") and f" of {sets} (seed " in line
    ]
    assert len([line for line in result.stdout.splitlines() if line.startswith("  output ")]) == sets * len(model.graph.output)
    assert ": ok; worst at [" in result.stdout and "onnxruntime" in result.stdout


def test_node_names_reach_the_linalg_ops_lowered_from_them(mlp):
    _, mlir, _ = mlp
    lowered = subprocess.run(
        [*toolchain.iree_compile().argv, mlir, "--compile-to=input", "--iree-hal-target-device=local",
         "--iree-hal-local-target-device-backends=llvm-cpu", "--mlir-print-debuginfo", "-o", "-"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    matmuls = [line for line in lowered.splitlines() if "linalg.matmul" in line]
    assert [m.rsplit("loc(", 1)[1] for m in matmuls] == ['"fc1")', '"fc2")'], matmuls
    assert any('loc("relu1")' in line and "arith.select" in line for line in lowered.splitlines())


def test_python_api_imports_and_verifies(tmp_path, mlp):
    onnx_file, _, vmfb = mlp
    out = pb.import_onnx(onnx_file, tmp_path / "py.mlir")
    assert out == tmp_path / "py.mlir" and 'loc("softmax")' in out.read_text()
    result = pb.verify(vmfb, onnx_file, seed=3)
    assert result.passed and result.function == "mlp" and len(result.outputs) == 1
    (output,) = result.outputs
    assert output.name == "y" and output.shape == (4, 8) and output.max_abs_error < 1e-5 and output.mismatched == 0
    assert pb.verify(vmfb, onnx_file, inputs=["4x16xf32=0.5"]).passed
    with pytest.raises(pb.PyreeError, match="seed must be a non-negative whole number"):
        pb.verify(vmfb, onnx_file, seed=-1)


def test_verify_takes_npy_inputs_and_counts_them(tmp_path, mlp):
    onnx_file, _, vmfb = mlp
    np.save(tmp_path / "x.npy", np.random.default_rng(7).uniform(-1, 1, (4, 16)).astype(np.float32))
    result = run_cli("verify", vmfb, "--onnx", onnx_file, "--input", f"@{tmp_path / 'x.npy'}")
    assert result.returncode == 0, result
    assert_clean_error(run_cli("verify", vmfb, "--onnx", onnx_file, "--input", "4x16xf32=1", "--input", "4x16xf32=1"), "2 inputs given, the model has 1 (x)")
    assert_clean_error(run_cli("verify", vmfb, "--onnx", onnx_file, "--input", "3x16xf32=1"), "graph input 'x' is [4, 16]")


def test_verify_fails_for_a_module_of_another_model(tmp_path, mlp):
    onnx_file, _, _ = mlp
    _, _, other = _import_and_compile(tmp_path, "two_groups", models.two_groups())  # same shapes, other numbers
    result = run_cli("verify", other, "--onnx", onnx_file)
    assert_clean_error(result, "outputs of two_groups differ from onnxruntime's")
    assert "MISMATCH" in result.stdout and "worst at [" in result.stdout
    _, _, smaller = _import_and_compile(tmp_path, "softmax", models.softmax())  # other input shape
    assert_clean_error(run_cli("verify", smaller, "--onnx", onnx_file), "does not take the inputs of the ONNX model mlp.onnx")


def _mul_add_model() -> onnx.ModelProto:
    """a * b + b on 8 floats: what the plugin sample's mixed_invocation computes."""
    nodes = [helper.make_node("Mul", ["a", "b"], ["p"], name="mul"), helper.make_node("Add", ["p", "b"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes,
        "mixed_invocation",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [8]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_verify_runs_plugins_and_catches_a_plugin_that_computes_twice_the_value(tmp_path, system_plugin, system_module):
    onnx_file = models.save(_mul_add_model(), tmp_path / "mixed.onnx")
    result = run_cli("verify", system_module, "--onnx", onnx_file, "--plugin", system_plugin)
    assert result.returncode == 0, result
    source = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    product = "a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i]"
    assert product in source
    (tmp_path / "twice.c").write_text(source.replace(product, f"2.0f * {product}"))
    twice = tmp_path / "twice.so"
    assert run_cli("plugin", "--kind", "system", tmp_path / "twice.c", "-o", twice).returncode == 0
    result = run_cli("verify", system_module, "--onnx", onnx_file, "--plugin", twice)
    assert_clean_error(result, "1 of 1 outputs of mixed_invocation differ from onnxruntime's")
    assert "MISMATCH in 8 of 8 elements" in result.stdout
    assert not pb.verify(system_module, onnx_file, plugins=[twice]).passed


def test_dynamic_dimensions_need_given_inputs(tmp_path, mlp):
    _, _, vmfb = mlp
    model = models.softmax()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx_file = models.save(model, tmp_path / "dynamic.onnx")
    assert_clean_error(run_cli("verify", vmfb, "--onnx", onnx_file), "graph input 'x' has dynamic dimensions (batch)", "--input")


def _custom_op_model() -> onnx.ModelProto:
    node = helper.make_node("MyOp", ["x"], ["y"], name="my_custom_node", domain="com.example")
    graph = helper.make_graph(
        [node], "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)], ir_version=8)


def _softsign_model() -> onnx.ModelProto:
    """Softsign: a standard ONNX op that IREE 3.13's ONNX lowering does not handle."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="first_relu"), helper.make_node("Softsign", ["r"], ["y"], name="the_softsign")]
    graph = helper.make_graph(
        nodes, "soft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("build, fragments", [(_custom_op_model, ["'my_custom_node' (MyOp)"]), (_softsign_model, ["'the_softsign' (Softsign)"])])
def test_an_op_iree_cannot_lower_is_named_by_its_node(tmp_path, build, fragments):
    onnx_file = models.save(build(), tmp_path / "bad.onnx")
    result = run_cli("import", onnx_file, "-o", tmp_path / "bad.mlir")
    assert_clean_error(result, "bad.onnx: ONNX node", "cannot be lowered by IREE", *fragments)
    assert not (tmp_path / "bad.mlir").exists() and not list(tmp_path.glob(".bad.mlir*"))


def test_files_that_are_not_onnx_models_are_named(tmp_path, mlp):
    _, mlir, _ = mlp
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(0).bytes(300))
    assert_clean_error(run_cli("import", tmp_path / "random.onnx", "-o", tmp_path / "r.mlir"), "random.onnx: not an ONNX model")
    assert_clean_error(run_cli("import", mlir, "-o", tmp_path / "m.mlir"), "mlp.mlir: not an ONNX model", "already imported")
    assert_clean_error(run_cli("import", tmp_path / "absent.onnx", "-o", tmp_path / "a.mlir"), "absent.onnx: ONNX model not found")
    assert_clean_error(run_cli("verify", tmp_path / "absent.vmfb", "--onnx", mlir), "absent.vmfb: module not found")


def test_external_data_imports_and_a_missing_file_is_named(tmp_path):
    model = models.mlp()
    path = tmp_path / "ext" / "mlp.onnx"
    path.parent.mkdir()
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="mlp.weights", size_threshold=0)
    assert (path.parent / "mlp.weights").is_file()
    mlir, vmfb = tmp_path / "ext.mlir", tmp_path / "ext.vmfb"
    assert run_cli("import", path, "-o", mlir).returncode == 0
    assert run_cli("compile", mlir, "-o", vmfb).returncode == 0
    assert run_cli("verify", vmfb, "--onnx", path).returncode == 0
    moved = tmp_path / "data"
    moved.mkdir()
    shutil.move(path.parent / "mlp.weights", moved / "mlp.weights")
    assert_clean_error(run_cli("import", path, "-o", tmp_path / "x.mlir"), "mlp.onnx: external data file of tensor 'W1' not found", "mlp.weights", "--data-dir")
    assert run_cli("import", path, "-o", tmp_path / "y.mlir", "--data-dir", moved).returncode == 0


def test_externalized_params_stay_out_of_the_mlir(tmp_path, mlp):
    onnx_file, _, _ = mlp
    result = run_cli("import", onnx_file, "-o", tmp_path / "ext.mlir", "--externalize-params")
    assert result.returncode == 0, result
    text = (tmp_path / "ext.mlir").read_text()
    assert "#flow.parameter.named<" in text and "dense_resource<W1>" not in text
    assert (tmp_path / "ext_params.irpa").stat().st_size > 16 * 32 * 4
    assert 'loc("fc1")' in text


_NO_ONNX = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("onnx", "onnxruntime"):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
from pyree_build.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("verb", ["import", "verify"])
def test_without_onnx_the_extra_is_named(tmp_path, mlp, verb):
    onnx_file, _, vmfb = mlp
    argv = [onnx_file, "-o", tmp_path / "x.mlir"] if verb == "import" else [vmfb, "--onnx", onnx_file]
    proc = subprocess.run([sys.executable, "-c", _NO_ONNX, verb, *map(str, argv)], capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert 'pip install "pyree_build[onnx]"' in proc.stderr, proc.stderr


@pytest.mark.slow
def test_cmake_imports_compiles_and_verifies(tmp_path):
    from support.cmake_projects import build, configure, ctest_run, write_project

    src, out = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    models.save(models.mlp(), src / "mlp.onnx")
    models.save(models.two_groups(), src / "two_groups.onnx")
    write_project(src, "onnx_project", """
pyree_onnx_import(NAME mlp_mlir SRC mlp.onnx)
pyree_iree_module(NAME mlp SRC mlp_mlir TARGET llvm-cpu)
pyree_add_verify_test(NAME mlp_verify MODULE mlp ONNX mlp.onnx SEED 5 RTOL 1e-4 ATOL 1e-5 LABELS models)
pyree_onnx_import(NAME other_mlir SRC two_groups.onnx OUTPUT_DIR imported)
pyree_iree_module(NAME other SRC other_mlir TARGET llvm-cpu)
pyree_add_verify_test(NAME wrong_module MODULE other ONNX mlp.onnx FUNCTION two_groups)
set_tests_properties(wrong_module PROPERTIES WILL_FAIL TRUE)
""", {})  # fmt: skip
    configure(src, out)
    ran = build(out)
    assert (out / "mlp_mlir.mlir").is_file() and (out / "imported" / "other_mlir.mlir").is_file() and (out / "mlp.vmfb").is_file(), ran
    result = ctest_run(out, "--output-on-failure")
    assert result.returncode == 0, result.stdout
    assert "2 tests passed" in result.stdout or "100% tests passed" in result.stdout, result.stdout
    labelled = ctest_run(out, "-L", "models", "-N")
    assert "mlp_verify" in labelled.stdout and "wrong_module" not in labelled.stdout
    again = build(out)  # nothing changed: nothing runs
    assert "pyree_build import" not in again and "pyree_build compile" not in again, again


@pytest.mark.parametrize(
    "body, fragments",
    [
        ("pyree_onnx_import(NAME m SRC missing.onnx)\n", ["pyree_onnx_import: SRC file 'missing.onnx' not found"]),
        ("pyree_onnx_import(NAME m MODEL mlp.onnx)\n", ["pyree_onnx_import: unknown argument(s) 'MODEL", "Valid keywords:"]),
        ("pyree_onnx_import(NAME m SRC mlp.onnx OPSET_VERSION latest)\n", ["OPSET_VERSION 'latest' is not an opset number"]),
        ("pyree_onnx_import(NAME m SRC mlp.onnx INLINE_PARAMS EXTERNALIZE_PARAMS)\n", ["INLINE_PARAMS and EXTERNALIZE_PARAMS contradict each other"]),
        ("pyree_onnx_import(NAME m SRC mlp.onnx)\npyree_iree_module(NAME v SRC m TARGET llvm-cpu)\n"
         "pyree_add_verify_test(NAME t MODULE v ONNX absent.onnx)\n", ["pyree_add_verify_test: ONNX file 'absent.onnx' not found"]),
        ("pyree_onnx_import(NAME m SRC mlp.onnx)\npyree_iree_module(NAME v SRC m TARGET llvm-cpu)\n"
         "pyree_add_verify_test(NAME t MODULE v ONNX mlp.onnx RTOL loose)\n", ["pyree_add_verify_test: RTOL 'loose' is not a non-negative number"]),
        ("pyree_add_verify_test(NAME t MODULE nothing ONNX mlp.onnx)\n", ["'nothing' is neither a pyree_* target defined before this call nor an existing file"]),
        ("pyree_add_verify_test(NAME t MODULE m.vmfb ONNX mlp.onnx SEEDS 3)\n", ["unknown argument(s) 'SEEDS 3'"]),
        ("pyree_add_verify_test(NAME t MODULE m.vmfb ONNX mlp.onnx TRIALS 0)\n", ["TRIALS '0' is not a positive whole number"]),
        ("pyree_add_verify_test(NAME t MODULE m.vmfb ONNX mlp.onnx INPUT_FILES nowhere)\n", ["INPUT_FILES 'nowhere' not found"]),
        ("pyree_add_verify_test(NAME t MODULE m.vmfb ONNX mlp.onnx BASELINE none.vmfb)\n", ["'none.vmfb' is neither a pyree_* target"]),
    ],
)  # fmt: skip
def test_cmake_functions_check_their_arguments_at_configure_time(tmp_path, body, fragments):
    from support.cmake_errors import configure_project

    models.save(models.mlp(), tmp_path / "mlp.onnx")
    (tmp_path / "m.vmfb").write_bytes(b"")
    result = configure_project(tmp_path, body.replace("mlp.onnx", str(tmp_path / "mlp.onnx")).replace("m.vmfb", str(tmp_path / "m.vmfb")))
    said = " ".join(result.stderr.split())
    assert result.returncode != 0
    for fragment in fragments:
        assert fragment in said, result.stderr


def test_names_are_left_out_when_ops_and_nodes_do_not_line_up(mlp):
    from pyree_build.core import escape
    from pyree_build.models.ir import importer

    _, mlir, _ = mlp
    model = models.mlp()
    plain = "\n".join(line.split(" loc(", 1)[0] for line in mlir.read_text().split("\n"))
    named = importer.name_locations(plain, model.graph)
    assert not isinstance(named, str) and [n.name for n in named[1]] == ["fc1", "bias1", "relu1", "fc2", "softmax"]
    model.graph.node[2].op_type = "Sigmoid"  # the graph says Sigmoid where the file has Relu: no guessing
    reason = importer.name_locations(plain, model.graph)
    assert isinstance(reason, str) and "'relu1' (Sigmoid)" in reason
    assert escape.mlir_string('a"b\\c') == "a\\22b\\5Cc"


def test_import_cache_on_and_off_agree_through_an_edited_model(tmp_path):
    # The same model path with other weights must never be a stale hit: after each edit the
    # cached import equals an uncached one byte for byte, and differs from the one before.
    model = tmp_path / "m.onnx"
    previous = None
    for seed in (0, 1, 0):
        models.save(models.matmul_add_relu(seed), model)
        cached, uncached = tmp_path / "cached.mlir", tmp_path / "uncached.mlir"
        assert run_cli("import", model, "-o", cached).returncode == 0
        env = {"PYREE_BUILD_CACHE": "off"}
        proc = subprocess.run([sys.executable, "-m", "pyree_build", "import", model, "-o", uncached], capture_output=True, text=True, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr
        assert cached.read_bytes() == uncached.read_bytes()
        assert (tmp_path / "cached_params.irpa").read_bytes() == (tmp_path / "uncached_params.irpa").read_bytes()  # the weights' archive too
        if previous is not None:
            assert cached.read_bytes() != previous
        previous = cached.read_bytes()
