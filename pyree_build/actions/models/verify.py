"""A module against the framework: run the module (through `run`'s iree-run-module path,
plugins included) and the ONNX model (onnxruntime, CPUExecutionProvider) on the same
inputs, and compare every output element by element.

Inputs are random from a seeded generator, shaped and typed as the graph's inputs (floats
in [-1, 1], integers in [0, 4)), or given as `--input` specs or `.npy` files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pyree_build.actions import checks
from pyree_build.actions.models.importer import INSTALL_ONNX, load_model
from pyree_build.actions.results import NPY_TENSOR, exported_functions, function_parameters
from pyree_build.actions.run import run_to_arrays
from pyree_build.core import lazy
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.records import record

if TYPE_CHECKING:
    import numpy
    import onnx as onnx_types

np = lazy.module("numpy")
onnx = lazy.module("onnx")
ort = lazy.module("onnxruntime")

PathLike = str | os.PathLike[str]

# float32 kernels reorder sums (tiling, vector lanes, fused exp/div): a few ulps of a value
# near 1 (1e-4 relative) are rounding; atol keeps values near zero from failing on 1e-7 noise.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


@record(frozen=True)
class OutputComparison:
    """One output of the module against onnxruntime's: the worst element (the one furthest
    beyond the tolerance, or closest to it when all pass) and the largest errors."""

    index: int
    name: str
    shape: tuple[int, ...]
    worst_index: tuple[int, ...]
    module_value: float
    reference_value: float
    abs_error: float
    rel_error: float
    max_abs_error: float
    max_rel_error: float
    mismatched: int
    passed: bool

    def render(self) -> str:
        where = "[" + ", ".join(map(str, self.worst_index)) + "]"
        verdict = "ok" if self.passed else f"MISMATCH in {self.mismatched} of {_size(self.shape)} elements"
        return (
            f"output {self.index} ({self.name}, {'x'.join(map(str, self.shape)) or 'scalar'}): {verdict}; worst at {where}: "
            f"module {self.module_value:.9g}, onnxruntime {self.reference_value:.9g}, abs error {self.abs_error:.3g}, rel error {self.rel_error:.3g} "
            f"(max abs {self.max_abs_error:.3g}, max rel {self.max_rel_error:.3g})"
        )


@record(frozen=True)
class VerifyResult:
    """Every output of one verify run; `passed` when each is within rtol/atol (numpy's isclose)."""

    module: Path
    model: Path
    function: str
    outputs: tuple[OutputComparison, ...]
    rtol: float
    atol: float
    seed: int

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def render(self) -> str:
        return "\n".join(o.render() for o in self.outputs)


def _size(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def graph_inputs(model: onnx_types.ModelProto) -> list[tuple[str, list[int | str], numpy.dtype]]:
    """(name, dims, dtype) of each real input of the graph (initializers are not inputs); a
    dynamic dimension is its name (or '?')."""
    initializers = {t.name for t in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
        found.append((value.name, dims, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))))
    return found


def random_inputs(model: onnx_types.ModelProto, seed: int, source: Path) -> list[numpy.ndarray]:
    """One seeded random array per graph input: floats in [-1, 1], integers in [0, 4), bools."""
    rng = np.random.default_rng(seed)
    arrays = []
    for name, dims, dtype in graph_inputs(model):
        dynamic = [d for d in dims if isinstance(d, str)]
        if dynamic:
            raise PyreeError(
                f"graph input '{name}' has dynamic dimensions ({', '.join(dynamic)}), so no random input can be made for it",
                file=source,
                fix="pass every input: --input SHAPExTYPE=VALUES or --input @x.npy, once per graph input, in order",
            )
        shape = tuple(int(d) for d in dims)
        if dtype.kind == "f":
            arrays.append(rng.uniform(-1.0, 1.0, shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 4, shape).astype(dtype))
    return arrays


def given_inputs(model: onnx_types.ModelProto, specs: Sequence[str], source: Path) -> list[numpy.ndarray]:
    """The `--input` values, one per graph input, as arrays of the graph's element types."""
    declared = graph_inputs(model)
    if len(specs) != len(declared):
        raise PyreeError(
            f"{len(specs)} inputs given, the model has {len(declared)} ({', '.join(n for n, _, _ in declared)})",
            file=source,
            fix="give one --input per graph input, in order, or none (random inputs)",
        )
    arrays = []
    for spec, (name, dims, dtype) in zip(specs, declared):
        array = checks.spec_array(spec)
        if len(array.shape) != len(dims) or any(isinstance(d, int) and d != a for d, a in zip(dims, array.shape)):
            raise PyreeError(
                f"input '{spec}' has shape {list(array.shape)}, graph input '{name}' is {dims}", file=source, fix="give the input the graph's shape"
            )
        arrays.append(array.astype(dtype, copy=False))
    return arrays


def choose_function(module: Path, model: onnx_types.ModelProto, function: str | None) -> str:
    """`function`, else the graph's name where the module exports it, else its only function."""
    if function is not None:
        return function
    names = exported_functions(module) or []
    if model.graph.name in names:
        return str(model.graph.name)
    synchronous = [n for n in names if not n.endswith("$async")]  # iree-compile exports NAME$async beside NAME
    if len(synchronous) == 1:
        return synchronous[0]
    raise PyreeError(
        f"the module exports no function named after the graph '{model.graph.name}', and not exactly one other",
        file=module,
        fix=f"name one with --function: {', '.join(names) or '(none exported)'}",
    )


def reference_outputs(model_path: Path, model: onnx_types.ModelProto, inputs: Sequence[numpy.ndarray]) -> tuple[list[str], list[numpy.ndarray]]:
    """onnxruntime's outputs (CPUExecutionProvider) and their names."""
    try:
        session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    except ImportError:
        raise PyreeError("onnxruntime is not installed", file=model_path, fix=INSTALL_ONNX) from None
    except Exception as exc:  # onnxruntime raises its own exception types for a model it cannot load
        raise PyreeError("onnxruntime cannot load the model", file=model_path, details=str(exc), fix="check the model with onnx.checker.check_model") from None
    names = [i.name for i in session.get_inputs()]
    try:
        results = session.run(None, dict(zip(names, inputs)))
    except Exception as exc:
        raise PyreeError("onnxruntime failed to run the model", file=model_path, details=str(exc), fix="check the inputs' shapes and types") from None
    return [o.name for o in session.get_outputs()], [np.asarray(r) for r in results]


def compare(index: int, name: str, actual: numpy.ndarray, expected: numpy.ndarray, rtol: float, atol: float) -> OutputComparison:
    """One output: how far each element is from onnxruntime's, and the worst of them."""
    got, want = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf is nan: equal infinities are handled as equal just below
        diff = np.abs(got - want)
    # Equal values (equal infinities too: their difference is nan) and NaN against NaN are no error.
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.abs(want))
    close = np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    with np.errstate(invalid="ignore"):  # an infinite error against an infinite tolerance: the worst kind
        excess = np.nan_to_num(diff - (atol + rtol * np.abs(np.where(np.isnan(want), 0.0, want))), nan=np.inf)
    flat = int(np.argmax(excess)) if excess.size else 0
    worst = tuple(int(i) for i in np.unravel_index(flat, want.shape)) if want.size else ()
    return OutputComparison(
        index, name, tuple(int(d) for d in want.shape), worst,
        float(got[worst]) if want.size else 0.0, float(want[worst]) if want.size else 0.0,
        float(diff[worst]) if want.size else 0.0, float(rel[worst]) if want.size else 0.0,
        float(diff.max()) if want.size else 0.0, float(rel.max()) if want.size else 0.0,
        int((~close).sum()), bool(close.all()),
    )  # fmt: skip


def _require_matching(module: Path, function: str, actual: Sequence[numpy.ndarray], names: Sequence[str], expected: Sequence[numpy.ndarray]) -> None:
    if len(actual) != len(expected):
        raise PyreeError(
            f"{function} returned {len(actual)} results, the ONNX model has {len(expected)} outputs ({', '.join(names)})",
            file=module,
            fix="verify the module compiled from this model (pyree-build import, then compile), or name its function with --function",
        )
    for i, (a, e) in enumerate(zip(actual, expected)):
        if tuple(np.shape(a)) != tuple(np.shape(e)):
            raise PyreeError(
                f"result {i} of {function} has shape {list(np.shape(a))}, onnxruntime's output '{names[i]}' {list(np.shape(e))}",
                file=module,
                fix="verify the module compiled from this model, with the same input shapes",
            )


def _require_parameters(module: Path, function: str, arrays: Sequence[numpy.ndarray], model_path: Path) -> None:
    """The module's function takes the model's inputs: as many, of the same shapes (before it runs)."""
    declared = function_parameters(module, function)
    if declared is None:
        return
    if len(declared) != len(arrays):
        raise PyreeError(
            f"{function} takes {len(declared)} arguments, the ONNX model {model_path.name} has {len(arrays)} inputs",
            file=module,
            fix="verify the module compiled from this model (pyree-build import, then compile), or name its function with --function",
        )
    for i, (text, array) in enumerate(zip(declared, arrays)):
        shape = text.removeprefix("tensor<").split("x")[:-1] if NPY_TENSOR.match(text) else None
        if shape is not None and (len(shape) != array.ndim or any(d not in ("?", str(a)) for d, a in zip(shape, array.shape))):
            raise PyreeError(
                f"argument {i} of {function} is {text}, the ONNX model {model_path.name}'s input {i} has shape {list(array.shape)}",
                file=module,
                fix="verify the module compiled from this model (pyree-build import, then compile)",
            )


def _run_module(
    module: Path, function: str, arrays: Sequence[numpy.ndarray], plugins: Sequence[PathLike], device: str, model_path: Path
) -> list[numpy.ndarray]:
    try:
        return run_to_arrays(module, function, arrays, plugins=plugins, device=device)
    except PyreeError as err:
        if "mismatch" not in (err.details or "") or "shape" not in (err.details or ""):
            raise
        raise PyreeError(
            f"{function} does not take the inputs of the ONNX model {model_path.name} ({', '.join('x'.join(map(str, a.shape)) for a in arrays)})",
            file=module,
            details=err.details,
            fix="verify the module compiled from this model (pyree-build import, then compile)",
        ) from None


def verify(
    module: PathLike,
    onnx_model: PathLike,
    *,
    function: str | None = None,
    inputs: Sequence[str] = (),
    plugins: Sequence[PathLike] = (),
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    device: str = "local-sync",
) -> VerifyResult:
    """Run `module` and the ONNX model on the same inputs and compare every output.

    Inputs are seeded random arrays shaped as the graph's inputs, or the given `inputs`
    (`--input` specs: `4x16xf32=1`, `@x.npy`), one per graph input. The module runs with
    iree-run-module (`plugins` loaded, on `device`); `function` defaults to the graph's name
    (the importer names the function after it) or the module's only function. An output
    passes where every element is within `atol + rtol * |onnxruntime's value|`.
    """
    mod = require_file(module, "module")
    model_path = require_file(onnx_model, "ONNX model")
    model = load_model(model_path)
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not value >= 0:
            raise PyreeError(f"{name} must be a non-negative number, got {value}", fix=f"pass e.g. --{name} 1e-5")
    arrays = given_inputs(model, inputs, model_path) if inputs else random_inputs(model, seed, model_path)
    fn = choose_function(mod, model, function)
    _require_parameters(mod, fn, arrays, model_path)
    names, expected = reference_outputs(model_path, model, arrays)
    actual = _run_module(mod, fn, arrays, plugins, device, model_path)
    _require_matching(mod, fn, actual, names, expected)
    outputs = tuple(compare(i, names[i], a, e, rtol, atol) for i, (a, e) in enumerate(zip(actual, expected)))
    return VerifyResult(mod, model_path, fn, outputs, rtol, atol, seed)
