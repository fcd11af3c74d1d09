"""Tune a kernel: build every combination of its `-D` parameters, check each variant's output
against a reference before timing it, benchmark the rest one at a time, and record the fastest.

A variant that computes a wrong result, crashes or hangs (the run's timeout) is reported as
such and never chosen. Builds go through the plugin action, so each variant is cached (and
shared through the remote cache) like any build. Builds and checks run in parallel (-j);
benchmarks run one at a time so they do not disturb each other. `ray=` hands the same steps
to a Ray cluster (tuning/on_ray.py, imported only then).

A GPU kernel (`target` vulkan, cuda, hip: what `replace --target` writes) goes through the same
steps: only how a variant is built and which module it runs with differ (tuning/gpu.py:
its object, the program compiled with the spec against it, on the target's device).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import itertools
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyree_build.actions import bench as bench_action
from pyree_build.actions import checks
from pyree_build.actions import run as run_action
from pyree_build.backends.llvm_cpu import plugins as plugin_action
from pyree_build.core import echo, files, lazy, processes, readers
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.outputs import included_files

if TYPE_CHECKING:
    import numpy

np = lazy.module("numpy")
_tune_ray = lazy.module("pyree_build.tuning.on_ray")
_verify = lazy.module("pyree_build.models.verify")
_importer = lazy.module("pyree_build.models.ir.importer")
_verify_inputs = lazy.module("pyree_build.models.verify_inputs")
_tune_gpu = lazy.module("pyree_build.tuning.gpu")

PathLike = str | os.PathLike[str]

FORMAT = "pyree_build.tune.v1"
INSTALL_RAY = 'pip install "pyree_build[ray]"'
DEFAULT_TIMEOUT_S = 60.0
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# What a variant's check or benchmark ended as, besides "ok".
WRONG, CRASHED, HUNG, BUILD_FAILED, LOST = "wrong result", "crashed", "hung", "build failed", "lost"


@dataclass(frozen=True)
class Plan:
    """Everything a variant's build, check and benchmark need, the same on every machine."""

    sources: list[str]
    kind: str
    module: str
    function: str
    inputs: list[str]
    archs: list[str] = field(default_factory=list)
    cc: str = "zig"
    cpu: str = "baseline"
    include_dirs: list[str] = field(default_factory=list)
    defines: list[str] = field(default_factory=list)
    device: str = "local-sync"
    rtol: float = checks.DEFAULT_RTOL
    atol: float = checks.DEFAULT_ATOL
    timeout: float = DEFAULT_TIMEOUT_S
    spread: float = 0.05
    budget: float = 10.0
    max_rounds: int = 20
    repetitions: int = 3
    min_time: float = 0.05
    # A GPU kernel (target vulkan, cuda, hip): each variant compiles `program` with `spec` and its
    # own object (tuning/gpu.py), so `module` is unused; `target_options` pick the GPU (sm, gfx, ...).
    target: str = "llvm-cpu"
    program: str = ""
    spec: str = ""
    target_options: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu(self) -> bool:
        return self.target != _tune_gpu.CPU

    @property
    def suffix(self) -> str:
        return ".sos" if self.kind == "standalone" and len(self.archs) > 1 else ".so"


@dataclass
class Variant:
    """One combination of parameter values, and what became of it."""

    params: dict[str, str]
    status: str = "pending"
    reason: str = ""
    samples_ms: list[float] = field(default_factory=list)
    plugin: str | None = None  # what was built: the CPU's plugin, a GPU kernel's object
    module: str | None = None  # a GPU kernel's: the program compiled with this variant's object
    node: str | None = None
    order: int = 0  # its place in the order declared: among variants noise cannot tell apart, the first wins

    @property
    def flags(self) -> list[str]:
        return [f"{name}={value}" for name, value in self.params.items()]

    @property
    def label(self) -> str:
        return " ".join(self.flags)

    @property
    def directory(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", "_".join(self.flags)) or "default"

    @property
    def runs_with(self) -> str | None:
        """What its check and benchmark are given: its own module (a GPU kernel's), else its plugin."""
        return self.module or self.plugin

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("inf")


@dataclass
class TuneResult:
    """The variants as `ranked` orders them (the winner, the other measured ones by median, the
    rejected); `best` is the winner."""

    variants: list[Variant]
    best: Variant | None
    output: Path | None

    note: str = ""  # set when nothing was tuned: why

    def render(self) -> str:
        return self.note or render(self.variants)


def parse_params(params: Mapping[str, object] | str | Iterable[str]) -> dict[str, list[str]]:
    """`NAME=V1,V2` strings (or a mapping NAME -> values) as NAME -> list of values, in order."""
    items: Iterable[tuple[str, object]]
    if isinstance(params, Mapping):
        items = params.items()
    else:
        texts: list[object] = [params] if isinstance(params, str) else list(params)
        pairs: list[tuple[str, object]] = []
        for text in texts:
            if not isinstance(text, str) or "=" not in text:
                raise PyreeError(f"parameter {text!r} is not NAME=V1,V2,...", fix="e.g. --param TILE=1,2,4,8 (repeatable)")
            name, _, text_values = text.partition("=")
            pairs.append((name.strip(), [v.strip() for v in text_values.split(",") if v.strip()]))
        items = pairs
    parsed: dict[str, list[str]] = {}
    for name, values in items:
        listed: list[Any] = [values] if isinstance(values, (str, int, float)) or not isinstance(values, Iterable) else list(values)
        if not isinstance(name, str) or not _NAME.match(name):
            raise PyreeError(f"parameter name {name!r} is not a C macro name", fix="name a -D macro of the kernel: letters, digits, _")
        if name in parsed or not listed:
            raise PyreeError(f"parameter {name} is given twice or without values", fix=f"give each once: --param {name}=1,2,4")
        values = [str(v) for v in listed]
        for value in values:
            # A -D value is one line of the preprocessor's predefines: a line break would add lines of its own.
            if not value or not value.isprintable():
                raise PyreeError(f"parameter {name} has the value {value!r}, which is empty or holds a line break or control character",
                                 fix=f"give printable values on one line: --param {name}=1,2,4")  # fmt: skip
        parsed[name] = values
    if not parsed:
        raise PyreeError("nothing to tune: no --param given", fix="e.g. --param TILE=1,2,4,8")
    return parsed


# A knob a source declares for tune: `// pyree-tune: NAME=V1,V2,...` (what `replace` writes above
# each of its schedule's macros); the rest of the line after the values is a comment.
_DECLARED = re.compile(r"^\s*//\s*pyree-tune:\s*([A-Za-z_]\w*\s*=\s*[^\s]+)", re.MULTILINE)


def declared_params(sources: Sequence[PathLike] | PathLike) -> dict[str, list[str]]:
    """The knobs the sources declare (`// pyree-tune: NAME=V1,V2`), in the order written: what
    tune sweeps when given no --param. A name declared twice keeps its first values."""
    found: dict[str, list[str]] = {}
    for source in [sources] if isinstance(sources, (str, os.PathLike)) else sources:
        text = require_file(source, "C source").read_text(encoding="utf-8", errors="replace")
        for declaration in _DECLARED.findall(text):
            for name, values in parse_params([declaration]).items():
                found.setdefault(name, values)
    return found


def variants_of(params: Mapping[str, Sequence[str]]) -> list[Variant]:
    """Every combination of the values (the cartesian product), in the order given."""
    names = list(params)
    return [Variant(dict(zip(names, values)), order=k) for k, values in enumerate(itertools.product(*(params[n] for n in names)))]


def _sha256(path: Path) -> str:
    return readers.sha256_of(path) or "-"  # a source that is gone or not a file matches no record


def expected_outputs(
    plan: Plan, *, reference: PathLike | None, onnx: PathLike | None, expect_output: Sequence[str], plugins: Sequence[PathLike] = ()
) -> list[numpy.ndarray]:
    """The results every variant must reproduce: the reference module's, onnxruntime's or the given ones."""
    given = [reference is not None, onnx is not None, bool(expect_output)]
    if sum(given) != 1:
        raise PyreeError(
            "a tune needs exactly one reference for the results: --reference REF.vmfb, --onnx MODEL.onnx or --expect-output",
            fix="e.g. --reference build/model_without_plugin.vmfb (the same program compiled without your kernel)",
        )
    if reference is not None:
        ref = require_file(reference, "reference module")
        with echo.Stopwatch(f"reference results from {ref.name}"):
            return run_action.run(ref, plan.function, inputs=plan.inputs, plugins=plugins, device=reference_device(plan, ref), timeout=plan.timeout).outputs
    if onnx is not None:
        model_path = require_file(onnx, "ONNX model")
        model = _importer.load_model(model_path)
        arrays = _verify.given_inputs(model, plan.inputs, model_path)
        return list(_verify.reference_outputs(model_path, model, arrays)[1])
    return [checks.spec_array(e if not str(e).endswith(".npy") or str(e).startswith("@") else f"@{e}") for e in expect_output]


def reference_device(plan: Plan, reference: Path) -> str:
    """Where the reference module runs: a CPU tune's device; a GPU kernel's reference on the
    device it was compiled for (the program without the kernel, for the CPU or for the GPU)."""
    return _verify.module_device(reference) if plan.gpu else plan.device


def drawn_inputs(onnx: PathLike, directory: Path) -> list[str]:
    """Inputs for a tune against an ONNX model given none: verify's wide draw (floats past and at
    the model's constants, integers across their type; small integers where onnxruntime refuses
    those), saved as input_N.npy in `directory`, as `@` specs every variant's run reads."""
    model_path = require_file(onnx, "ONNX model")
    model = _importer.load_model(model_path)
    for integers in (None, *_verify_inputs.FALLBACKS):
        drawn = _verify_inputs.draw(model, model_path, seed=0, style="wide", integers=integers)
        try:
            _verify.reference_outputs(model_path, model, drawn.arrays)
            break
        except PyreeError:
            continue  # the last draw goes on: expected_outputs names onnxruntime's refusal
    directory.mkdir(parents=True, exist_ok=True)
    specs = []
    for i, array in enumerate(drawn.arrays):
        path = directory / f"input_{i}.npy"
        with files.atomic_output(path) as tmp, open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)
        specs.append(f"@{path.resolve()}")
    echo.log_step(f"inputs for {model_path.name}: {drawn.label}, in {directory}")
    return specs


def build_variant(plan: Plan, variant: Variant, directory: Path) -> Path:
    """What the variant runs with, built (or taken from the cache): the CPU's plugin (the plugin
    action); a GPU kernel's object (its backend), then the program compiled with it (`variant.module`)."""
    out = directory / variant.directory / f"{Path(plan.sources[0]).stem}{plan.suffix}"
    defines = [*plan.defines, *variant.flags]
    if plan.gpu:
        source, where = plan.sources[0], directory / variant.directory
        obj, spec, search = _tune_gpu.build(source, plan.target, spec=plan.spec, include_dirs=plan.include_dirs, defines=defines,
                                            options=plan.target_options, out_dir=where)  # fmt: skip
        variant.plugin = str(obj)
        module = _tune_gpu.compile_variant(plan.program, plan.target, spec=spec, search=search, import_name=Path(source).stem, options=plan.target_options,
                                           out=where / f"{Path(source).stem}.vmfb")  # fmt: skip
        variant.module = str(module)
        return module
    with echo.muted_commands():
        return plugin_action.plugin(
            plan.sources, out, kind=plan.kind, archs=plan.archs, cc=plan.cc, include_dirs=plan.include_dirs, defines=defines, jobs=1, cpu=plan.cpu
        )


def classify(error: PyreeError) -> str:
    """What a failed run of a variant was: a hang (the timeout) or a crash."""
    return HUNG if "timed out" in error.what else CRASHED


# Each check calls the function this many times in one process: a variant right on its first
# call only (state kept between calls) is wrong, and must never be chosen.
CHECK_CALLS = 3
# What the child process of the repeated calls may take beyond the calls (Python, numpy and
# iree.runtime starting on a loaded machine): a slow start must never read as a hang.
_START_ALLOWANCE_S = 30.0


@dataclass(frozen=True)
class Case:
    """Other inputs a variant must also get right, with the reference's results for them."""

    inputs: list[str]
    expected: list[Any]


# Besides the given inputs, each variant gets this many sets of random inputs of the same
# shapes (when a reference module can say what their results are): a kernel right for the
# given values only (a constant, a special case) is wrong.
RANDOM_CASES = 2


def random_cases(plan: Plan, reference: PathLike, directory: Path, count: int = RANDOM_CASES) -> list[Case]:
    """`count` sets of random inputs shaped as the given ones (numbers stay as given), saved
    under `directory`, with the reference module's results for each."""
    rng = np.random.default_rng(0x5EED)
    cases = []
    for k in range(count):
        specs = []
        for i, spec in enumerate(plan.inputs):
            parsed = checks.parse_input(spec)
            if parsed.shape is None and parsed.file is None:  # a scalar parameter
                specs.append(spec)
                continue
            given = checks.spec_array(spec)
            if given.dtype.kind == "f":
                values = rng.uniform(-4, 4, given.shape).astype(given.dtype)
            elif given.dtype.kind in "iu":
                values = rng.integers(0 if given.dtype.kind == "u" else -8, 8, given.shape).astype(given.dtype)
            else:
                values = rng.integers(0, 2, given.shape).astype(given.dtype)
            path = directory / "random_inputs" / f"case{k}_input{i}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, values)
            specs.append(f"@{path}")
        with echo.muted_commands():
            outputs = run_action.run(reference, plan.function, inputs=specs, device=reference_device(plan, Path(reference)), timeout=plan.timeout).outputs
        cases.append(Case(specs, list(outputs)))
    return cases


def check_variant(plan: Plan, plugin: PathLike, expected: Sequence[numpy.ndarray], cases: Sequence[Case] = ()) -> tuple[str, str]:
    """Run the variant (`plugin`: what it runs with, runs_with) and compare its results, then
    call it CHECK_CALLS times in one process (the plugin kept loaded; a GPU kernel's module:
    one run per case), and once with each of `cases`' inputs, and compare every call's:
    ("ok", "") or (status, why)."""
    module, plugins = runs_with(plan, plugin)
    try:
        with echo.muted_commands():
            outputs = run_action.run(module, plan.function, inputs=plan.inputs, plugins=plugins, device=plan.device, timeout=plan.timeout).outputs
    except PyreeError as error:
        return classify(error), error.what
    status, why = _compare(plan, plugin, outputs, expected)
    if status != "ok":
        return status, why
    if not plan.gpu:
        return _check_repeated_calls(plan, plugin, expected, cases)
    return _check_cases_by_runs(plan, module, cases)


def runs_with(plan: Plan, built: PathLike) -> tuple[str, list[str]]:
    """The module a variant runs with and the plugins it loads: the shared module and the
    variant's plugin (CPU), or the variant's own module (a GPU kernel, embedded in it)."""
    return (os.fspath(built), []) if plan.gpu else (plan.module, [os.fspath(built)])


def _check_cases_by_runs(plan: Plan, module: PathLike, cases: Sequence[Case]) -> tuple[str, str]:
    """A GPU variant's other inputs, one iree-run-module each: the repeated calls in one process
    need IREE's Python runtime, which cannot read results back on every device (lavapipe), and
    a GPU kernel keeps no state of its own between dispatches (it has no globals a plugin has)."""
    for case in cases:
        try:
            with echo.muted_commands():
                outputs = run_action.run(module, plan.function, inputs=case.inputs, device=plan.device, timeout=plan.timeout).outputs
        except PyreeError as error:
            return classify(error), error.what
        status, why = _compare(plan, module, outputs, case.expected)
        if status != "ok":
            return status, f"random inputs {' '.join(case.inputs)}: {why}"
    return "ok", ""


def _check_repeated_calls(plan: Plan, plugin: PathLike, expected: Sequence[numpy.ndarray], cases: Sequence[Case]) -> tuple[str, str]:
    calls = [Case(plan.inputs, list(expected))] * CHECK_CALLS + list(cases)
    with tempfile.TemporaryDirectory(prefix="pyree-tune-check.") as tmp:
        spec = {"module": plan.module, "function": plan.function, "device": plan.device, "plugin": os.fspath(plugin), "out": tmp,
                "calls": [c.inputs for c in calls]}  # fmt: skip
        try:
            with echo.muted_commands():
                processes.spawn(
                    [sys.executable, "-m", "pyree_build.tuning.calls", json.dumps(spec)],
                    what=f"calling {plan.function} {CHECK_CALLS} times in one process", file=plugin,
                    timeout=plan.timeout * len(calls) + _START_ALLOWANCE_S, crash_hint=run_action.crash_hint([plugin]),
                )  # fmt: skip
        except PyreeError as error:
            return classify(error), error.what
        for call, case in enumerate(calls):
            outputs = [np.load(f) for f in sorted(Path(tmp).glob(f"{call}_*.npy"), key=lambda f: int(f.stem.split("_")[1]))]
            status, why = _compare(plan, plugin, outputs, case.expected)
            if status != "ok" and call < CHECK_CALLS:
                return status, f"call {call + 1} of {CHECK_CALLS} in one process: {why}"
            if status != "ok":
                return status, f"random inputs {' '.join(case.inputs)}: {why}"
    return "ok", ""


def _compare(plan: Plan, plugin: PathLike, outputs: Sequence[numpy.ndarray], expected: Sequence[numpy.ndarray]) -> tuple[str, str]:
    if len(outputs) != len(expected):
        return WRONG, f"{len(outputs)} results, the reference has {len(expected)}"
    specs: list[Any] = list(expected)  # arrays are expected values as much as specs are
    try:
        checks.check_close(outputs, specs, rtol=plan.rtol, atol=plan.atol, source=os.fspath(plugin))
    except PyreeError as error:
        return WRONG, error.what + (f" ({error.details})" if error.details else "")
    return "ok", ""


def build_and_check(plan: Plan, variant: Variant, directory: Path, expected: Sequence[numpy.ndarray], cases: Sequence[Case] = ()) -> Variant:
    """Build one variant and check it; its status says how that went."""
    try:
        plugin = build_variant(plan, variant, directory)
    except PyreeError as error:
        variant.status, variant.reason = BUILD_FAILED, error.what
        return variant
    if not plan.gpu:
        variant.plugin = str(plugin)
    variant.status, variant.reason = check_variant(plan, plugin, expected, cases)
    return variant


def spread_of(samples: Sequence[float]) -> float:
    """(max - min) / median of the samples: how far apart the rounds are."""
    middle = statistics.median(samples)
    return (max(samples) - min(samples)) / middle if middle > 0 else float("inf")


def measure(plan: Plan, plugin: PathLike) -> list[float]:
    """Benchmark rounds (each the median of `repetitions`, in ms) until the last three are within
    `spread` of each other, or `budget` seconds or `max_rounds` are spent."""
    samples: list[float] = []
    deadline = time.monotonic() + plan.budget
    while len(samples) < plan.max_rounds:
        samples.append(_one_round(plan, plugin))
        if len(samples) >= 3 and spread_of(samples[-3:]) <= plan.spread:
            break
        if time.monotonic() >= deadline:
            break
    return samples


def _one_round(plan: Plan, plugin: PathLike) -> float:
    """One benchmark round: the median of `repetitions`, in ms (summed over the function's benchmarks)."""
    module, plugins = runs_with(plan, plugin)
    with echo.muted_commands():
        result = bench_action.bench(
            module, plan.function, inputs=plan.inputs, plugins=plugins, device=plan.device,
            repetitions=plan.repetitions, min_time=plan.min_time, timeout=plan.timeout,
        )  # fmt: skip
    return sum(t.median_ms for t in result.timings)


def measure_variant(plan: Plan, variant: Variant) -> Variant:
    assert variant.runs_with is not None
    try:
        variant.samples_ms = measure(plan, variant.runs_with)
    except PyreeError as error:
        variant.status, variant.reason = classify(error), f"in the benchmark: {error.what}"
    return variant


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.2f} us" if ms < 1 else f"{ms:.3f} ms"


def ranked(variants: Sequence[Variant]) -> list[Variant]:
    """The chosen variant (choose), the other measured ones by median time, then the rejected in
    their given order."""
    winner, _ = choose(variants)
    good = sorted((v for v in variants if v.status == "ok" and v.samples_ms), key=lambda v: (v is not winner, v.median_ms))
    return good + [v for v in variants if v not in good]


def median_interval(samples: Sequence[float]) -> tuple[float, float]:
    """A distribution-free ~99% interval of the median of `samples`: the order statistics k and
    n + 1 - k with k = (n - 2.58 sqrt(n)) / 2. It narrows as rounds are added (min - max never
    does), and assumes nothing of the noise's shape, which on a loaded machine is anything;
    99%, not 95%: a choice is made among many pairs, and a false "apart" changes the winner."""
    ordered = sorted(samples)
    k = max(0, int((len(ordered) - 2.58 * math.sqrt(len(ordered))) / 2))
    return ordered[k], ordered[len(ordered) - 1 - k]


def clearly_faster(a: Variant, b: Variant) -> bool:
    """`a`'s median is below `b`'s beyond what the rounds' noise allows (the intervals are apart)."""
    return median_interval(a.samples_ms)[1] < median_interval(b.samples_ms)[0]


def choose(variants: Sequence[Variant]) -> tuple[Variant | None, list[Variant]]:
    """The winner and the variants it cannot be told apart from. The winner is the first
    variant, in the order declared (the simplest first), that no other is clearly faster than:
    among variants whose times overlap, noise would pick a different one each run, the declared
    order picks the same one. There is always one (the variant whose interval starts lowest)."""
    measured = sorted((v for v in variants if v.status == "ok" and v.samples_ms), key=lambda v: v.order)
    for v in measured:
        if not any(clearly_faster(o, v) for o in measured if o is not v):
            return v, [o for o in measured if o is not v and not clearly_faster(v, o)]
    return None, []


def separate(plan: Plan, variants: Sequence[Variant]) -> None:
    """More rounds, the contenders in turn, while the winner cannot be told apart from a variant
    whose median is lower (more rounds narrow both intervals), until they separate, or the
    rounds (--max-rounds more) or the budget (--budget seconds) are spent."""
    deadline = time.monotonic() + plan.budget
    for _ in range(plan.max_rounds):
        winner, tied = choose(variants)
        faster = [v for v in tied if winner is not None and v.median_ms < winner.median_ms]
        if winner is None or not faster or time.monotonic() >= deadline:
            return
        for v in (winner, *faster):
            assert v.runs_with is not None
            try:
                v.samples_ms.append(_one_round(plan, v.runs_with))
            except PyreeError as error:
                v.status, v.reason = classify(error), f"in the benchmark: {error.what}"
                return


def choice_line(variants: Sequence[Variant]) -> str:
    """How sure the choice is, in words."""
    winner, tied = choose(variants)
    if winner is None:
        return "chosen: none"
    if not tied:
        return f"chosen: {winner.label}: clearly faster than every other variant (the intervals of the medians are apart)"
    return (
        f"chosen: {winner.label}: a tie with {', '.join(v.label for v in tied)} (the intervals of their medians overlap, "
        "so noise cannot tell them apart); the first declared of them wins, the same one every run"
    )


def render(variants: Sequence[Variant]) -> str:
    """The table: rank, variant, median, min - max, rounds; rejected variants with the reason."""
    rows = ranked(variants)
    width = max([len(v.label) for v in rows] + [7])
    lines = [f"{'rank':<5} {'variant':<{width}} {'median':>11} {'min - max':>25} {'rounds':>6}"]
    for rank, v in enumerate((v for v in rows if v.status == "ok" and v.samples_ms), 1):
        span = f"{_fmt(min(v.samples_ms))} - {_fmt(max(v.samples_ms))}"
        lines.append(f"{rank:<5} {v.label:<{width}} {_fmt(v.median_ms):>11} {span:>25} {len(v.samples_ms):>6}")
    for v in rows:
        if v.status != "ok" or not v.samples_ms:
            lines.append(f"{'-':<5} {v.label:<{width}} {v.status.upper()}: {v.reason.splitlines()[0] if v.reason else 'not measured'}")
    if any(v.status == "ok" and v.samples_ms for v in rows):
        lines.append(choice_line(variants))
    return "\n".join(lines)


def _variant_record(v: Variant) -> dict[str, Any]:
    record = {k: value for k, value in asdict(v).items() if k not in ("plugin", "module")}
    if v.samples_ms:
        record.update(median_ms=v.median_ms, min_ms=min(v.samples_ms), max_ms=max(v.samples_ms))
    return record


def best_record(plan: Plan, variants: Sequence[Variant], best: Variant) -> dict[str, Any]:
    """What best.json holds: the winner, its flags, how to rebuild it, and every measurement."""
    return {
        "format": FORMAT,
        "winner": {**_variant_record(best), "defines": [*plan.defines, *best.flags]},
        "flags": [f"-D{f}" for f in best.flags],
        "build": {
            "sources": [{"path": s, "sha256": _sha256(Path(s))} for s in plan.sources],
            "kind": plan.kind,
            "archs": plan.archs,
            "cc": plan.cc,
            "cpu": plan.cpu,
            "include_dirs": plan.include_dirs,
            "defines": plan.defines,
            **({"target": plan.target, "program": plan.program, "spec": plan.spec, "target_options": plan.target_options} if plan.gpu else {}),
        },  # fmt: skip
        "measured": {
            "module": plan.module or best.module or "",
            "function": plan.function,
            "inputs": plan.inputs,
            "device": plan.device,
            "machine": platform.machine(),
            "host": platform.node(),
        },  # fmt: skip
        "choice": {"tied_with": [v.label for v in choose(variants)[1]], "clear": not choose(variants)[1]},
        "variants": [_variant_record(v) for v in ranked(variants)],
    }


@contextlib.contextmanager
def _quiet_steps() -> Iterator[None]:
    """The variants' own build steps unprinted (one line per variant instead), except under -v."""
    level = echo.VERBOSITY
    if level == 1:
        echo.set_verbosity(0)
    try:
        yield
    finally:
        echo.set_verbosity(level)


def log_checked(variants: Sequence[Variant]) -> None:
    for v in variants:
        echo.log_step(f"  {v.label}: {'correct' if v.status == 'ok' else v.status}" + (f" (on {v.node})" if v.node else ""))


def _sweep_locally(plan: Plan, variants: list[Variant], directory: Path, expected: Sequence[numpy.ndarray], jobs: int | None,
                   cases: Sequence[Case] = ()) -> None:  # fmt: skip
    with echo.Stopwatch(f"build and check {len(variants)} variant(s)"):
        with _quiet_steps(), processes.thread_pool(jobs) as pool:
            list(pool.map(lambda v: build_and_check(plan, v, directory, expected, cases), variants))
        log_checked(variants)
    for v in variants:
        if v.status == "ok":
            with echo.Stopwatch(f"benchmark {v.label}"), _quiet_steps():
                measure_variant(plan, v)
    with _quiet_steps():
        separate(plan, variants)


def _require_ray(plan: Plan) -> None:
    """Ray is imported here, and only here, when a sweep asks for it."""
    if plan.gpu:
        raise PyreeError(f"--ray sweeps CPU plugins; a {plan.target} kernel's variants are modules of their own, not sent through Ray yet",
                         fix="leave out --ray: the variants build in parallel here (-j) and run on this machine's device")  # fmt: skip
    try:
        importlib.import_module("ray")
    except ImportError as exc:
        raise PyreeError(f"--ray needs Ray, which cannot be imported in this Python ({exc})", fix=INSTALL_RAY) from None


def tune(
    sources: Sequence[PathLike],
    output: PathLike,
    *,
    params: Mapping[str, Sequence[str]] | Sequence[str] = (),
    module: PathLike | None = None,
    function: str,
    inputs: Sequence[str] = (),
    kind: str = "system",
    reference: PathLike | None = None,
    onnx: PathLike | None = None,
    expect_output: Sequence[str] = (),
    archs: Sequence[str] = (),
    cc: str = "zig",
    cpu: str = "baseline",
    include_dirs: Sequence[PathLike] = (),
    defines: Sequence[str] = (),
    device: str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    spread: float = 0.05,
    budget: float = 10.0,
    max_rounds: int = 20,
    repetitions: int = 3,
    build_dir: PathLike | None = None,
    jobs: int | None = None,
    ray: str | None = None,
    ray_resources: Mapping[str, float] | None = None,
    depfile: PathLike | None = None,
    target: str = "llvm-cpu",
    program: PathLike | None = None,
    spec: PathLike | None = None,
    target_options: Mapping[str, Any] | None = None,
) -> TuneResult:
    """Sweep every combination of `params` (-D values; none: the sources' `// pyree-tune:` knobs), check, benchmark, write
    `output` (best.json). `target` vulkan, cuda or hip: a GPU kernel; each variant compiles `program` with `spec`."""
    parsed = parse_params(params) if params else _declared_or_refuse(sources)
    out = Path(output)
    plan = _plan(sources, kind, module, function, inputs, archs, cc, cpu, include_dirs, defines, device, checks.DEFAULT_RTOL, checks.DEFAULT_ATOL,
                 timeout, spread, budget, max_rounds, repetitions, gpu=(target, program, spec, target_options))  # fmt: skip
    settings = dict(function=function, inputs=list(inputs), expect_output=list(expect_output), kind=kind, archs=list(archs), cc=cc, cpu=cpu,
                    defines=list(defines), device=plan.device, rtol=rtol, atol=atol, spread=spread, budget=budget, max_rounds=max_rounds,
                    repetitions=repetitions, **({"target": target, "target_options": plan.target_options} if plan.gpu else {}))  # fmt: skip
    key = _content_key(plan.sources, include_dirs, parsed, plan.module or plan.program, reference, onnx, settings, plan.spec)
    if (done := _up_to_date(out, key)) is not None:
        return done
    directory = Path(build_dir) if build_dir is not None else out.parent / f"{out.stem}.variants"
    if ray is not None:
        _require_ray(plan)
    variants = variants_of(parsed)
    _build_where_no_device(plan, variants, directory, jobs)
    plan, expected, cases = _references(plan, directory, reference, onnx, expect_output, rtol, atol)
    if ray is not None:
        _tune_ray.sweep(plan, variants, expected, address=ray, resources=dict(ray_resources or {}), directory=directory)
    else:
        _sweep_locally(plan, variants, directory, expected, jobs, cases)
    result = _finish(plan, variants, out, expected, cases, key)
    _write_depfile(depfile, out, plan, [r for r in (reference, onnx) if r is not None])
    return result


def _references(plan: Plan, directory: Path, reference: PathLike | None, onnx: PathLike | None, expect_output: Sequence[str], rtol: float | None,
                atol: float | None) -> tuple[Plan, list[numpy.ndarray], list[Case]]:  # fmt: skip
    """The results each variant must reproduce, the plan with its inputs (verify's draw where an
    ONNX model is given without them) and tolerance, and the random cases a reference module gives."""
    if onnx is not None and not plan.inputs and not expect_output and reference is None:
        plan = replace(plan, inputs=drawn_inputs(onnx, directory / "inputs"))
    expected = expected_outputs(plan, reference=reference, onnx=onnx, expect_output=expect_output)
    checked_rtol, checked_atol = tolerance(rtol, atol, expected, computed=not expect_output)
    plan = replace(plan, rtol=checked_rtol, atol=checked_atol)
    return plan, expected, random_cases(plan, reference, directory) if reference is not None else []


def _build_where_no_device(plan: Plan, variants: list[Variant], directory: Path, jobs: int | None) -> None:
    """A GPU tune on a machine without the target's device: every variant built and compiled
    (a kernel or spec that does not build is found here too), then the error that says so."""
    if not plan.gpu or _tune_gpu.device_usable(plan.target, plan.device):
        return
    with echo.Stopwatch(f"build {len(variants)} variant(s)"), _quiet_steps(), processes.thread_pool(jobs) as pool:
        list(pool.map(lambda v: _build_only(plan, v, directory), variants))
    failed = [v for v in variants if v.status == BUILD_FAILED]
    if failed:
        raise PyreeError(f"{len(failed)} variant(s) of {Path(plan.sources[0]).name} did not build", file=plan.sources[0], details=render(variants),
                         fix="fix the kernel or the spec (each variant's reason is above)")  # fmt: skip
    _tune_gpu.require_device(plan.target, plan.device, len(variants), directory)


def _build_only(plan: Plan, variant: Variant, directory: Path) -> Variant:
    try:
        build_variant(plan, variant, directory)
    except PyreeError as error:
        variant.status, variant.reason = BUILD_FAILED, error.what
    return variant


def _write_depfile(depfile: PathLike | None, out: Path, plan: Plan, references: Sequence[PathLike]) -> None:
    """CMake: a changed source, header, module or reference tunes again (unless its bytes are the same: _up_to_date)."""
    if depfile is None:
        return
    inputs = [*plan.sources, *map(str, included_files(map(Path, plan.sources), plan.include_dirs)), *filter(None, (plan.module, plan.program, plan.spec))]
    files.write_depfile(depfile, out, [*inputs, *(os.fspath(r) for r in references)])


def tolerance(rtol: float | None, atol: float | None, expected: Sequence[numpy.ndarray], *, computed: bool) -> tuple[float, float]:
    """The check's tolerance: what the caller gave; else, against results another implementation
    computed (a reference module, onnxruntime), verify's: 1e-4 relative and 1e-5 times the largest
    float magnitude absolute, since a sum taken in another order (IREE's code, a tiled kernel)
    differs in its last bits, more the longer it is; against values given (--expect-output), 1e-5
    and 1e-8."""
    floats = [np.asarray(a) for a in expected if np.asarray(a).dtype.kind in "fc" and np.asarray(a).size]
    if not computed or not floats:
        return (checks.DEFAULT_RTOL if rtol is None else rtol, checks.DEFAULT_ATOL if atol is None else atol)
    # One tolerance for the kernel's outputs: the loosest of checks' rule for each (one output, as
    # a replaced group has, is held to exactly what verify holds it to).
    per_output = [checks.computed_tolerance(a, rtol, atol) for a in floats]
    return max(r for r, _ in per_output), max(a for _, a in per_output)


def _declared_or_refuse(sources: Sequence[PathLike] | PathLike) -> dict[str, list[str]]:
    declared = declared_params(sources)
    if not declared:
        raise PyreeError(
            "nothing to tune: no --param given, and the source declares no knob",
            file=os.fspath(sources) if isinstance(sources, (str, os.PathLike)) else None,
            fix="pass --param TILE=1,2,4,8, or declare the knob in the source: a line `// pyree-tune: TILE=1,2,4,8` (replace writes them)",
        )
    return declared


def _plan(sources: Sequence[PathLike], kind: str, module: PathLike | None, function: str, inputs: Sequence[str], archs: Sequence[str], cc: str,
          cpu: str, include_dirs: Sequence[PathLike], defines: Sequence[str], device: str | None, rtol: float, atol: float, timeout: float,
          spread: float, budget: float, max_rounds: int, repetitions: int,
          gpu: tuple[str, PathLike | None, PathLike | None, Mapping[str, Any] | None] = ("llvm-cpu", None, None, None)) -> Plan:  # fmt: skip
    target, program, spec, target_options = gpu
    srcs = [str(require_file(s, "kernel source").resolve()) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    if kind not in ("system", "standalone"):
        raise PyreeError(f"unknown plugin kind '{kind}'", fix="use --kind system or --kind standalone")
    for name, value in (("--timeout", timeout), ("--budget", budget)):
        if not value > 0:
            raise PyreeError(f"{name} must be a positive number of seconds, got {value}", fix=f"e.g. {name} 10")
    if not spread >= 0 or max_rounds < 1 or repetitions < 1:
        raise PyreeError("--spread must be >= 0, --max-rounds and --repetitions >= 1", fix="e.g. --spread 0.05 --max-rounds 20 --repetitions 3")
    checks.parse_inputs(inputs)
    where = dict(target=target, program="", spec="", target_options=dict(target_options or {}))
    if target != _tune_gpu.CPU:
        if kind != "system" or archs:
            raise PyreeError(f"--kind and --arch are a CPU plugin's; a {target} kernel is built for its GPU", fix="leave them out with --target")
        where["target_options"] = _tune_gpu.check_options(target, target_options or {})
        where["program"], where["spec"] = _tune_gpu.check_inputs(target, program, spec, module, srcs)
        mod, device = "", _tune_gpu.device_of(target, device)
    else:
        if module is None:
            raise PyreeError("tune needs --module: the program that calls the kernel's import",
                             fix="pyree-build tune SRC.c --module M.vmfb --function F --reference REF.vmfb -o best.json")  # fmt: skip
        mod, device = str(require_file(module, "module").resolve()), device or "local-sync"
    return Plan(srcs, kind, mod, function, list(inputs), list(archs), cc, cpu, [str(Path(d).resolve()) for d in include_dirs],
                list(defines), device, rtol, atol, timeout, spread, budget, max_rounds, repetitions, **where)  # type: ignore[arg-type]  # fmt: skip


def _recheck_winner(plan: Plan, variants: list[Variant], expected: Sequence[numpy.ndarray], cases: Sequence[Case]) -> Variant | None:
    """The fastest variant that is still right when checked again after its benchmark (a
    kernel can go wrong after many calls); one that is not is marked wrong and the next tried."""
    while True:
        best, _ = choose(variants)
        if best is None:
            return None
        if best.runs_with is None or not Path(best.runs_with).is_file():  # built on another node (Ray): checked there
            return best
        status, why = check_variant(plan, best.runs_with, expected, cases)
        if status == "ok":
            return best
        best.status, best.reason = status, f"after its benchmark: {why}"


def _content_key(sources: Sequence[PathLike], include_dirs: Sequence[PathLike], params: Mapping[str, Sequence[str]], module: PathLike,
                 reference: PathLike | None, onnx: PathLike | None, settings: Mapping[str, object], spec: PathLike = "") -> str:  # fmt: skip
    """What a tune's result depends on, by content: the sources and the headers they include,
    the module (a GPU kernel's: the program and the spec), the reference, the parameters and
    every setting (the device as resolved; the target only for a GPU kernel, so a CPU tune's key
    is the one it had before GPU kernels and its best.json stays up to date). Equal keys: the
    same sweep."""
    named = [*map(Path, sources), *included_files(map(Path, sources), [os.fspath(d) for d in include_dirs]), Path(module)]
    named += [Path(spec)] if spec else []
    named += [Path(r) for r in (reference, onnx) if r is not None and Path(r).is_file()]
    digest = hashlib.sha256(json.dumps({"params": params, "settings": settings, "reference": os.fspath(reference or "")}, sort_keys=True,
                                       default=str).encode())  # fmt: skip
    for path in named:
        digest.update(f"\0{path.name}\0{_sha256(path) if path.is_file() else '-'}".encode())
    return digest.hexdigest()


def _up_to_date(out: Path, key: str) -> TuneResult | None:
    """The result already at `out` when it was tuned from the same content (a `touch` of a source
    re-runs the command in a build, not the sweep); its time is renewed so the build is satisfied."""
    try:
        record = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("key") != key or not isinstance(record.get("winner"), dict):
        return None
    os.utime(out)
    best = Variant(dict(record["winner"].get("params", {})), status="ok")
    note = f"{out} is up to date: tuned from these same sources, module and settings; not tuned again (best {best.label})"
    return TuneResult([best], best, out, note)


def _finish(plan: Plan, variants: list[Variant], out: Path, expected: Sequence[numpy.ndarray], cases: Sequence[Case] = (),
            key: str = "") -> TuneResult:  # fmt: skip
    best = _recheck_winner(plan, variants, expected, cases)
    rows = ranked(variants)
    if best is None:
        raise PyreeError(
            f"no variant of {Path(plan.sources[0]).name} both computed the right result and was measured",
            file=plan.sources[0],
            details=render(variants),
            fix="fix the kernel (each variant's reason is above), or check the reference",
        )
    with files.atomic_output(out) as tmp:
        tmp.write_text(json.dumps({**best_record(plan, variants, best), "key": key}, indent=2) + "\n", encoding="utf-8")
    return TuneResult(rows, best, out)


def read_best(tuned: PathLike) -> dict[str, Any]:
    """best.json, checked to be one a tune wrote."""
    path = require_file(tuned, "tune result")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise PyreeError(f"not a tune result: {exc}", file=path, fix="write it with `pyree-build tune ... -o best.json`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("winner", {}).get("params"), dict):
        raise PyreeError(f"not a tune result (format {FORMAT} expected)", file=path, fix="write it with `pyree-build tune ... -o best.json`")
    return data


def tuned_defines(tuned: PathLike) -> list[str]:
    """The winner's parameter values as -D definitions (`TILE=4`), to add to a build's own,
    checked as --param checks them: best.json is a file anyone may have edited, and a name
    such as `f(p)` or one holding a line break would define a function or add lines."""
    params = read_best(tuned)["winner"]["params"]
    try:
        checked = parse_params({name: [value] for name, value in params.items()})
    except PyreeError as error:
        raise PyreeError(
            f"not a tune result: {error.what}", file=tuned, fix="tune again (`pyree-build tune ... -o best.json`), or fix the winner's params"
        ) from None
    return [f"{name}={values[0]}" for name, values in checked.items()]


def build_tuned(
    sources: Sequence[PathLike],
    output: PathLike,
    *,
    tuned: PathLike,
    kind: str = "system",
    archs: Sequence[str] = (),
    cc: str = "zig",
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
    cpu: str = "baseline",
    target: str = "llvm-cpu",
    spec: PathLike | None = None,
    target_options: Mapping[str, Any] | None = None,
) -> Path:
    """Build the plugin with the variant a tune chose (CMake: pyree_cpu_plugin(... TUNED best.json)).
    `target` vulkan, cuda or hip: the kernel's object into the directory `output` (and the spec
    there, where the winner's differs: the block size CUDA and HIP launch)."""
    data = read_best(tuned)
    if target != _tune_gpu.CPU:
        return _apply_gpu(sources, output, data, tuned=tuned, target=target, spec=spec, include_dirs=include_dirs, defines=defines, depfile=depfile,
                          options=target_options)  # fmt: skip
    recorded = {Path(s["path"]).name: s.get("sha256") for s in data.get("build", {}).get("sources", [])}
    for src in sources:
        digest = recorded.get(Path(src).name)
        if digest is not None and Path(src).is_file() and digest != _sha256(Path(src)):
            echo.log_step(f"note: {tuned} was tuned for another version of {Path(src).name}; its choice may no longer be the fastest (tune again)")
    out = plugin_action.plugin(
        sources, output, kind=kind, archs=archs, cc=cc, include_dirs=include_dirs, defines=[*defines, *tuned_defines(tuned)], depfile=depfile,
        jobs=jobs, cpu=cpu,
    )  # fmt: skip
    if depfile is not None:  # a new tune rebuilds the plugin
        deps = files.parse_depfile(depfile)
        files.write_depfile(depfile, out, [*deps, str(Path(tuned).resolve())])
    return out


def _apply_gpu(sources: Sequence[PathLike], output: PathLike, data: Mapping[str, Any], *, tuned: PathLike, target: str, spec: PathLike | None,
               include_dirs: Sequence[str], defines: Sequence[str], depfile: PathLike | None, options: Mapping[str, Any] | None) -> Path:  # fmt: skip
    build = data.get("build", {})
    if build.get("target", _tune_gpu.CPU) != target:
        raise PyreeError(f"{tuned} was tuned for {build.get('target', 'the CPU')}, not {target}", file=tuned,
                         fix=f"apply it with --target {build.get('target', 'llvm-cpu')}, or tune the {target} kernel")  # fmt: skip
    spec_path = spec if spec is not None else build.get("spec")
    if not spec_path:
        raise PyreeError(f"applying a {target} tune needs the spec", file=tuned, fix="pass --spec DIR/spec.mlir")
    source = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    written = _tune_gpu.apply(source[0], output, target=target, spec=require_file(spec_path, "transform spec"), defines=[*defines, *tuned_defines(tuned)],
                              include_dirs=include_dirs, options=_tune_gpu.check_options(target, options or build.get("target_options") or {}))  # fmt: skip
    if depfile is not None:  # a new tune, or an edited kernel or spec, builds the object again
        files.write_depfile(depfile, written[0], [*source, os.fspath(spec_path), str(Path(tuned).resolve())], written)
    return written[0]


def materialize(blobs: Mapping[str, bytes], root: PathLike | None = None) -> Path:
    """Files (relative name -> bytes) written under a directory named by their content, the same
    path on every machine: a build there has the same cache key everywhere (the remote cache
    shares it). Used by the Ray tasks; written once, atomically."""
    digest = hashlib.sha256()
    for name in sorted(blobs):
        digest.update(name.encode() + b"\0" + hashlib.sha256(blobs[name]).digest())
    base = Path(root) if root is not None else Path(tempfile.gettempdir()) / "pyree-tune"
    directory = base / digest.hexdigest()[:24]
    for name, data in blobs.items():
        path = directory / name
        if not path.is_file() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            with files.atomic_output(path) as tmp:
                tmp.write_bytes(data)
    return directory
