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
  equal elements;
- `thresholds` (a model with few input elements and constants): each float element takes
  each constant, a step either side of it and the range's ends in turn, one draw per value,
  so a kernel wrong at one element's bound meets it there;
- `peaks` (an input that an op taking a maximum before an exponential reads: Softmax,
  LogSoftmax, ReduceLogSumExp, ReduceMax): every element at the range's low end but at most
  one of each line along every axis, at its high end (some lines none, beside lines with
  one), the peak at each line's first and last places (and their neighbours) in turn; the
  other float inputs uniform. Subtracting a maximum changes nothing mathematically, so only
  exp's overflow and underflow tell a kernel whose maximum leaves an element out (a loop
  bound or an index off by one) or is another line's from the right one; a peak 128 above
  the rest overflows exp (and 128 below underflows it) in float32 and float16.

Inputs whose values are not data are not drawn as data: an index (Gather's, GatherND's,
ScatterND's ...) is drawn across the axis it indexes, negatives included; Slice's starts and
ends place a window of the result's declared length anywhere, from either end; a shape
(Reshape's, Expand's ...) is the shape the model declares for the op's result, and one the
model does not declare is refused, naming the input: random shapes compute other things than
the model.

Every draw is seeded: the same seed gives the same arrays on every machine.

Long (~670 lines): one draw style per way a kernel can be wrong where inputs rarely go, each with
its own reasoning, and the reading of stored inputs; they share the model's facts (constants,
index ranges, shapes) computed once.
"""

from __future__ import annotations

import contextlib
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
THRESHOLDS = "thresholds"
PEAKS = "peaks"
STYLE_TEXT = {
    "uniform": "floats in [-1, 1], integers in [0, 4)",
    "wide": "floats past and at the model's constants, integers across their type",
    "ties": "a few values only, so elements tie",
    THRESHOLDS: "each float element at one of the model's constants, a step either side, or the range's ends",
    PEAKS: "a softmax's (or max's) input at the range's low end, one element of each line along every axis at its high end",
}
# Float inputs of at most this many elements each are few: the wide draw cannot put every
# threshold at every element, so the threshold draws do, one value per element per draw.
_FEW_ELEMENTS = 64
# Ops whose constants (attributes, constant operands) are thresholds: where the result switches.
_THRESHOLD_OPS = {"Clip", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Max", "Min", "Shrink", "ThresholdedRelu"}
# More threshold values than this are more draws than a check should cost: the wide draw's random places stand.
_MAX_TURNS = 24
# Ops whose kernels take a maximum and subtract it before an exponential (ReduceMax: an expanded
# softmax's), so that a wrong maximum shows only where exp overflows or underflows: the peaks draws.
_PEAK_OPS = {"Softmax", "LogSoftmax", "ReduceLogSumExp", "SoftmaxCrossEntropyLoss", "ReduceMax"}
# An index operand: (op, operand) -> the operand whose axis it indexes. The axis is the op's
# `axis` attribute (default 0); an ND index's last dimension picks several leading axes.
_INDEX_OPERANDS = {("Gather", 1): 0, ("GatherElements", 1): 0, ("ScatterElements", 1): 0, ("GatherND", 1): 0, ("ScatterND", 1): 0}
_ND_INDEX = {"GatherND", "ScatterND"}
# Indices that write: two equal ones race (ONNX leaves the result undefined), so they are drawn distinct.
_SCATTERS = {"ScatterND", "ScatterElements"}
# Operands whose values set the shape of the op's result (or pick its axes): (op, operand) -> what they are.
_SHAPE_OPERANDS = {
    ("Reshape", 1): "shape", ("Expand", 1): "shape", ("ConstantOfShape", 0): "shape", ("CenterCropPad", 1): "shape",
    ("Tile", 1): "repeats", ("Slice", 1): "starts", ("Slice", 2): "ends", ("Slice", 3): "axes", ("Slice", 4): "steps",
    ("Squeeze", 1): "axes", ("Unsqueeze", 1): "axes", ("Pad", 1): "pads", ("Pad", 3): "axes", ("Resize", 2): "scales", ("Resize", 3): "sizes",
    ("Upsample", 1): "scales", ("Range", 0): "start", ("Range", 1): "limit", ("Range", 2): "delta", ("OneHot", 1): "depth", ("TopK", 1): "k",
    ("Split", 1): "split", ("CumSum", 1): "axis", ("Trilu", 1): "k", ("ReduceSum", 1): "axes", ("ReduceMean", 1): "axes", ("ReduceMax", 1): "axes",
    ("ReduceMin", 1): "axes", ("ReduceProd", 1): "axes", ("ReduceL1", 1): "axes", ("ReduceL2", 1): "axes", ("ReduceLogSum", 1): "axes",
    ("ReduceLogSumExp", 1): "axes", ("ReduceSumSquare", 1): "axes",
    ("MelWeightMatrix", 0): "num_mel_bins", ("MelWeightMatrix", 1): "dft_length", ("DFT", 1): "dft_length", ("DFT", 2): "axis",
    ("STFT", 1): "frame_step", ("STFT", 3): "frame_length", ("HannWindow", 0): "size", ("HammingWindow", 0): "size", ("BlackmanWindow", 0): "size",
    ("NonMaxSuppression", 2): "max_output_boxes_per_class", ("Col2Im", 1): "image_shape", ("Col2Im", 2): "block_shape",
}  # fmt: skip
# Operands that are a lower and an upper bound: drawn in order, as a clip whose min exceeds its
# max is constant and checks nothing of its input.
_ORDERED_OPERANDS = {"Clip": (1, 2)}
# Of those, the ones whose value is the result's declared shape (CenterCropPad's: at its axes).
_SHAPE_IS_RESULT = {"Reshape", "Expand", "ConstantOfShape", "CenterCropPad"}
STORED_FIX = (
    "pass stored inputs instead of draws: --inputs DIR (a test_data_set_N directory: input_N.pb, with output_N.pb as the reference) "
    "or --inputs FILE.pb|FILE.npy, one per graph input"
)
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
    turn: int = 0  # which threshold or peaks draw


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
    # The ends of the range first (in random order: a scalar takes either), then each landmark
    # and a step either side, in random order: a small input (a handful of elements) still goes
    # past every bound and meets them exactly. Where room is left, the largest magnitudes drawn
    # at all: a kernel that drops a softmax's max-subtraction overflows only there.
    steps = [m * f for m in points for f in (1.0 - 1e-3, 1.0, 1.0 + 1e-3) if m or f == 1.0]
    large = [-_MAX_SCALE, _MAX_SCALE] if scale < _MAX_SCALE else []
    return _cover(rng, values, [*rng.permutation(np.array([-scale, scale])), *rng.permutation(np.array(steps)), *large])


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


@record(frozen=True)
class Index:
    """A graph input whose elements index another operand: each element (`nd`: each tuple along
    its last dimension) picks a place along `sizes`, counted from the end where negative.
    `distinct`: a scatter's indices, which must not repeat (along `axis` for ScatterElements)."""

    sizes: tuple[int, ...]
    nd: bool
    distinct: bool
    axis: int
    where: str


@record(frozen=True)
class Window:
    """Slice's starts and ends, both graph inputs: a window of the result's declared length
    (`lengths`) along each sliced axis (of `sizes`), placed anywhere along it and written from
    the start or from the end."""

    starts: str
    ends: str
    sizes: tuple[int, ...]
    lengths: tuple[int, ...]
    where: str


def _static_shapes(model: onnx_types.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Every value's shape the model declares or onnx's shape inference finds (None: unknown dimension)."""
    found: dict[str, tuple[int | None, ...]] = {}

    def put(values: Sequence[onnx_types.ValueInfoProto]) -> None:
        for value in values:
            tensor = value.type.tensor_type
            if value.type.HasField("tensor_type") and tensor.HasField("shape"):
                found.setdefault(value.name, tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim))

    put(model.graph.input)
    put(model.graph.output)
    put(model.graph.value_info)
    for tensor in model.graph.initializer:
        found.setdefault(tensor.name, tuple(tensor.dims))
    # onnx raises its own types for a model it cannot infer: the declared shapes stand.
    with contextlib.suppress(Exception):
        put(onnx.shape_inference.infer_shapes(model).graph.value_info)
    return found


def _op(node: onnx_types.NodeProto) -> str:
    return f"{node.op_type} '{node.name}'" if node.name else f"the {node.op_type} of '{node.output[0]}'"


def _attributes(node: onnx_types.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _index(node: onnx_types.NodeProto, operand: int, shapes: dict[str, tuple[int | None, ...]]) -> Index | None:
    """How the indices `node` reads at `operand` range, where the indexed operand's shape is known."""
    data = shapes.get(node.input[_INDEX_OPERANDS[(node.op_type, operand)]])
    indices = shapes.get(node.input[operand])
    if data is None or indices is None or any(d is None or d < 1 for d in data):
        return None
    attributes = _attributes(node)
    where = _op(node)
    distinct = node.op_type in _SCATTERS
    if node.op_type in _ND_INDEX:
        batch = int(attributes.get("batch_dims", 0))  # type: ignore[call-overload]
        depth = indices[-1] if indices else None
        if depth is None or batch + depth > len(data):
            return None
        return Index(tuple(int(d) for d in data[batch : batch + depth]), True, distinct, 0, where)  # type: ignore[arg-type]
    axis = int(attributes.get("axis", 0))  # type: ignore[call-overload]
    axis = axis + len(data) if axis < 0 else axis
    if not 0 <= axis < len(data) or (distinct and (len(indices) != len(data) or indices[axis] is None)):
        return None
    return Index((int(data[axis]),), False, distinct, axis, where)


def _shape_value(node: onnx_types.NodeProto, operand: int, graph_input: GraphInput, shapes: dict[str, tuple[int | None, ...]], source: Path) -> numpy.ndarray:
    """The value of a graph input that sets the shape of `node`'s result: the shape the model
    declares for that result; else a PyreeError naming the input."""
    what = _SHAPE_OPERANDS[(node.op_type, operand)]
    result = shapes.get(node.output[0])
    if node.op_type in _SHAPE_IS_RESULT and result is not None and all(d is not None for d in result):
        axes = _attributes(node).get("axes") if node.op_type == "CenterCropPad" else None
        value = [result[int(a)] for a in axes] if isinstance(axes, list) else list(result)
        if graph_input.dims == (len(value),):
            return np.array(value, np.int64)
    if node.op_type.startswith("Reduce") and (axes := _reduced_axes(node, graph_input, shapes.get(node.input[0]), result)) is not None:
        return axes
    raise _unknowable(node, what, graph_input.name, source, " (the model does not declare the result's shape)" if node.op_type in _SHAPE_IS_RESULT else "")


def _reduced_axes(
    node: onnx_types.NodeProto, graph_input: GraphInput, data: tuple[int | None, ...] | None, result: tuple[int | None, ...] | None
) -> numpy.ndarray | None:
    """A reduction's axes read off the declared shapes where they are certain: with keepdims, the
    axes whose size drops to 1 (an axis of size 1 reduced or not gives the same result), as many
    as the input holds; None where they are not."""
    count = graph_input.dims[0] if len(graph_input.dims) == 1 else None
    if count == 0:
        return np.zeros(0, np.int64)  # no axes: the op's own default
    known = data is not None and result is not None and len(data) == len(result) and None not in data and None not in result
    if not isinstance(count, int) or not known or _attributes(node).get("keepdims", 1) != 1:
        return None
    dims = list(zip(data, result))  # type: ignore[arg-type]
    dropped = [a for a, (d, r) in enumerate(dims) if r == 1 and d != 1]
    ones = [a for a, (d, _) in enumerate(dims) if d == 1]
    if any(r not in (1, d) for d, r in dims) or not len(dropped) <= count <= len(dropped) + len(ones):
        return None
    return np.array(sorted(dropped + ones[: count - len(dropped)]), np.int64)


def _unknowable(node: onnx_types.NodeProto, what: str, name: str, source: Path, why: str = "") -> PyreeError:
    return PyreeError(
        f"graph input '{name}' is the {what} of {_op(node)}{why}: its values set the shape of the op's result, so drawn values would "
        "compute another model than the one compiled",
        file=source,
        fix=f"{STORED_FIX}; or make '{name}' a constant of the model (an initializer)",
    )


def _window(
    node: onnx_types.NodeProto, declared: dict[str, GraphInput], shapes: dict[str, tuple[int | None, ...]], constants: dict[str, numpy.ndarray], source: Path
) -> Window:
    """Slice's starts and ends as a Window: where both are graph inputs, the axes and steps
    absent or constants (steps 1), and the shapes of the data and the result known."""
    starts, ends, axes, steps = (list(node.input[1:5]) + [""] * 4)[:4]
    data, result = shapes.get(node.input[0]), shapes.get(node.output[0])
    both = starts in declared and ends in declared and len(declared[starts].dims) == 1 and declared[starts].dims == declared[ends].dims
    known = data is not None and result is not None and all(d is not None for d in (*data, *result))
    for what, name in (("axes", axes), ("steps", steps)):
        if name and name not in constants:
            raise _unknowable(node, what, name, source) if name in declared else _unknowable(node, "starts", starts, source, f" (its {what} computed)")
    if not both:
        name = starts if starts in declared else ends
        raise _unknowable(node, "starts" if name == starts else "ends", name, source, " (and the other bound a constant)")
    if not known:
        raise _unknowable(node, "starts", starts, source, " (the model does not declare the result's shape)")
    sizes, lengths = [int(d or 0) for d in data or ()], [int(d or 0) for d in result or ()]
    count = int(declared[starts].dims[0])
    picked = [int(a) % len(sizes) for a in (constants[axes].ravel() if axes else range(count))]
    if (steps and not (constants[steps] == 1).all()) or len(picked) != count:
        raise _unknowable(node, "starts", starts, source, " (with steps other than 1)")
    return Window(starts, ends, tuple(sizes[a] for a in picked), tuple(lengths[a] for a in picked), _op(node))


def _place(rng: numpy.random.Generator, style: str, window: Window, dtype: numpy.dtype) -> tuple[numpy.ndarray, numpy.ndarray]:
    """(starts, ends) of one window per axis: anywhere it fits; each bound from the start or from the end."""
    starts, ends = [], []
    for size, length in zip(window.sizes, window.lengths):
        first = int(rng.choice([0, size - length]) if style == "ties" else rng.integers(0, size - length + 1))
        last = first + length
        starts.append(first - size if rng.integers(0, 2) else first)
        # An end at the axis's end cannot be written from it (-0 is 0): past it instead, as ONNX clamps.
        ends.append(last - size if last < size and rng.integers(0, 2) else (last if last < size or rng.integers(0, 2) else int(np.iinfo(dtype).max)))
    return np.array(starts), np.array(ends)


def roles(model: onnx_types.ModelProto, source: Path) -> dict[str, Index | Window | numpy.ndarray]:
    """The graph inputs that are no data: an index's range (Index), a slice's window (Window),
    or the one value of a shape."""
    declared = {g.name: g for g in graph_inputs(model, source)}
    uses = [
        (node, i, name)
        for node in model.graph.node
        for i, name in enumerate(node.input)
        if name in declared and ((node.op_type, i) in _INDEX_OPERANDS or (node.op_type, i) in _SHAPE_OPERANDS)
    ]
    if not uses:
        return {}
    shapes = _static_shapes(model)
    found: dict[str, Index | Window | numpy.ndarray] = {}
    for node, i, name in uses:
        if name in found:
            continue
        if node.op_type == "Slice" and i in (1, 2):
            window = _window(node, declared, shapes, _small_constants(model), source)
            found[window.starts] = found[window.ends] = window
        elif (node.op_type, i) in _SHAPE_OPERANDS:
            found[name] = _shape_value(node, i, declared[name], shapes, source)
        elif (index := _index(node, i, shapes)) is not None:
            found[name] = index
    return found


def _indices(rng: numpy.random.Generator, style: str, shape: tuple[int, ...], index: Index) -> numpy.ndarray:
    """Places drawn across the indexed axes, each counted from the start or (half of them) from the end."""
    if index.nd:
        places = shape[:-1]
        count, total = int(np.prod(places, dtype=np.int64)), int(np.prod(index.sizes, dtype=np.int64))
        if index.distinct and count <= total:
            flat = rng.choice(total, count, replace=False)
        else:
            flat = rng.choice([0, total - 1], count) if style == "ties" else rng.integers(0, total, count)
        chosen = np.stack(np.unravel_index(flat, index.sizes), axis=-1).reshape(shape)
        sizes = np.broadcast_to(np.array(index.sizes), shape)
    else:
        size = index.sizes[0]
        if index.distinct and shape[index.axis] <= size:  # each line along the axis: distinct places
            keys = rng.random((*shape[: index.axis], size, *shape[index.axis + 1 :]))
            chosen = np.take(np.argsort(keys, axis=index.axis), range(shape[index.axis]), axis=index.axis)
        elif style == "ties":
            chosen = rng.choice([0, size - 1], shape)
        else:
            chosen = _cover(rng, rng.integers(0, size, shape), [0, size - 1])
        sizes = np.full(shape, size)
    return np.where(rng.integers(0, 2, shape).astype(bool), chosen - sizes, chosen)


def _describe(name: str, role: Index | Window | numpy.ndarray) -> str:
    if isinstance(role, Window):
        return f"'{name}' places the window of {role.where}, {list(role.lengths)} of {list(role.sizes)}, anywhere, counted from either end"
    if isinstance(role, Index):
        return f"'{name}' indexes {role.where} across " + " x ".join(f"[-{n}, {n})" for n in role.sizes)
    return f"'{name}' is the shape the model declares, {role.tolist()}"


def _small_constants(model: onnx_types.ModelProto) -> dict[str, numpy.ndarray]:
    """The model's constants of at most _LANDMARK_ELEMENTS elements (initializers, Constant nodes), by name."""
    tensors = [(t.name, t) for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    tensors += [
        (n.output[0], n.attribute[0].t)
        for n in model.graph.node
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR
    ]
    return {name: numpy_helper.to_array(t) for name, t in tensors if int(np.prod(t.dims)) <= _LANDMARK_ELEMENTS}


def thresholds(model: onnx_types.ModelProto) -> list[float]:
    """The constants of the model's comparisons (_THRESHOLD_OPS): their float attributes and
    small constant operands, as finite floats within the drawn range."""
    constants = _small_constants(model)
    values: set[float] = set()
    for node in model.graph.node:
        if node.op_type not in _THRESHOLD_OPS:
            continue
        values.update(float(a.f) for a in node.attribute if a.type == onnx.AttributeProto.FLOAT)
        for name in node.input:
            if name in constants and (array := constants[name]).dtype.kind in "biuf":
                values.update(float(v) for v in np.asarray(array, np.float64).ravel())
    return sorted(v for v in values if np.isfinite(v) and abs(v) <= _MAX_SCALE)


def _cover_values(model: onnx_types.ModelProto) -> list[float]:
    """What the threshold draws put at every element: the range's ends, each threshold and a step either side."""
    points = sorted({0.0, *(m for v in thresholds(model) for m in (v, -v))})
    scale = min(_MAX_SCALE, max(2.0, 2.0 * max((abs(m) for m in points), default=1.0)))
    return [-scale, scale, *(m * f for m in points for f in (1.0 - 1e-3, 1.0, 1.0 + 1e-3) if m or f == 1.0)]


def threshold_turns(model: onnx_types.ModelProto, source: Path) -> int:
    """How many threshold draws make each float element meet each threshold: none where the
    model compares with no constant, a float input has too many elements for one draw per
    value, or there are too many values."""
    floats = [g for g in graph_inputs(model, source) if g.dtype.kind == "f"]
    if not floats or not thresholds(model) or any(not all(isinstance(d, int) for d in g.dims) for g in floats):
        return 0
    if any(int(np.prod(g.dims, dtype=np.int64)) > _FEW_ELEMENTS for g in floats):
        return 0
    turns = len(_cover_values(model))
    return turns if turns <= _MAX_TURNS else 0


def _peak_inputs(model: onnx_types.ModelProto, source: Path) -> list[GraphInput]:
    """The float graph inputs of static shape that an op taking a maximum before exp (_PEAK_OPS)
    reads directly: where the peaks draw puts its peaks (deeper in a model, a peak at the input
    is no peak at the maximum)."""
    read = {node.input[0] for node in model.graph.node if node.op_type in _PEAK_OPS and node.input}
    return [g for g in graph_inputs(model, source) if g.name in read and g.dtype.kind == "f" and all(isinstance(d, int) for d in g.dims)]


def _peak_period(model: onnx_types.ModelProto, source: Path) -> int:
    """The longest axis of the inputs the peaks draws put peaks in (the peaks' period), or 0 where none."""
    peaked = _peak_inputs(model, source)
    return max((int(d) for g in peaked for d in g.dims), default=1) if peaked else 0


def peak_places(model: onnx_types.ModelProto, source: Path) -> list[int]:
    """The places of the peaks draws, one draw each: the first and last of each line and their
    neighbours (where a loop bound or an index off by one leaves an element out); none where
    no op taking a maximum before an exponential reads a graph input."""
    period = _peak_period(model, source)
    return list(dict.fromkeys(p for p in (0, period - 1, 1, period - 2) if 0 <= p < period))


def _peaks(shape: tuple[int, ...], period: int, place: int) -> numpy.ndarray:
    """The range's high end where an element's indices sum to `place` modulo `period` + 1 (the
    longest axis plus one), its low end elsewhere: along any one axis two elements' sums differ
    by less than that, so each line holds at most one peak; a line whose peak would fall past
    its end holds none, beside lines that hold one (a maximum taken from another line shows)."""
    total = np.indices(shape).sum(axis=0) if shape else np.zeros(())
    return np.where(total % (period + 1) == place, _MAX_SCALE, -_MAX_SCALE)


def _order_bounds(model: onnx_types.ModelProto, declared: Sequence[GraphInput], arrays: list[numpy.ndarray]) -> None:
    """Each pair of drawn bounds (_ORDERED_OPERANDS) in order, lower first, in place."""
    position = {g.name: i for i, g in enumerate(declared)}
    for node in model.graph.node:
        pair = _ORDERED_OPERANDS.get(node.op_type)
        if pair is None or len(node.input) <= max(pair):
            continue
        lo, hi = (position.get(node.input[i]) for i in pair)
        if lo is not None and hi is not None and arrays[lo].shape == arrays[hi].shape:
            arrays[lo], arrays[hi] = np.asarray(np.minimum(arrays[lo], arrays[hi])), np.asarray(np.maximum(arrays[lo], arrays[hi]))


def draw(model: onnx_types.ModelProto, source: Path, *, seed: int, style: str, integers: str | None = None, turn: int = 0) -> Draw:
    """One seeded draw of every graph input in `style`. `integers`: a FALLBACKS key, to draw the
    integers that way instead (for a model whose integer inputs are indices, sizes or divisors).
    `turn`: which of the threshold draws (style THRESHOLDS) or peaks draws (PEAKS) this is."""
    rng = np.random.default_rng(seed)
    marks = landmarks(model) if style != "uniform" else []
    bounded = _bounded_inputs(model)
    special = roles(model, source)
    windows: dict[Window, tuple[numpy.ndarray, numpy.ndarray]] = {}
    peaked = {g.name for g in _peak_inputs(model, source)} if style == PEAKS else set()
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
        role = special.get(graph_input.name)
        if isinstance(role, Window) and kind in "iu":
            if role not in windows:
                windows[role] = _place(rng, style, role, graph_input.dtype)
            values = windows[role][0 if graph_input.name == role.starts else 1]
        elif isinstance(role, Index) and kind in "iu":
            values = _indices(rng, style, shape, role)
        elif isinstance(role, np.ndarray):
            values = role
        elif kind == "f" and style == PEAKS and graph_input.name in peaked:
            values = _peaks(shape, _peak_period(model, source), peak_places(model, source)[turn])
        elif kind == "f" and style == PEAKS:
            values = _floats(rng, "uniform", shape, marks)
        elif kind == "f" and style == THRESHOLDS:
            cover = _cover_values(model)
            values = np.array([cover[(i + turn) % len(cover)] for i in range(int(np.prod(shape, dtype=np.int64)))]).reshape(shape)
        elif kind == "f":
            values = _floats(rng, style, shape, marks)
        elif kind == "b":
            values = rng.integers(0, 2, shape)
        else:
            values = _integers(rng, integers or ("wide" if style == PEAKS else style), shape, graph_input.dtype, graph_input.name in bounded)
        arrays.append(np.asarray(values).astype(graph_input.dtype))
    _order_bounds(model, graph_inputs(model, source), arrays)
    what = STYLE_TEXT[style] + (f" (integers in {FALLBACKS[integers]}: onnxruntime refused the others)" if integers else "")
    what += "".join(f"; {_describe(name, role)}" for name, role in special.items())
    return Draw(f"seed {seed}, {style}: {what}", tuple(arrays), None, style, seed, turn)


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
    return Draw(draw_.label, tuple(arrays), draw_.expected, draw_.style, draw_.seed, draw_.turn)
