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
