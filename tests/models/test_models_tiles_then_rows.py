"""Issue 47: a reduction nest and the row-wise group that reads it, merged (`--ops 5+6`: attention's
scores and their Softmax, a Linear and the LayerNorm after it), are one kernel of two fused nests,
not the per-op reference: the tiled nest computes its rows into the result's buffer, then each
workgroup's row passes run over the rows its own tiles computed, in place.

What can go wrong is the sharing out (a workgroup reading rows another has not written yet) and
the in-place reads (a value read after a stage was stored over it), so each kernel is verified
against onnxruntime on local-sync (workgroups in order) and local-task (at once), at tile heights that do and do
not divide the rows, and with the row reductions in the IR's order and in lanes.

Everything is real: iree-import-onnx, the generated C, zig cc, iree-compile, iree-run-module,
onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from support import onnx_models  # noqa: E402

import pyree_build as pb  # noqa: E402

TWO_NESTS = "The group's ops in two fused loop nests"


def _softmax_times_scores(rows: int = 6, width: int = 24) -> Any:
    """y = Softmax(x @ w) * (x @ w): the row passes read the matmul's value again after the
    Softmax's exp, so the exp cannot be stored over it in the result's row."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((width, width)) * 0.3).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], name="probs", axis=-1),
        helper.make_node("Mul", ["p", "s"], ["y"], name="weighted"),
    ]
    graph = helper.make_graph(
        nodes,
        "softmax_times_scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, width])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _merged(tmp_path: Path, proto: Any, name: str, pick: Callable[[Any], bool]) -> tuple[Path, Path, tuple[int, ...]]:
    model = Path(onnx_models.save(proto, tmp_path / f"{name}.onnx"))
    mlir = pb.import_onnx(model, tmp_path / f"{name}.mlir")
    chosen = tuple(g.index for g in pb.ops(mlir) if pick(g))
    return model, mlir, chosen


CASES = {
    # 2 heads x 50 tokens = 100 rows of scores in several workgroups, Softmax over 50 columns
    "scores_softmax": (lambda: onnx_models.transformer_block(tokens=50, width=16, heads=2), lambda g: g.source[-1] in ("scale", "attn")),
    "linear_gelu_layernorm": (onnx_models.gemm_gelu_norm, lambda g: not g.source[-1].startswith(("matmul", "softmax"))),
    "softmax_times_scores": (_softmax_times_scores, lambda g: True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_reduction_and_the_row_group_reading_it_are_two_nests_that_verify(tmp_path: Path, case: str) -> None:
    build, pick = CASES[case]
    model, mlir, chosen = _merged(tmp_path, build(), case, pick)
    assert len(chosen) >= 2, chosen
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[chosen], imports=["k"], onnx=model)
    source = (out / "k.c").read_text(encoding="utf-8")
    assert TWO_NESTS in source, source[:1500]
    assert "pyree-tune after: PYREE_LANES=" in source  # swept after the tile, not in its product
    module = pb.compile(mlir, out / "m.vmfb", transform_spec=out / "spec.mlir", expect_imports=["k"])
    for defines in ([], ["PYREE_TILE_ROWS=3", "PYREE_LANES=1"], ["PYREE_TILE_ROWS=8", "PYREE_LANES=4"], ["PYREE_TILE_ROWS=1"]):
        plugin = pb.plugin(out / "k.c", out / f"k-{len(defines)}-{'-'.join(defines)}.so", defines=defines)
        for device in ("local-sync", "local-task"):  # workgroups in order (a row read before its tile ran fails), and at once
            verdict = pb.verify(module, model, plugins=plugin, device=device)
            assert verdict.passed, (defines, device, verdict.render())


def test_the_computed_value_is_not_overwritten_where_a_later_pass_reads_it(tmp_path: Path) -> None:
    # Softmax(s) * s: the exp is recomputed in the last pass rather than stored over s (which
    # that pass reads); a plain Softmax stores it (one exp per element).
    _, mlir, chosen = _merged(tmp_path, _softmax_times_scores(), "sts", lambda g: True)
    pb.replace(mlir, tmp_path / "a", ops=[chosen], imports=["k"])
    again = (tmp_path / "a" / "k.c").read_text(encoding="utf-8")
    last_pass = again[again.index("// the row's result") :]
    assert "pyree_expf(" in last_pass
    _, mlir, chosen = _merged(tmp_path, onnx_models.gemm_gelu_norm(), "user", lambda g: g.source[-1] in ("matmul", "softmax"))
    pb.replace(mlir, tmp_path / "b", ops=[chosen], imports=["k"])
    stored = (tmp_path / "b" / "k.c").read_text(encoding="utf-8")
    assert TWO_NESTS in stored and "pyree_expf(" not in stored[stored.index("// the row's result") :]


def _chain(name: str, nodes: list[Any], x: list[int], y: list[int], weights: dict[str, list[int]]) -> Any:
    rng = np.random.default_rng(len(name))
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), w) for w, shape in weights.items()]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


_N = helper.make_node
# Every listed group merged into one kernel. Where the row-wise group reduces the result's last
# axis it is two nests (True); where not (a Softmax over rows, a transpose between, a second
# matmul after the Softmax) the kernel is another form, and must still be right.
SHAPES = {
    "batched_matmul_softmax": (True, lambda: _chain("b", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["y"], axis=-1)], [2, 6, 24], [2, 6, 24], {"w": [24, 24]})),
    "centered_rows": (True, lambda: _chain("c", [_N("MatMul", ["x", "w"], ["s"]), _N("ReduceMean", ["s"], ["m"], axes=[-1], keepdims=1), _N("Sub", ["s", "m"], ["y"])], [7, 37], [7, 37], {"w": [37, 37]})),
    "logsoftmax": (True, lambda: _chain("l", [_N("MatMul", ["x", "w"], ["s"]), _N("LogSoftmax", ["s"], ["y"], axis=-1)], [9, 40], [9, 40], {"w": [40, 40]})),
    "one_row_layernorm": (True, lambda: _chain("n", [_N("MatMul", ["x", "w"], ["s"]), _N("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1)], [1, 48], [1, 48], {"w": [48, 48], "g": [48], "b": [48]})),
    "softmax_plus_scores": (True, lambda: _chain("p", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["q"], axis=-1), _N("Add", ["q", "s"], ["y"])], [6, 24], [6, 24], {"w": [24, 24]})),
    "softmax_over_rows": (False, lambda: _chain("r", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["y"], axis=0)], [6, 24], [6, 24], {"w": [24, 24]})),
    "transposed_softmax": (False, lambda: _chain("t", [_N("MatMul", ["x", "w"], ["s"]), _N("Transpose", ["s"], ["u"], perm=[1, 0]), _N("Softmax", ["u"], ["y"], axis=-1)], [6, 24], [24, 6], {"w": [24, 24]})),
    "softmax_then_matmul": (False, lambda: _chain("m", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["q"], axis=-1), _N("MatMul", ["q", "v"], ["y"])], [6, 24], [6, 16], {"w": [24, 24], "v": [24, 16]})),
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_any_matmul_and_row_group_merged_verifies_and_is_two_nests_where_rows_are_reduced(tmp_path: Path, shape: str) -> None:
    two_nests, build = SHAPES[shape]
    model, mlir, chosen = _merged(tmp_path, build(), shape, lambda g: g.replaceable)
    assert len(chosen) >= 2, chosen
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[chosen], imports=["k"], onnx=model)
    assert (TWO_NESTS in (out / "k.c").read_text(encoding="utf-8")) == two_nests
    module = pb.compile(mlir, out / "m.vmfb", transform_spec=out / "spec.mlir", expect_imports=["k"])
    for defines in ([], ["PYREE_TILE_ROWS=3"]):
        plugin = pb.plugin(out / "k.c", out / f"k{len(defines)}.so", defines=defines)
        for device in ("local-sync", "local-task"):
            verdict = pb.verify(module, model, plugins=plugin, device=device)
            assert verdict.passed, (shape, defines, device, verdict.render())
