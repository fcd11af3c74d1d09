"""torch as `verify`'s reference: the exported program run eagerly on the same inputs.

verify draws its inputs from a graph's declared inputs; for a torch program that declaration is
made here as an ONNX graph of inputs and outputs only (names, element types, shapes), so the
draws are exactly those an ONNX model of the same interface gets: the same seeds, styles and
tolerance rule. A dynamic size takes the program's example input's size.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyree_build.core import lazy
from pyree_build.core.errors import PyreeError
from pyree_build.models.ir import torch_import

if TYPE_CHECKING:
    import numpy
    import onnx as onnx_types

np = lazy.module("numpy")
onnx = lazy.module("onnx")
torch = lazy.module("torch")

PathLike = str | os.PathLike[str]


def program_of(given: Any) -> tuple[Any, Path]:
    """(the exported program, the path errors name) of a .pt2 path or an ExportedProgram."""
    if isinstance(given, (str, os.PathLike)):
        return torch_import.load_program(given), Path(given)
    torch_import._turbine()
    if not isinstance(given, torch.export.ExportedProgram):
        raise PyreeError(
            f"torch= takes a torch.export.ExportedProgram or the path of one saved with torch.export.save, not {type(given).__name__}",
            fix="pass torch.export.export(model, args), or its .pt2",
        )
    return given, Path("<torch program>")


def _user_inputs(program: Any) -> list[Any]:
    specs = program.graph_signature.input_specs
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [placeholders[s.arg.name] for s in specs if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]


def _example_shapes(program: Any) -> list[tuple[int, ...]] | None:
    examples = getattr(program, "example_inputs", None)
    if not examples:
        return None
    args, _ = examples
    return [tuple(int(d) for d in a.shape) for a in args if hasattr(a, "shape")]


def interface(program: Any, source: Path) -> onnx_types.ModelProto:
    """An ONNX model of the program's inputs and outputs only (graph name `main`, the function
    aot.export writes), for verify's draws and checks."""
    inputs = _user_inputs(program)
    examples = _example_shapes(program)
    declared = []
    for i, node in enumerate(inputs):
        value = node.meta.get("val")
        if value is None or not hasattr(value, "shape"):
            raise PyreeError(f"input '{node.name}' of the torch program is not a tensor", file=source, fix="verify programs whose inputs are tensors")
        shape = [int(d) if isinstance(d, int) else (examples[i][k] if examples else 1) for k, d in enumerate(value.shape)]
        declared.append(onnx.helper.make_tensor_value_info(node.name, _elem_type(value.dtype, node.name, source), shape))
    outputs = [n for n in program.graph.nodes if n.op == "output"][0].args[0]
    results = []
    for j, out in enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        value = getattr(out, "meta", {}).get("val")
        if value is None or not hasattr(value, "dtype"):
            raise PyreeError(f"output {j} of the torch program is not a tensor", file=source, fix="verify programs whose outputs are tensors")
        results.append(onnx.helper.make_tensor_value_info(f"output_{j}", _elem_type(value.dtype, f"output {j}", source), None))
    return onnx.helper.make_model(onnx.helper.make_graph([], "main", declared, results))


def _elem_type(dtype: Any, name: str, source: Path) -> int:
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(str(dtype).removeprefix("torch."))))
    except TypeError:
        raise PyreeError(
            f"'{name}' of the torch program is {dtype}, which verify cannot pass to or read from a module",
            file=source,
            fix="verify a variant whose inputs and outputs are float32",
        ) from None


def outputs(program: Any, source: Path, arrays: Sequence[numpy.ndarray]) -> tuple[list[str], list[numpy.ndarray]]:
    """The program run eagerly (torch, CPU) on `arrays`: its outputs' names and values. torch
    refusing the inputs (an index out of range) is a PyreeError, so verify draws again."""
    module = program.module()
    try:
        with torch.no_grad():
            result = module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
    except Exception as exc:  # the program's own ops raise what torch raises for bad inputs
        raise PyreeError(
            "torch refused to run the program on these inputs, so it cannot be the reference",
            file=source,
            details=str(exc),
            fix="pass inputs the program takes: --input SPEC per input, or --inputs FILES",
        ) from None
    values = result if isinstance(result, (list, tuple)) else [result]
    return [f"output_{j}" for j in range(len(values))], [np.asarray(v.detach().cpu().numpy()) for v in values]
