"""models/isolate.py: one op group (or a merge) as a program of its own, what
benchmarks/kernels.py --groups times IREE's module of exactly those ops against: the program
compiles, holds the same ops (so `ops` finds them replaceable again), and the kernel that
replaces them there gives IREE's numbers for them."""

from __future__ import annotations

import numpy as np
import pytest
from support import onnx_models

import pyree_build as pb
from pyree_build.actions import checks
from pyree_build.models.isolate import argument_types, isolate

pytest.importorskip("onnxruntime", reason="pyree-build import needs pyree_build[onnx]")


@pytest.mark.parametrize("request_", [(1, 2, 3), 6], ids=["linear+gelu merged", "softmax"])
def test_a_group_alone_compiles_and_its_replacement_gives_irees_numbers(tmp_path, request_):
    model = tmp_path / "user.onnx"
    onnx_models.save(onnx_models.gemm_gelu_norm(), model)
    mlir = pb.import_onnx(model, tmp_path / "user.mlir")
    listed = {g.index: g for g in pb.ops(mlir)}
    members = request_ if isinstance(request_, tuple) else (request_,)
    alone = isolate(mlir, request_, tmp_path / "group.mlir")
    text = alone.read_text()
    assert "func.func @group(" in text and "match.operation_name_only" not in text
    # The same ops: each member's root op kind is in the program, and its inputs are its arguments.
    inputs = [t.type for t in listed[members[0]].operands]
    assert text.count("%arg") >= len(inputs) and all(t in text for t in inputs)
    iree = pb.compile(alone, tmp_path / "iree.vmfb")
    inner = [g.index for g in pb.ops(alone) if g.replaceable]
    assert inner, pb.ops(alone)
    pb.replace(alone, tmp_path / "k", ops=[tuple(inner) if len(inner) > 1 else inner[0]], imports=["k"])
    plugin = pb.plugin(tmp_path / "k" / "k.c", tmp_path / "k.so")
    replaced = pb.compile(alone, tmp_path / "replaced.vmfb", transform_spec=tmp_path / "k" / "spec.mlir", expect_imports=["k"])
    args = _arguments_of(text, np.random.default_rng(0))
    want = pb.run(iree, "group", args)
    got = pb.run(replaced, "group", args, plugins=[plugin])
    for a, b in zip(got, want):
        rtol, atol = checks.computed_tolerance(b)
        assert checks.close_elements(a, b, rtol=rtol, atol=atol).all()


def _arguments_of(text: str, rng: np.random.Generator) -> list[np.ndarray]:
    """Drawn f32 arrays for the isolated function's arguments (the models here are all f32)."""
    types = argument_types(text)
    assert types and all(element == "f32" for _, element in types), types
    return [rng.uniform(-1, 1, shape).astype(np.float32) for shape, _ in types]


def test_a_group_that_cannot_stand_alone_is_refused_with_its_reason_and_nothing_written(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    # A Gather reads its data through tensor.extract, from outside its operands: ops refuses it.
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], name="gather", axis=0)],
        "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4]), helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    model = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    mlir = pb.import_onnx(model, tmp_path / "m.mlir")
    refused = [g for g in pb.ops(mlir) if not g.replaceable]
    assert refused, pb.ops(mlir)
    with pytest.raises(pb.PyreeError, match=f"op group {refused[0].index} of m.mlir cannot stand alone"):
        isolate(mlir, refused[0].index, tmp_path / "none.mlir")
    with pytest.raises(pb.PyreeError, match="there is no op group 99"):
        isolate(mlir, 99, tmp_path / "none.mlir")
    assert not (tmp_path / "none.mlir").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("func.func @group(%arg0: tensor<2x3xf32>, %arg1: tensor<4xi64>) -> tensor<2x3xf32> {", [((2, 3), "f32"), ((4,), "i64")]),
        ("func.func @groups(%arg0: tensor<5xf32>) -> tensor<5xf32> {\nfunc.func @group(%arg0: tensor<1x7xi8>) -> tensor<7xf32> {", [((1, 7), "i8")]),
    ],
    ids=["two arguments", "after a function whose name starts the same"],
)
def test_an_isolated_programs_argument_types_are_its_functions_own(text, expected):
    # Not a function whose name it starts, nor the result's type.
    assert argument_types(text) == expected


def test_an_isolated_program_without_the_function_is_named_so():
    with pytest.raises(pb.PyreeError, match="the program has no function @group"):
        argument_types("func.func @other(%arg0: tensor<2x3xf32>) -> tensor<2x3xf32> {")
