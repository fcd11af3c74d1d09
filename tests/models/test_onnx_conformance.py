"""Issue 33: ONNX's own node conformance tests as the property test of import / ops / replace /
compile --expect-import. A fixed slice of the suite (every root kind the generator meets: an
elementwise op, broadcasting, scalar inputs packed into one binding, a reshape as the root, a
reduction, fill + matmul, transposes, i1 masks, unsigned and shifted integers, groups that
repeat each other, and groups ops must refuse: a gather, constants only, f64 at the
program's edge), generated with onnx's own tool and run through the harness the whole suite
uses (benchmarks/onnx_conformance.py): every replaceable group, replaced alone and all at
once, gives the stored outputs; nothing crashes; every error says what to do.
"""

from __future__ import annotations

import concurrent.futures
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import benchmark_module, run_cli

pytest.importorskip("onnx", reason="the node tests' data is written by onnx's own tool: pip install pyree_build[onnx]")
pytest.importorskip("onnxruntime", reason="pyree-build import needs pyree_build[onnx]")

SLICE = {
    # test: what it stands for; the expected outcome per group is asserted below
    "test_add": "elementwise",
    "test_add_bcast": "broadcasting",
    "test_add_uint8": "unsigned integers",
    "test_clip": "rank-0 inputs IREE packs into one binding",
    "test_pow_bcast_scalar": "a scalar operand",
    "test_reshape_reordered_all_dims": "a reshape as the group's root",
    "test_unsqueeze_axis_0": "expand_shape root",
    "test_reduce_sum_default_axes_keepdims_example": "a reduction",
    "test_softmax_axis_0": "several reductions fused",
    "test_softmax_large_number": "a softmax over the last axis: one nest per row, exp of large differences",
    "test_logsoftmax_large_number": "a log-softmax over the last axis: one nest per row",
    "test_matmul_2d": "fill + matmul",
    "test_transpose_default": "a transpose",
    "test_where_example": "an i1 mask",
    "test_bitshift_right_uint8": "shifts",
    "test_argmax_default_axis_example": "an index reduction (two results: refused) and its parts",
    "test_batchnorm_epsilon_training_mode": "groups the same as others (each replaced where listed)",
    "test_gelu_default_1_expanded": "GELU's constants; three groups, also replaced all at once",
    "test_einsum_batch_diagonal": "a gather: refused",
    "test_constantofshape_float_ones": "constants only: refused",
    "test_max_float64": "a program with f64 inputs and outputs: refused",
    "test_reduce_sum_square_empty_set": "an input with no elements (IREE makes it a constant): refused",
    "test_onehot_without_axis": "an input whose size the model computes (tensor<?xi64>) in the static form",
}
# Groups `ops` must mark replaceable (and that must come out right): at least these many.
MIN_RIGHT = 16


def _harness() -> Any:
    return benchmark_module("onnx_conformance")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder: Path = _harness().generate_data(tmp_path_factory.mktemp("onnx-node"), "^(" + "|".join(SLICE) + ")$")
    return folder


@pytest.fixture(scope="module")
def records(data: Path) -> dict[str, dict[str, Any]]:
    harness = _harness()
    tests = sorted(p for p in data.iterdir() if p.name in SLICE)
    assert [t.name for t in tests] == sorted(SLICE), "onnx's tool did not write every test of the slice"
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda t: harness.run_one(t, 600), tests))
    return {r["test"]: r for r in done}


def test_no_replaced_group_is_wrong_and_nothing_crashes(records):
    for name, record in records.items():
        assert record["status"] == "ok", (name, record["status"])
        if any(g["replaceable"] for g in record["groups"]):
            assert record.get("iree") == "right", (name, record.get("iree"))  # the control: IREE's own module
        for g in record["groups"]:
            if g["replaceable"]:
                assert g["outcome"] == "right", (name, g)
            else:
                assert g["reason"], (name, g)  # a refusal says why
        if "together" in record:
            assert record["together"][0] == "right", (name, record["together"])
    right = sum(g.get("outcome") == "right" for r in records.values() for g in r["groups"])
    assert right >= MIN_RIGHT, right
    # Several groups in one spec: every import called (--expect-import each) and right.
    assert records["test_gelu_default_1_expanded"].get("together", [""])[0] == "right", records["test_gelu_default_1_expanded"]


def test_reshape_roots_and_packed_scalars_are_replaced(records):
    # The roots that wrote nothing (a lone reshape) and the inputs read at twice their offset.
    for name in ("test_reshape_reordered_all_dims", "test_unsqueeze_axis_0", "test_clip", "test_pow_bcast_scalar", "test_where_example"):
        assert [g["outcome"] for g in records[name]["groups"] if g["replaceable"]] == ["right"], records[name]


def test_an_input_size_only_known_at_run_time_is_read_from_the_tensor(records, data, tmp_path):
    # OneHot's comparison group takes tensor<?xi64> (a range the model computes): the static
    # form passes that size from the tensor (flow.dispatch needs it, and the C reads it); the
    # spec used to give the type without its size ("expected '{'") and the constant 0.
    groups = records["test_onehot_without_axis"]["groups"]
    open_input = [g for g in groups if g["replaceable"]]
    assert [g["outcome"] for g in open_input] == ["right"], groups
    import pyree_build as pb

    mlir = pb.import_onnx(data / "test_onehot_without_axis" / "model.onnx", tmp_path / "m.mlir")
    index = open_input[0]["index"]
    assert any("?" in t.type for t in pb.ops(mlir)[index - 1].operands)
    pb.replace(mlir, tmp_path / "k", ops=[index], imports=["k"])
    spec_text = (tmp_path / "k" / "spec.mlir").read_text()
    assert re.search(r"tensor<\?xi64>\{%x\d+_0\}", spec_text) and "tensor.dim" in spec_text, spec_text


def test_ops_refuses_what_replace_cannot_do_and_says_why(records):
    def reasons(name: str) -> str:
        return " ".join(g["reason"] or "" for g in records[name]["groups"])

    assert "tensor.extract" in reasons("test_einsum_batch_diagonal")
    assert "constants only" in reasons("test_constantofshape_float_ones") or not records["test_constantofshape_float_ones"]["groups"]
    assert "f64" in reasons("test_max_float64")
    assert "has no elements" in reasons("test_reduce_sum_square_empty_set")


def test_groups_that_repeat_another_are_named_and_all_imports_are_called(records, data, tmp_path):
    # Two groups with the same ops on the same types: `ops` names the repeat; each matcher is
    # tried on its own group alone, so both at once get their own import, each called once.
    record = records["test_batchnorm_epsilon_training_mode"]
    replaceable = [g for g in record["groups"] if g["replaceable"]]
    assert len(replaceable) >= 2 and all(g["outcome"] == "right" for g in replaceable), record
    first, second = replaceable[:2]
    assert first["same_as"] is None and second["same_as"] == first["index"], replaceable
    import pyree_build as pb

    mlir = pb.import_onnx(data / "test_batchnorm_epsilon_training_mode" / "model.onnx", tmp_path / "m.mlir")
    pb.replace(mlir, tmp_path / "k", ops=[first["index"], second["index"]], imports=["a", "b"])
    placed = _placed_calls(mlir, tmp_path / "k" / "spec.mlir")
    assert placed == {"a": 1, "b": 1}, placed
    # The general form matches wherever its ops are: there one matcher finds both, refused up front.
    with pytest.raises(pb.PyreeError) as refused:
        pb.replace(mlir, tmp_path / "general", ops=[first["index"], second["index"]], imports=["a", "b"], dynamic=True)
    assert "never be called" in refused.value.what and "leave out --dynamic" in (refused.value.fix or "")
    assert not (tmp_path / "general").exists()


def _placed_calls(mlir: Path, spec: Path) -> dict[str, int]:
    """How many dispatches of each import's kernel the spec places in the program (one per call, inlined)."""
    from pyree_build.models.ir import program

    placed = program.after_spec(mlir, spec.read_text())
    found = re.findall(r"flow\.dispatch @(\w+)_executable::", placed)
    return {name: found.count(name) for name in set(found)}


def test_a_group_whose_ops_another_listed_groups_matcher_would_take_keeps_its_own_import(tmp_path):
    # GRU: a fill + transpose + matmul + add group's matcher also matches at a third site, made
    # of a lone transpose (a group of its own) and ops of a group that cannot be replaced. Walked
    # over the program, the larger matcher took the transpose and the smaller import was never
    # called; tried each on its own group, both are called once, and the module compiles with both.
    import pyree_build as pb

    data = _harness().generate_data(tmp_path / "node", "^test_gru_batchwise$")
    mlir = pb.import_onnx(data / "test_gru_batchwise" / "model.onnx", tmp_path / "gru.mlir")
    groups = pb.ops(mlir)
    lone = [g.index for g in groups if g.replaceable and g.ops == ["linalg.transpose"] and [t.type for t in g.results] == ["tensor<6x6xf32>"]]
    larger = [g.index for g in groups if g.replaceable and g.same_as is None and "linalg.matmul" in g.ops and "linalg.transpose" in g.ops]
    assert lone and larger, [(g.index, g.ops, g.results) for g in groups]
    out = tmp_path / "both"
    pb.replace(mlir, out, ops=[larger[0], lone[0]], imports=["big", "small"])
    assert _placed_calls(mlir, out / "spec.mlir") == {"big": 1, "small": 1}
    compiled = run_cli("compile", mlir, "-o", out / "m.vmfb", "--transform-spec", out / "spec.mlir", "--expect-import", "big", "--expect-import", "small")
    assert compiled.returncode == 0, compiled


def test_the_suite_runs_in_slices_that_cover_it_once(tmp_path):
    # --slice K/N: the K-th of N deterministic slices of the sorted tests; together every test once.
    import argparse

    harness = _harness()
    tests = [tmp_path / f"test_{i:04d}" for i in range(1884)]
    slices = [harness.take_slice(list(reversed(tests)), k, 48) for k in range(1, 49)]
    assert sorted(t for s in slices for t in s) == tests  # each test once, whatever order they came in
    assert {len(s) for s in slices} == {39, 40} and slices[0][:2] == [tests[0], tests[48]]
    assert harness.parse_slice("3/48") == (3, 48)
    for bad in ("0/48", "49/48", "3", "a/b"):
        with pytest.raises(argparse.ArgumentTypeError, match="K/N"):
            harness.parse_slice(bad)


def test_the_summary_counts_refusals_by_reason_and_import_failures_by_op():
    harness = _harness()
    gather = "linalg.generic's body reads %{} (tensor<{}xf32>) from outside it, not through an operand (a gather such as tensor.extract): ..."
    records = [
        {"test": "a", "status": "ok", "groups": [{"replaceable": False, "reason": gather.format(3, 5)}, {"replaceable": True, "outcome": "right"}]},
        {"test": "b", "status": "ok", "groups": [{"replaceable": False, "reason": gather.format(0, "2x7")}, {"replaceable": True, "outcome": "wrong"}]},
        {"test": "c", "status": "import failed: error: m.onnx: ONNX node (unnamed) (If) cannot be lowered by IREE 3.13.0 | ...", "groups": []},
    ]
    text = harness.summary(records)
    assert "tests: 3 (2 ran, 1 import failed)" in text and "import failed: 1 If" in text
    assert "2 replaceable: 1 right, 1 wrong, 0 error, 0 crash, 0 iree-differs" in text
    assert "      2  OP's body reads %v (TYPE) from outside it" in text, text
