"""Issue 47: a reduction nest and the row-wise group that reads it, merged (`--ops 5+6`: attention's
scores and their Softmax, a Linear and the LayerNorm after it), are one kernel of two fused nests,
not the per-op reference: the tiled nest computes its rows into the result's buffer, then each
workgroup's row passes run over the rows its own tiles computed, in place. With a product after
them that reads those rows one at a time (`--ops 5+6+7`: the Softmax's rows times V), three: the
first two compute into a scratch buffer and the last nest's tiles cover the same rows.

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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from support import onnx_models  # noqa: E402

import pyree_build as pb  # noqa: E402

TWO_NESTS = "The group's ops in two fused loop nests"
THREE_NESTS = "The group's ops in three fused loop nests"


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


def test_attention_scores_softmax_and_context_merged_are_three_nests_that_verify(tmp_path: Path) -> None:
    # 2 heads x 50 tokens: 100 rows, in several workgroups; the context is transposed and its
    # heads merged on the way out (the last nest's result stored moved)
    proto = onnx_models.transformer_block(tokens=50, width=16, heads=2)
    model, mlir, chosen = _merged(tmp_path, proto, "attention", lambda g: g.source[-1] in ("scale", "attn") or "context" in g.source)
    assert len(chosen) == 3, chosen
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[chosen], imports=["k"], onnx=model)
    source = (out / "k.c").read_text(encoding="utf-8")
    assert THREE_NESTS in source, source[:1500]
    assert "pyree-tune after: PYREE_TILE_ROWS_2=" in source and "pyree-tune: PYREE_TILE_ROWS=" in source
    assert source.count("// pyree-tune after: PYREE_PACK_K=") == 1  # a knob both nests share is declared once
    module = pb.compile(mlir, out / "m.vmfb", transform_spec=out / "spec.mlir", expect_imports=["k"])
    for defines in ([], ["PYREE_TILE_ROWS=3", "PYREE_TILE_ROWS_2=8"], ["PYREE_TILE_ROWS=8", "PYREE_TILE_ROWS_2=3", "PYREE_LANES=1"]):
        plugin = pb.plugin(out / "k.c", out / f"k-{'-'.join(defines)}.so", defines=defines)
        for device in ("local-sync", "local-task"):
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
# axis it is two nests; three where a product then reads its rows one at a time; where not (a
# Softmax over rows, a transpose between, a product reading the Softmax's columns, whose rows
# other workgroups compute) the kernel is another form, and must still be right.
SHAPES: dict[str, tuple[str | None, Callable[[], Any]]] = {
    "batched_matmul_softmax": (TWO_NESTS, lambda: _chain("b", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["y"], axis=-1)], [2, 6, 24], [2, 6, 24], {"w": [24, 24]})),
    "centered_rows": (TWO_NESTS, lambda: _chain("c", [_N("MatMul", ["x", "w"], ["s"]), _N("ReduceMean", ["s"], ["m"], axes=[-1], keepdims=1), _N("Sub", ["s", "m"], ["y"])], [7, 37], [7, 37], {"w": [37, 37]})),
    "logsoftmax": (TWO_NESTS, lambda: _chain("l", [_N("MatMul", ["x", "w"], ["s"]), _N("LogSoftmax", ["s"], ["y"], axis=-1)], [9, 40], [9, 40], {"w": [40, 40]})),
    "one_row_layernorm": (TWO_NESTS, lambda: _chain("n", [_N("MatMul", ["x", "w"], ["s"]), _N("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1)], [1, 48], [1, 48], {"w": [48, 48], "g": [48], "b": [48]})),
    "softmax_plus_scores": (TWO_NESTS, lambda: _chain("p", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["q"], axis=-1), _N("Add", ["q", "s"], ["y"])], [6, 24], [6, 24], {"w": [24, 24]})),
    "softmax_over_rows": (None, lambda: _chain("r", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["y"], axis=0)], [6, 24], [6, 24], {"w": [24, 24]})),
    "transposed_softmax": (None, lambda: _chain("t", [_N("MatMul", ["x", "w"], ["s"]), _N("Transpose", ["s"], ["u"], perm=[1, 0]), _N("Softmax", ["u"], ["y"], axis=-1)], [6, 24], [24, 6], {"w": [24, 24]})),
    "softmax_then_matmul": (THREE_NESTS, lambda: _chain("m", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["q"], axis=-1), _N("MatMul", ["q", "v"], ["y"])], [6, 24], [6, 16], {"w": [24, 24], "v": [24, 16]})),
    "layernorm_then_matmul": (THREE_NESTS, lambda: _chain("n2", [_N("MatMul", ["x", "w"], ["s"]), _N("LayerNormalization", ["s", "g", "b"], ["n"], axis=-1), _N("MatMul", ["n", "v"], ["y"])], [21, 40], [21, 24], {"w": [40, 40], "g": [40], "b": [40], "v": [40, 24]})),
    "batched_softmax_then_matmul": (THREE_NESTS, lambda: _chain("bm", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["q"], axis=-1), _N("MatMul", ["q", "v"], ["y"])], [3, 13, 24], [3, 13, 16], {"w": [24, 24], "v": [24, 16]})),
    # both products 24 x 24: the IR shares one zero fill between them
    "square_softmax_then_matmul": (THREE_NESTS, lambda: _chain("sq", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["q"], axis=-1), _N("MatMul", ["q", "v"], ["y"])], [24, 24], [24, 24], {"w": [24, 24], "v": [24, 24]})),
    "softmax_columns_read": (None, lambda: _chain("cr", [_N("MatMul", ["x", "w"], ["s"]), _N("Softmax", ["s"], ["q"], axis=-1), _N("MatMul", ["u", "q"], ["y"])], [24, 24], [24, 24], {"w": [24, 24], "u": [24, 24]})),
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_any_matmul_and_row_group_merged_verifies_and_is_nests_where_rows_are_reduced(tmp_path: Path, shape: str) -> None:
    form, build = SHAPES[shape]
    model, mlir, chosen = _merged(tmp_path, build(), shape, lambda g: g.replaceable)
    assert len(chosen) >= 2, chosen
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[chosen], imports=["k"], onnx=model)
    source = (out / "k.c").read_text(encoding="utf-8")
    assert [f for f in (TWO_NESTS, THREE_NESTS) if f in source] == ([form] if form else []), source[:1500]
    module = pb.compile(mlir, out / "m.vmfb", transform_spec=out / "spec.mlir", expect_imports=["k"])
    # the last nest's tiles over rows its workgroup shares with the first's in other heights
    more = [["PYREE_TILE_ROWS=3", "PYREE_TILE_ROWS_2=2"], ["PYREE_TILE_ROWS=1", "PYREE_TILE_ROWS_2=8"]] if form == THREE_NESTS else []
    for defines in ([], ["PYREE_TILE_ROWS=3"], *more):
        plugin = pb.plugin(out / "k.c", out / f"k{len(defines)}.so", defines=defines)
        for device in ("local-sync", "local-task"):
            verdict = pb.verify(module, model, plugins=plugin, device=device)
            assert verdict.passed, (shape, defines, device, verdict.render())


_ROW_GROUPS: dict[str, Callable[[str, str], list[Any]]] = {
    "softmax": lambda s, q: [_N("Softmax", [s], [q], axis=-1)],
    "logsoftmax": lambda s, q: [_N("LogSoftmax", [s], [q], axis=-1)],
    "layernorm": lambda s, q: [_N("LayerNormalization", [s, "g", "b"], [q], axis=-1)],
    "centered": lambda s, q: [_N("ReduceMean", [s], ["m"], axes=[-1], keepdims=1), _N("Sub", [s, "m"], [q])],
}


@st.composite
def _products_around_rows(draw: st.DrawFn) -> tuple[str, Any, bool, bool]:
    """x @ w, a row-wise group over its rows, then a product with its rows (q @ v) or, where
    `columns`, with its columns (u @ q: other workgroups' rows); batch dimensions and sizes drawn."""
    batch = draw(st.lists(st.integers(1, 3), max_size=1))  # two batch dimensions import as reshapes around a product: no nest model
    rows, width, out = draw(st.integers(1, 30)), draw(st.integers(2, 40)), draw(st.integers(1, 24))
    kind = draw(st.sampled_from(sorted(_ROW_GROUPS)))
    columns = draw(st.booleans())
    scaled = draw(st.booleans())  # an elementwise op between the first product and the rows
    nodes = [_N("MatMul", ["x", "w"], ["s0"])]
    if scaled:
        nodes.append(_N("Mul", ["s0", "c"], ["s"]))
    nodes += _ROW_GROUPS[kind]("s" if scaled else "s0", "q")
    weights = {"w": [width, width], "g": [width], "b": [width], "c": [1]}
    if columns:
        nodes.append(_N("MatMul", ["u", "q"], ["y"]))
        weights["u"] = [out, rows]
        y = [*batch, out, width]
    else:
        nodes.append(_N("MatMul", ["q", "v"], ["y"]))
        weights["v"] = [width, out]
        y = [*batch, rows, out]
    used = {name for node in nodes for name in node.input}
    name = f"{kind}_{'x'.join(map(str, [*batch, rows, width, out]))}_{'columns' if columns else 'rows'}{'_scaled' if scaled else ''}"
    unit = 1 in [*batch, rows, out]  # a unit dimension the importer folds away: another form may be right
    return name, _chain(name, nodes, [*batch, rows, width], y, {w: shape for w, shape in weights.items() if w in used}), columns, unit


@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_products_around_rows())
def test_a_product_after_a_row_group_is_three_nests_only_over_its_own_rows_and_verifies(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, Any, bool]
) -> None:
    # Property: merged, it verifies on both devices at tile heights that do and do not divide a
    # workgroup's rows; it is never three nests where the product reads the rows' columns, and
    # always where it reads the rows it follows (no unit dimension).
    name, proto, columns, unit = case
    tmp = tmp_path_factory.mktemp(name)
    model, mlir, chosen = _merged(tmp, proto, name, lambda g: g.replaceable)
    out = tmp / "k"
    pb.replace(mlir, out, ops=[chosen] if len(chosen) > 1 else list(chosen), imports=["k"], onnx=model)
    source = (out / "k.c").read_text(encoding="utf-8")
    if columns or not unit:
        assert (THREE_NESTS in source) == (not columns), (name, source[:1200])
    module = pb.compile(mlir, out / "m.vmfb", transform_spec=out / "spec.mlir", expect_imports=["k"])
    for defines in ([], ["PYREE_TILE_ROWS=3", "PYREE_TILE_ROWS_2=2"]):
        plugin = pb.plugin(out / "k.c", out / f"k{len(defines)}.so", defines=defines)
        for device in ("local-sync", "local-task"):
            verdict = pb.verify(module, model, plugins=plugin, device=device)
            assert verdict.passed, (name, defines, device, verdict.render())
