"""The inputs `verify` (and `tune --onnx`) feed a module and its ONNX model: drawn to reach
each input's meaningful range, or read from stored files.

A kernel that is wrong only where its inputs rarely go passes a check whose inputs never go
there: a clip whose bound is 2.5 never clips floats in [-1, 1], an argmax that picks the last
of equal values never meets two equal floats, an unsigned shift that sign-extends never sees
a value with its top bit set. So each draw has a style, and the default draws cover them all:

- `uniform`: floats in [-1, 1], integers in [0, 4) (small indices, counts and shapes work);
- `wide`: floats beyond the model's own constants (clip bounds, thresholds, epsilons) and
  exactly at them, integers across their whole type (its extremes included);
- `ties`: floats and integers from a few values only, so reductions and comparisons meet
  equal elements.

Every draw is seeded: the same seed gives the same arrays on every machine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pyree_build.core import lazy
from pyree_build.core.errors import PyreeError
from pyree_build.core.records import record

if TYPE_CHECKING:
    import numpy
    import onnx as onnx_types

np = lazy.module("numpy")
onnx = lazy.module("onnx")
numpy_helper = lazy.module("onnx.numpy_helper")

PathLike = str | os.PathLike[str]

STYLES = ("uniform", "wide", "ties")
DEFAULT_TRIALS = len(STYLES)
STYLE_TEXT = {
    "uniform": "floats in [-1, 1], integers in [0, 4)",
    "wide": "floats past and at the model's constants, integers across their type",
    "ties": "a few values only, so elements tie",
}
# Constants of at most this many elements are landmarks (bounds, thresholds); larger ones are weights.
_LANDMARK_ELEMENTS = 16
# Wide floats stay below this, so exp() and products of a few of them stay finite in float32.
_MAX_SCALE = 64.0
# Integer operands whose meaning stops short of the type's range: a shift by the bit width or
# more is undefined in C and in IREE (poison), so onnxruntime's answer there is no reference.
_BOUNDED_OPERANDS = {("BitShift", 1)}
_NUMBERED = re.compile(r"^(input|output)_(\d+)\.pb$")
# Integers drawn again, in this order, where onnxruntime refuses a draw's: small ones (indices,
# sizes), then positive ones (divisors: onnxruntime refuses an integer division by zero).
FALLBACKS = {"small": "[0, 4)", "positive": "[1, 5)"}


@record(frozen=True)
class GraphInput:
    name: str
    dims: tuple[int | str, ...]
    dtype: numpy.dtype


@record(frozen=True)
class Draw:
    """One set of inputs: how it was made (`style`, `seed`), or the files it was read from."""

    label: str
    arrays: tuple[numpy.ndarray, ...]
    expected: tuple[numpy.ndarray, ...] | None = None  # stored outputs, when the files had them
    style: str | None = None  # drawn: its style and seed; None for given or stored inputs
    seed: int = 0


def numpy_dtype(elem_type: int, name: str, source: Path) -> numpy.dtype:
    """The numpy type of an ONNX element type that iree-run-module can be given; bfloat16,
    float8 and other types outside numpy's own are a PyreeError naming the input."""
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    if dtype.kind not in "biuf" or dtype.names is not None:
        type_name = onnx.TensorProto.DataType.Name(elem_type)
        raise PyreeError(
            f"graph input or output '{name}' is {type_name}, which verify cannot pass to or read from a module (.npy files and "
            "iree-run-module's inputs have no such element type)",
            file=source,
            fix=f"verify a variant of the model whose inputs and outputs are float32 (a Cast from float32 to {type_name} after each input, "
            "and back before each output), or check this one with `pyree-build run --expect-close`",
        )
    return dtype


def graph_inputs(model: onnx_types.ModelProto, source: Path) -> list[GraphInput]:
    """Each real input of the graph (initializers are not inputs); a dynamic dimension is its
    name (or '?')."""
    initializers = {t.name for t in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
        found.append(GraphInput(value.name, dims, numpy_dtype(tensor.elem_type, value.name, source)))
    return found


def landmarks(model: onnx_types.ModelProto) -> list[float]:
    """The model's small constants (clip bounds, thresholds, alphas), as finite floats: where
    an op's behaviour changes, so where drawn floats must reach."""
    values: set[float] = set()

    def add(array: numpy.ndarray) -> None:
        if array.size <= _LANDMARK_ELEMENTS and array.dtype.kind in "biuf":
            values.update(float(v) for v in np.asarray(array, np.float64).ravel() if np.isfinite(v))

    for tensor in model.graph.initializer:
        # Weights are no landmarks (and external data is not loaded here): only small tensors are read.
        if tensor.data_location != onnx.TensorProto.EXTERNAL and int(np.prod(tensor.dims)) <= _LANDMARK_ELEMENTS:
            add(numpy_helper.to_array(tensor))
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.FLOAT:
                values.add(float(attribute.f))
            elif attribute.type == onnx.AttributeProto.TENSOR:
                add(numpy_helper.to_array(attribute.t))
    return sorted(v for v in values if abs(v) <= _MAX_SCALE)


def _bounded_inputs(model: onnx_types.ModelProto) -> set[str]:
    """Graph inputs read directly as an operand whose meaningful range is narrower than its type."""
    return {node.input[i] for node in model.graph.node for op, i in _BOUNDED_OPERANDS if node.op_type == op and len(node.input) > i}


def _floats(rng: numpy.random.Generator, style: str, shape: tuple[int, ...], marks: Sequence[float]) -> numpy.ndarray:
    if style == "uniform":
        return rng.uniform(-1.0, 1.0, shape)
    points = np.array(sorted({0.0, *marks, *(-m for m in marks)}))
    if style == "ties":
        few = np.union1d(points, [-1.0, 1.0])
        return rng.choice(few, shape)
    scale = min(_MAX_SCALE, max(2.0, 2.0 * max((abs(m) for m in marks), default=1.0)))
    spread = rng.uniform(-scale, scale, shape)
    # Exactly at a landmark and one step either side: a comparison's strictness shows there.
    at = rng.choice(points, shape) * rng.choice([1.0, 1.0, 1.0 + 1e-3, 1.0 - 1e-3], shape)
    small = rng.uniform(-1.0, 1.0, shape)
    pick = rng.integers(0, 4, shape)
    values = np.where(pick < 2, spread, np.where(pick == 2, at, small))
    # The ends of the range first, then each landmark and a step either side, in random order:
    # a small input (a handful of elements) still goes past every bound and meets them exactly.
    steps = [m * f for m in points for f in (1.0 - 1e-3, 1.0, 1.0 + 1e-3) if m or f == 1.0]
    return _cover(rng, values, [-scale, scale, *rng.permutation(np.array(steps))])


def _cover(rng: numpy.random.Generator, values: numpy.ndarray, cover: Sequence[object]) -> numpy.ndarray:
    """`values` with the first of `cover` (as many as fit) at random places."""
    flat = np.array(values).reshape(-1)
    count = min(len(cover), flat.size)
    if count:
        flat[rng.permutation(flat.size)[:count]] = np.asarray(list(cover)[:count], dtype=flat.dtype)
    return flat.reshape(np.shape(values))


def _integers(rng: numpy.random.Generator, style: str, shape: tuple[int, ...], dtype: numpy.dtype, bounded: bool) -> numpy.ndarray:
    info = np.iinfo(dtype)
    if style in ("uniform", "small"):
        return rng.integers(0, 4, shape)
    if style == "positive":
        return rng.integers(1, 5, shape)
    if bounded:  # a shift amount: 0 up to the bit width, exclusive
        return rng.integers(0, info.bits, shape)
    if style == "ties":
        return rng.integers(max(info.min, -2), 3, shape)
    extremes = np.array(sorted({info.min, info.max, info.min + 1, info.max - 1, 0, 1, max(info.min, -1)}), dtype=dtype)
    whole = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    small = rng.integers(max(info.min, -4), 5, shape).astype(dtype)
    pick = rng.integers(0, 5, shape)
    values = np.where(pick < 2, whole, np.where(pick == 2, rng.choice(extremes, shape), small))
    # The type's ends and the top bit first, whatever the input's size.
    top = info.min if info.min < 0 else (info.max >> 1) + 1
    return _cover(rng, values, [info.min, info.max, top, *rng.permutation(extremes)])


def draw(model: onnx_types.ModelProto, source: Path, *, seed: int, style: str, integers: str | None = None) -> Draw:
    """One seeded draw of every graph input in `style`. `integers`: a FALLBACKS key, to draw the
    integers that way instead (for a model whose integer inputs are indices, sizes or divisors)."""
    rng = np.random.default_rng(seed)
    marks = landmarks(model) if style != "uniform" else []
    bounded = _bounded_inputs(model)
    arrays = []
    for graph_input in graph_inputs(model, source):
        dynamic = [d for d in graph_input.dims if isinstance(d, str)]
        if dynamic:
            raise PyreeError(
                f"graph input '{graph_input.name}' has dynamic dimensions ({', '.join(dynamic)}), so no random input can be made for it",
                file=source,
                fix="pass every input: --input SHAPExTYPE=VALUES or --input @x.npy, once per graph input, in order, or --inputs DIR "
                "(a test_data_set_N directory)",
            )
        shape = tuple(int(d) for d in graph_input.dims)
        kind = graph_input.dtype.kind
        if kind == "f":
            values = _floats(rng, style, shape, marks)
        elif kind == "b":
            values = rng.integers(0, 2, shape)
        else:
            values = _integers(rng, integers or style, shape, graph_input.dtype, graph_input.name in bounded)
        arrays.append(np.asarray(values).astype(graph_input.dtype))
    what = STYLE_TEXT[style] + (f" (integers in {FALLBACKS[integers]}: onnxruntime refused the others)" if integers else "")
    return Draw(f"seed {seed}, {style}: {what}", tuple(arrays), None, style, seed)


def style_of(trial: int) -> str:
    return STYLES[trial % len(STYLES)]


def _read_tensor(path: Path) -> numpy.ndarray:
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return numpy_helper.to_array(onnx.load_tensor(str(path)))
    except Exception as exc:  # protobuf, numpy and ml_dtypes each raise their own types for a foreign file
        raise PyreeError(
            f"cannot read a tensor from it ({type(exc).__name__}: {exc})", file=path, fix="pass an ONNX TensorProto (.pb) or a NumPy array (.npy)"
        ) from None


def _numbered(directory: Path, kind: str) -> list[Path]:
    found = sorted(((int(m[2]), p) for p in directory.iterdir() if (m := _NUMBERED.match(p.name)) and m[1] == kind), key=lambda t: t[0])
    return [p for _, p in found]


def stored(paths: Sequence[PathLike]) -> Draw:
    """Inputs read from files: one directory as ONNX's test sets lay it out (input_0.pb, ...,
    and output_0.pb, ... as the expected outputs), or one .pb/.npy file per graph input."""
    given = [Path(p) for p in paths]
    for path in given:
        if not path.exists():
            raise PyreeError("input file or directory not found", file=path, fix="pass a test_data_set_N directory, or .pb/.npy files")
    if len(given) == 1 and given[0].is_dir():
        directory = given[0]
        inputs, outputs = _numbered(directory, "input"), _numbered(directory, "output")
        if not inputs:
            raise PyreeError("no input_0.pb, input_1.pb, ... in the directory", file=directory, fix="pass a test_data_set_N directory of an ONNX test")
        arrays = tuple(_read_tensor(p) for p in inputs)
        expected = tuple(_read_tensor(p) for p in outputs) if outputs else None
        return Draw(f"stored in {directory}", arrays, expected)
    for path in given:
        if path.is_dir():
            raise PyreeError("a directory among several --inputs", file=path, fix="pass one test_data_set_N directory, or only .pb/.npy files")
        if path.suffix not in (".pb", ".npy"):
            raise PyreeError("--inputs takes .pb (ONNX TensorProto) or .npy files", file=path, fix="save the array with numpy.save, or pass a directory")
    return Draw(f"stored in {', '.join(p.name for p in given)}", tuple(_read_tensor(p) for p in given))


def conform(draw_: Draw, declared: Sequence[GraphInput], source: Path) -> Draw:
    """The draw checked against the graph's inputs (count and static shapes) and cast to their types."""
    if len(draw_.arrays) != len(declared):
        raise PyreeError(
            f"{len(draw_.arrays)} inputs given, the model has {len(declared)} ({', '.join(d.name for d in declared)})",
            file=source,
            fix="give one input per graph input, in order, or none (drawn inputs)",
        )
    arrays = []
    for array, graph_input in zip(draw_.arrays, declared):
        dims = graph_input.dims
        if len(array.shape) != len(dims) or any(isinstance(d, int) and d != a for d, a in zip(dims, array.shape)):
            raise PyreeError(
                f"input {draw_.label} has shape {list(array.shape)}, graph input '{graph_input.name}' is {list(dims)}",
                file=source,
                fix="give the input the graph's shape",
            )
        arrays.append(array.astype(graph_input.dtype, copy=False))
    return Draw(draw_.label, tuple(arrays), draw_.expected, draw_.style, draw_.seed)
