"""A module against the framework: run the module (through `run`'s iree-run-module path,
plugins included; on Vulkan every set of inputs in one process, run.run_calls) and the ONNX
model (onnxruntime, CPUExecutionProvider) on the same inputs, and compare every output
element by element.

Inputs are several seeded draws that reach each input's meaningful range (verify_inputs.py), or the
stored inputs of an ONNX test directory or .pb/.npy files (whose stored outputs are then the
reference), or given as `--input` specs. With a baseline (the same model compiled without
the replacement, run on the inputs where an output fails), an output that IREE's own module
also gets wrong is reported as IREE's difference, not the kernel's.

Long (~550 lines): the run, the reference, the comparison and the verdict with its report are one
flow whose records (TrialResult, OutputComparison) the CLI and the API print.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyree_build.actions import checks
from pyree_build.actions.results import NPY_TENSOR, exported_functions, function_parameters
from pyree_build.actions.run import require_device, run_calls
from pyree_build.core import escape, lazy
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.records import record
from pyree_build.models import verify_inputs
from pyree_build.models.ir.importer import INSTALL_ONNX, load_model

if TYPE_CHECKING:
    import numpy
    import onnx as onnx_types

np = lazy.module("numpy")
onnx = lazy.module("onnx")
ort = lazy.module("onnxruntime")
# torch, when a torch program is the reference: imported then (it imports torch)
torch_reference = lazy.module("pyree_build.models.torch_reference")

PathLike = str | os.PathLike[str]

# The tolerance against a computed reference is checks' (tune holds its variants to the same).
DEFAULT_RTOL = checks.COMPUTED_RTOL
DEFAULT_ATOL_SCALE = checks.COMPUTED_ATOL_SCALE
FLOAT16_TOLERANCE = checks.FLOAT16_TOLERANCE

# What an output's comparison concluded.
OK, MISMATCH, IREE_DIFFERS = "ok", "mismatch", "iree-differs"


@record(frozen=True)
class OutputComparison:
    """One output of the module against the reference: the worst element (the one furthest
    beyond the tolerance, or closest to it when all pass) and the largest errors. `verdict`:
    ok, mismatch, or iree-differs (the baseline, IREE's own module, differs from the reference
    too; `baseline_mismatched` elements of the module differ from the baseline)."""

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
    atol: float = 0.0
    rtol: float = DEFAULT_RTOL
    reference: str = "onnxruntime"
    verdict: str = OK
    baseline_mismatched: int = 0
    note: str = ""

    def render(self) -> str:
        where = "[" + ", ".join(map(str, self.worst_index)) + "]"
        verdict = "ok" if self.passed else f"MISMATCH in {self.mismatched} of {_size(self.shape)} elements"
        line = (
            f"output {self.index} ({escape.name(self.name)}, {'x'.join(map(str, self.shape)) or 'scalar'}): {verdict}; worst at {where}: "
            f"module {self.module_value:.9g}, {self.reference} {self.reference_value:.9g}, abs error {self.abs_error:.3g}, rel error {self.rel_error:.3g} "
            f"(max abs {self.max_abs_error:.3g}, max rel {self.max_rel_error:.3g}; rtol {self.rtol:.3g}, atol {self.atol:.3g})"
        )
        if self.verdict == IREE_DIFFERS:
            agrees = "the module agrees with it" if not self.baseline_mismatched else f"the module differs from it in {self.baseline_mismatched} elements"
            line += f"\n  IREE's own module (the baseline) differs from the reference here too: {agrees}"
        return escape.terminal(line + (f"\n  note: {self.note}" if self.note else ""))


@record(frozen=True)
class TrialResult:
    """The outputs of one set of inputs (`label`: how they were drawn, or where they were read)."""

    label: str
    outputs: tuple[OutputComparison, ...]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


@record(frozen=True)
class VerifyResult:
    """Every output of every trial of one verify run; `passed` when each is within tolerance.
    `outputs` are the first failing trial's (the first trial's when all pass)."""

    module: Path
    model: Path
    function: str
    trials: tuple[TrialResult, ...]
    rtol: float | None
    atol: float | None
    seed: int
    baseline: Path | None = None

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.trials)

    @property
    def outputs(self) -> tuple[OutputComparison, ...]:
        return next((t.outputs for t in self.trials if not t.passed), self.trials[0].outputs)

    @property
    def iree_differs(self) -> bool:
        """Every failing output is one IREE's own module (the baseline) gets wrong the same way."""
        failed = [o for t in self.trials for o in t.outputs if not o.passed]
        return bool(failed) and all(o.verdict == IREE_DIFFERS and not o.baseline_mismatched for o in failed)

    def render(self) -> str:
        if len(self.trials) == 1:
            return "\n".join(o.render() for o in self.trials[0].outputs)
        blocks = []
        for i, trial in enumerate(self.trials, 1):
            blocks.append(f"inputs {i} of {len(self.trials)} ({trial.label}):")
            blocks.extend("  " + o.render().replace("\n", "\n  ") for o in trial.outputs)
        return "\n".join(blocks)


def _size(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def given_inputs(model: onnx_types.ModelProto, specs: Sequence[str], source: Path) -> list[numpy.ndarray]:
    """The `--input` values, one per graph input, as arrays of the graph's element types."""
    declared = verify_inputs.graph_inputs(model, source)
    if len(specs) != len(declared):
        raise PyreeError(
            f"{len(specs)} inputs given, the model has {len(declared)} ({', '.join(d.name for d in declared)})",
            file=source,
            fix="give one --input per graph input, in order, or none (drawn inputs)",
        )
    arrays = []
    for spec, graph_input in zip(specs, declared):
        array = checks.spec_array(spec)
        dims = list(graph_input.dims)
        if len(array.shape) != len(dims) or any(isinstance(d, int) and d != a for d, a in zip(dims, array.shape)):
            raise PyreeError(
                f"input '{spec}' has shape {list(array.shape)}, graph input '{graph_input.name}' is {dims}", file=source, fix="give the input the graph's shape"
            )
        arrays.append(array.astype(graph_input.dtype, copy=False))
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


# onnxruntime refuses models and inputs the ONNX spec allows (LSTM's layout=1, ops it does not
# implement): the model is then no fault of the user's, and only stored outputs can be the reference.
_NO_ONNXRUNTIME = (
    "this is onnxruntime's limit, not a fault of the model (nothing to check in it): verify against stored outputs instead: --inputs DIR, a test_data_set_N directory of input_N.pb and output_N.pb (the outputs "
    "another framework gave on those inputs); the details say what onnxruntime refused"
)


def reference_outputs(model_path: Path, model: onnx_types.ModelProto, inputs: Sequence[numpy.ndarray]) -> tuple[list[str], list[numpy.ndarray]]:
    """onnxruntime's outputs (CPUExecutionProvider) and their names. Where onnxruntime refuses
    the model (at loading) or the inputs (at the run), the error names the node it refused,
    carries onnxruntime's message and asks for stored outputs."""
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # its refusal is in the error: not also logged to the terminal
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except ImportError:
        raise PyreeError("onnxruntime is not installed", file=model_path, fix=INSTALL_ONNX) from None
    except Exception as exc:  # onnxruntime raises its own exception types for a model it cannot load
        raise PyreeError(
            f"onnxruntime cannot load the model: it refuses {refused_node(model, str(exc))}, so it cannot be the reference",
            file=model_path, details=str(exc), fix=_NO_ONNXRUNTIME,
        ) from None  # fmt: skip
    names = [i.name for i in session.get_inputs()]
    try:
        results = session.run(None, dict(zip(names, inputs)))
    except Exception as exc:
        raise PyreeError(
            f"onnxruntime refused to run {refused_node(model, str(exc))} on these inputs, so it cannot be the reference",
            file=model_path, details=str(exc), fix=_NO_ONNXRUNTIME,
        ) from None  # fmt: skip
    return [o.name for o in session.get_outputs()], [np.asarray(r) for r in results]


# Where onnxruntime's messages name the node they refuse: at a run ("running Div node.
# Name:'div'"), a kernel it lacks ("node with name 'x'"), a graph it finds invalid ("In Node, ("x", Op").
_ORT_NODE = (
    re.compile(r"running (\w+) node\. Name:'([^']*)'"),
    re.compile(r"(\w+)\(\d+\) node with name '([^']*)'"),
    re.compile(r'In Node, \("([^"]*)", (\w+)'),
)


def refused_node(model: onnx_types.ModelProto, message: str) -> str:
    """The node onnxruntime's `message` is about, as "LSTM 'lstm'": named by the message, else
    the nodes of an op type the message names (its kernels are named after their op: an
    LSTM's refusal comes from LSTMBase; an op's name starting a sentence is no op), else "the model"."""
    for pattern in _ORT_NODE:
        if found := pattern.search(message):
            op, name = found.groups() if pattern is not _ORT_NODE[2] else found.groups()[::-1]
            return f"{escape.name(op)} '{escape.name(name)}'" if name else f"a {escape.name(op)} node"
    types = {n.op_type for n in model.graph.node}
    named = [t for t in types if re.search(rf"\b{re.escape(t)}(?![a-z]| [a-z])", message)]  # not a word of a sentence ("If you ...")
    if not named:
        return "the model"
    op = max(named, key=len)
    nodes = [n for n in model.graph.node if n.op_type == op]
    if len(nodes) == 1:
        return f"{escape.name(op)} '{escape.name(nodes[0].name)}'" if nodes[0].name else f"the {escape.name(op)} of '{escape.name(nodes[0].output[0])}'"
    return f"its {escape.name(op)} nodes ({len(nodes)})"


def _as_reference_type(actual: numpy.ndarray, expected: numpy.ndarray) -> tuple[numpy.ndarray, str]:
    """The module's result in the reference's integer type where only the sign differs: IREE's
    integers are signless, so a uint8 result comes back as i8 with the same bits."""
    got = np.asarray(actual)
    if got.dtype.kind in "iu" and expected.dtype.kind in "iu" and got.dtype != expected.dtype and got.dtype.itemsize == expected.dtype.itemsize:
        return got.view(expected.dtype), f"the module returns {got.dtype} (IREE's integers are signless), compared bit for bit as {expected.dtype}"
    return got, ""


def compare(
    index: int, name: str, actual: numpy.ndarray, expected: numpy.ndarray, rtol: float | None, atol: float | None, reference: str = "onnxruntime"
) -> OutputComparison:
    """One output: how far each element is from the reference's, and the worst of them.
    Integer and bool outputs are exact unless `atol` is given; a float output's absolute
    tolerance is `atol`, or DEFAULT_ATOL_SCALE times its largest finite magnitude, and its
    relative one `rtol`, or DEFAULT_RTOL (FLOAT16_TOLERANCE for both where it is float16)."""
    want_raw = np.asarray(expected)
    got_raw, note = _as_reference_type(actual, want_raw)
    rtol, tolerance = checks.computed_tolerance(want_raw, rtol, atol)
    close = checks.close_elements(got_raw, want_raw, rtol=rtol, atol=tolerance)
    got, want = got_raw.astype(np.float64), want_raw.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(checks.same_elements(got_raw, want_raw), 0.0, np.abs(got - want))
    diff = np.where(np.isnan(diff), np.inf, diff)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.abs(want))
    excess = diff - (tolerance + rtol * np.abs(np.where(np.isfinite(want), want, 0.0)))
    flat = int(np.argmax(excess)) if excess.size else 0
    worst = tuple(int(i) for i in np.unravel_index(flat, want.shape)) if want.size else ()
    return OutputComparison(
        index, name, tuple(int(d) for d in want.shape), worst,
        float(got[worst]) if want.size else 0.0, float(want[worst]) if want.size else 0.0,
        float(diff[worst]) if want.size else 0.0, float(rel[worst]) if want.size else 0.0,
        float(diff.max()) if want.size else 0.0, float(rel.max()) if want.size else 0.0,
        int((~close).sum()), bool(close.all()), float(tolerance), float(rtol), reference, OK if bool(close.all()) else MISMATCH, 0, note,
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


_ELEMENT_BITS = {"f16": 16, "f32": 32, "f64": 64, "bf16": 16}


def _require_parameters(module: Path, function: str, arrays: Sequence[numpy.ndarray], model_path: Path, names: Sequence[str] = ()) -> None:
    """The module's function takes the model's inputs: as many, of the same shapes and float
    widths (before it runs)."""
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
        parts = text.removeprefix("tensor<").removesuffix(">").split("x") if NPY_TENSOR.match(text) else None
        shape = parts[:-1] if parts is not None else None
        if shape is not None and (len(shape) != array.ndim or any(d not in ("?", str(a)) for d, a in zip(shape, array.shape))):
            raise PyreeError(
                f"argument {i} of {function} is {text}, the ONNX model {model_path.name}'s input {i} has shape {list(array.shape)}",
                file=module,
                fix="verify the module compiled from this model (pyree-build import, then compile)",
            )
        element = parts[-1] if parts else ""
        if array.dtype == np.float64 and _ELEMENT_BITS.get(element, 64) < 64:
            raise _demoted(module, function, f"graph input '{names[i] if i < len(names) else i}'", f"argument {i} of {function} is {text}")


def _demoted(module: Path, function: str, which: str, seen: str) -> PyreeError:
    return PyreeError(
        f"{which} is float64 (f64) and {seen}: iree-compile demotes f64 to f32 by default (--iree-input-demote-f64-to-f32), "
        f"so {function} cannot take the model's inputs",
        file=module,
        fix="compile with the demotion off to keep f64: pyree-build compile MODEL.mlir -o MODULE.vmfb -- --iree-input-demote-f64-to-f32=false",
    )


# The HAL executable formats of GPU targets, and the device each runs on.
_FORMAT_DEVICES = ((b"vulkan-spirv-fb", "vulkan"), (b"cuda-nvptx-fb", "cuda"), (b"rocm-hsaco-fb", "hip"))


def module_device(module: Path) -> str:
    """The device a module runs on: the GPU its executables are for (the format the module names
    for its executables), else local-sync. A module compiled for vulkan run on local-sync only
    says its HAL device is unavailable."""
    data = module.read_bytes()  # a file that is no module is named as such by the run
    return next((device for fmt, device in _FORMAT_DEVICES if fmt in data), "local-sync")


def _run_module(
    module: Path, function: str, calls: Sequence[Sequence[numpy.ndarray]], plugins: Sequence[PathLike], device: str, model_path: Path
) -> list[list[numpy.ndarray]]:
    """The module's results for each set of inputs in `calls` (run_calls: one process for them all
    where the device builds its pipelines in each, Vulkan; one iree-run-module each elsewhere)."""
    arrays = calls[0]  # every set has the graph's inputs' shapes and types
    try:
        return run_calls(module, function, calls, plugins=plugins, device=device)
    except PyreeError as err:
        doubles = [i for i, a in enumerate(arrays) if a.dtype == np.float64]
        if doubles and "exceeds backing buffer byte length" in (err.details or ""):
            raise _demoted(module, function, f"input {doubles[0]}", "the module takes f32 where the model has f64") from None
        if "mismatch" not in (err.details or "") or "shape" not in (err.details or ""):
            raise
        raise PyreeError(
            f"{function} does not take the inputs of the ONNX model {model_path.name} ({', '.join('x'.join(map(str, a.shape)) for a in arrays)})",
            file=module,
            details=err.details,
            fix="verify the module compiled from this model (pyree-build import, then compile)",
        ) from None


def _verify_inputs(
    model: onnx_types.ModelProto, model_path: Path, *, inputs: Sequence[str], input_files: Sequence[PathLike], seed: int, trials: int
) -> list[verify_inputs.Draw]:
    """The sets of inputs to compare on: given specs, stored files, or `trials` seeded draws
    (styles in turn: uniform, wide, ties, then again with the next seeds)."""
    if inputs and input_files:
        raise PyreeError("both --input and --inputs given", file=model_path, fix="give the inputs one way: --input SPEC per input, or --inputs FILES|DIR")
    declared = verify_inputs.graph_inputs(model, model_path)
    if inputs:
        return [verify_inputs.Draw("given --input values", tuple(given_inputs(model, inputs, model_path)))]
    if input_files:
        return [verify_inputs.conform(verify_inputs.stored(input_files), declared, model_path)]
    if trials < 1:
        raise PyreeError(f"--trials must be at least 1, got {trials}", fix=f"pass e.g. --trials {verify_inputs.DEFAULT_TRIALS}")
    sets = [verify_inputs.draw(model, model_path, seed=seed + i, style=verify_inputs.style_of(i)) for i in range(trials)]
    if trials >= verify_inputs.DEFAULT_TRIALS:
        # A model of few elements: each element meets each of its constants.
        turns = verify_inputs.threshold_turns(model, model_path)
        sets += [verify_inputs.draw(model, model_path, seed=seed + trials + k, style=verify_inputs.THRESHOLDS, turn=k) for k in range(turns)]
        # A maximum subtracted before exp: one peak per line, at its ends in turn.
        peaks = len(verify_inputs.peak_places(model, model_path))
        sets += [verify_inputs.draw(model, model_path, seed=seed + trials + turns + k, style=verify_inputs.PEAKS, turn=k) for k in range(peaks)]
    return sets


@record(frozen=True)
class Reference:
    """What the module is compared with: its name (onnxruntime, torch) and its outputs for a set of inputs."""

    name: str
    run: Callable[[Sequence[numpy.ndarray]], tuple[list[str], list[numpy.ndarray]]]


def _reference(
    model_path: Path, model: onnx_types.ModelProto, draw: verify_inputs.Draw, reference: Reference
) -> tuple[verify_inputs.Draw, list[str], list[numpy.ndarray], str]:
    """(the draw as used, output names, the reference outputs, the reference's name): the stored
    outputs where the inputs came with them, else onnxruntime's. A drawn set whose integers
    onnxruntime refuses across their type (indices, sizes) is drawn again with small integers;
    a model it cannot load is refused at once (no inputs change that)."""
    names = [o.name for o in model.graph.output]
    if draw.expected is not None:
        if len(draw.expected) != len(names):
            raise PyreeError(
                f"{len(draw.expected)} stored outputs, the model has {len(names)} ({', '.join(names)})",
                file=model_path,
                fix="pass a test directory of this model",
            )
        return draw, names, list(draw.expected), "stored"
    try:
        found, expected = reference.run(draw.arrays)
        return draw, found, expected, reference.name
    except PyreeError as refused:
        if draw.style is None or not any(a.dtype.kind in "iu" for a in draw.arrays) or refused.what.startswith("onnxruntime cannot load"):
            raise
        first = refused
    for integers in verify_inputs.FALLBACKS:
        if integers == "small" and draw.style == "uniform":
            continue  # the uniform draw's integers are already small
        again = verify_inputs.draw(model, model_path, seed=draw.seed, style=draw.style, integers=integers, turn=draw.turn)
        try:
            found, expected = reference.run(again.arrays)
            return again, found, expected, reference.name
        except PyreeError:
            continue
    raise first


def _judge(
    comparison: OutputComparison, actual: numpy.ndarray, expected: numpy.ndarray, baseline: numpy.ndarray | None, rtol: float | None, atol: float | None
) -> OutputComparison:
    """A failing output against the baseline: when IREE's own module differs from the reference
    too, the difference is IREE's; how far the module is from the baseline says whether the
    kernel adds a difference of its own."""
    if comparison.passed or baseline is None:
        return comparison
    own = compare(comparison.index, comparison.name, baseline, expected, rtol, atol, comparison.reference)
    if own.passed:
        return comparison
    against = compare(comparison.index, comparison.name, actual, np.asarray(baseline).astype(np.asarray(expected).dtype, copy=False), rtol, atol)
    return _with(comparison, verdict=IREE_DIFFERS, baseline_mismatched=against.mismatched)


def _with(comparison: OutputComparison, **changes: object) -> OutputComparison:
    fields: dict[str, object] = {n: getattr(comparison, n) for n in comparison.__match_args__}
    return OutputComparison(**{**fields, **changes})  # type: ignore[arg-type]


def _check_settings(seed: int, rtol: float | None, atol: float | None) -> None:
    if not (isinstance(seed, int) and seed >= 0):
        raise PyreeError(f"seed must be a non-negative whole number, got {seed}", fix="pass e.g. --seed 0")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not value >= 0:
            raise PyreeError(f"{name} must be a non-negative number, got {value}", fix=f"pass e.g. --{name} 1e-5")


def verify(
    module: PathLike,
    onnx_model: PathLike | None = None,
    *,
    torch: Any = None,
    function: str | None = None,
    inputs: Sequence[str] = (),
    input_files: Sequence[PathLike] = (),
    plugins: Sequence[PathLike] = (),
    baseline: PathLike | None = None,
    seed: int = 0,
    trials: int = verify_inputs.DEFAULT_TRIALS,
    rtol: float | None = None,
    atol: float | None = None,
    device: str | None = None,
    skip_unavailable: bool = False,
) -> VerifyResult:
    """Run `module` and the ONNX model on the same inputs and compare every output.

    Inputs are `trials` seeded draws (seeds `seed`, `seed + 1`, ...; styles uniform, wide and
    ties in turn: floats in [-1, 1]; floats past and at the model's own constants, integers
    across their type; a few values only, so elements tie; with `trials` >= 3, one draw per
    threshold value where the model's float inputs are few, verify_inputs.threshold_turns, and peaks draws where
    it subtracts a maximum before exp, verify_inputs.peak_places), or the given `inputs` (`--input`
    specs: `4x16xf32=1`, `@x.npy`), or `input_files`: an ONNX test directory (input_N.pb,
    with output_N.pb as the reference) or .pb/.npy files, one per graph input. The module runs
    with iree-run-module (`plugins` loaded; on Vulkan, once for every set of inputs, through IREE's
    Python runtime in a child process, so that lavapipe compiles its shaders once; on `device`: by default the device its executables
    are for, vulkan, cuda or hip for a GPU module, else local-sync); `function` defaults to the graph's
    name or the module's only function. A float output passes where every element is within
    `atol + rtol * |reference|`, `rtol` defaulting to 1e-4 and `atol` to 1e-5 times the
    output's largest magnitude (both 4e-3 for float16); integer and bool outputs must be equal. `baseline`: the model compiled without
    the replacement, run on the same inputs where an output fails (it is read for nothing else),
    so an output IREE itself computes differently from the reference is reported as IREE's
    difference (verdict iree-differs).
    `skip_unavailable`: where `device` is absent (no GPU), stop with the exit code ctest reads
    as skipped (a GPU module's verify test on a machine without one).
    """
    mod = require_file(module, "module")
    model_path, model, reference = _model_and_reference(onnx_model, torch)
    base = require_file(baseline, "baseline module") if baseline is not None else None
    _check_settings(seed, rtol, atol)
    sets = _verify_inputs(model, model_path, inputs=inputs, input_files=input_files, seed=seed, trials=trials)
    for value in model.graph.output:
        verify_inputs.numpy_dtype(value.type.tensor_type.elem_type, value.name, model_path)
    fn = choose_function(mod, model, function)
    base_fn = choose_function(base, model, function) if base is not None else fn
    input_names = [g.name for g in verify_inputs.graph_inputs(model, model_path)]
    _require_parameters(mod, fn, sets[0].arrays, model_path, input_names)
    if base is not None:
        _require_parameters(base, base_fn, sets[0].arrays, model_path, input_names)
    base_device = device or (module_device(base) if base is not None else "local-sync")
    device = device or module_device(mod)
    if skip_unavailable:
        require_device(device, skip_unavailable=True)
    results = _trials(model_path, model, sets, (mod, fn, plugins, device), (base, base_fn, base_device) if base is not None else None, rtol, atol, reference)
    return VerifyResult(mod, model_path, fn, tuple(results), rtol, atol, seed, base)


def _model_and_reference(onnx_model: PathLike | None, torch_program: Any) -> tuple[Path, onnx_types.ModelProto, Reference]:
    """(the model's path, its ONNX graph, the reference): onnxruntime on an ONNX model, or a torch
    program run eagerly (its inputs and outputs declared as an ONNX graph, so the draws are the same)."""
    if torch_program is not None:
        if onnx_model is not None:
            raise PyreeError("both an ONNX model and a torch program given as the reference", fix="verify against one: the ONNX model, or --torch PROGRAM.pt2")
        program, path = torch_reference.program_of(torch_program)
        return path, torch_reference.interface(program, path), Reference("torch", functools.partial(torch_reference.outputs, program, path))
    if onnx_model is None:
        raise PyreeError(
            "verify needs a reference: the ONNX model, or a torch program", fix="pass MODEL.onnx, or --torch PROGRAM.pt2 (torch=program in Python)"
        )
    model_path = require_file(onnx_model, "ONNX model")
    model = load_model(model_path)
    return model_path, model, Reference("onnxruntime", functools.partial(reference_outputs, model_path, model))


def _trials(
    model_path: Path, model: onnx_types.ModelProto, sets: Sequence[verify_inputs.Draw], run: tuple[Path, str, Sequence[PathLike], str],
    baseline: tuple[Path, str, str] | None, rtol: float | None, atol: float | None, reference: Reference,
) -> list[TrialResult]:  # fmt: skip
    """Every set of inputs: the references first (a set onnxruntime refuses is drawn again), then
    the module (`run`: module, function, plugins, device) once for all the sets (_run_module), every
    output compared. The baseline (module, function, device) is read only for an output that fails
    (_judge), so it runs only on the sets where one does, once for them all: a passing verify of a
    SqueezeNet on lavapipe runs the model 3 times, not 6."""
    mod, fn, plugins, device = run
    references = [_reference(model_path, model, drawn, reference) for drawn in sets]
    calls = [used.arrays for used, _, _, _ in references]
    actual = _run_module(mod, fn, calls, plugins, device, model_path)
    compared = []
    for outputs, (_, names, expected, source) in zip(actual, references):
        _require_matching(mod, fn, outputs, names, expected)
        compared.append([compare(j, names[j], a, e, rtol, atol, source) for j, (a, e) in enumerate(zip(outputs, expected))])
    failing = [k for k, outputs in enumerate(compared) if not all(o.passed for o in outputs)]
    own: dict[int, list[numpy.ndarray]] = {}
    if baseline is not None and failing:
        base, base_fn, base_device = baseline
        for k, outputs in zip(failing, _run_module(base, base_fn, [calls[k] for k in failing], (), base_device, model_path)):
            _require_matching(base, base_fn, outputs, references[k][1], references[k][2])
            own[k] = outputs
    return [_trial(references[k][0].label, compared[k], actual[k], references[k][2], own.get(k), rtol, atol) for k in range(len(sets))]


def _trial(
    label: str, compared: Sequence[OutputComparison], actual: Sequence[numpy.ndarray], expected: Sequence[numpy.ndarray],
    own: Sequence[numpy.ndarray] | None, rtol: float | None, atol: float | None,
) -> TrialResult:  # fmt: skip
    """One set of inputs: each output's comparison with the reference, a failing one judged against
    the baseline's output (`own`, where the baseline ran)."""
    return TrialResult(
        label, tuple(_judge(c, a, e, own[j] if own is not None else None, rtol, atol) for j, (c, a, e) in enumerate(zip(compared, actual, expected)))
    )
