"""Microbenchmarks with iree-benchmark-module: one module, or several compared side by side.

A comparison alternates its sides (a module, and the plugins that side alone loads) for
several rounds in one process tree, so drift in clock speed or load hits all alike, and
reports each side's median over the first's with the spread of the per-round ratios.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyree_build.actions import checks
from pyree_build.actions.run import (
    DEFAULT_RUN_TIMEOUT_S,
    check_timeout,
    crash_hint,
    explain_run_failure,
    plugin_flag,
    require_device,
)
from pyree_build.backends.llvm_cpu import cpus
from pyree_build.core import echo, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Timing:
    name: str  # the benchmark, e.g. BM_main/process_time/real_time
    mean_ms: float
    median_ms: float
    stddev_ms: float
    repetitions: int


@dataclass(frozen=True)
class BenchResult:
    module: Path
    timings: list[Timing]

    def render(self) -> str:
        lines = [f"{self.module}", f"  {'benchmark':<48} {'mean':>12} {'median':>12} {'stddev':>10}"]
        for t in self.timings:
            lines.append(f"  {t.name:<48} {_fmt(t.mean_ms):>12} {_fmt(t.median_ms):>12} {_fmt(t.stddev_ms):>10}")
        return "\n".join(lines)


@dataclass(frozen=True)
class CompareResult:
    a: Path
    b: Path
    a_median_ms: float
    b_median_ms: float
    ratio: float  # b_median_ms / a_median_ms: the two medians printed above it
    ratio_min: float  # spread: the smallest and largest B/A of one round
    ratio_max: float
    rounds: int
    a_plugins: tuple[str, ...] = ()  # each side's own plugins (besides those both load)
    b_plugins: tuple[str, ...] = ()

    def render(self) -> str:
        return (
            f"A {_side(self.a, self.a_plugins)}: median {_fmt(self.a_median_ms)}\n"
            f"B {_side(self.b, self.b_plugins)}: median {_fmt(self.b_median_ms)}\n"
            f"B/A = {self.ratio:.3f}  (median B / median A; per-round B/A {self.ratio_min:.3f} to {self.ratio_max:.3f}, "
            f"{self.rounds} rounds)"
        )


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a module and the plugins only it loads, with its times."""

    module: Path
    plugins: tuple[str, ...] = ()
    median_ms: float = 0.0
    ratio: float = 1.0  # median / the first side's median
    ratio_min: float = 1.0  # the smallest and largest per-round ratio to the first side
    ratio_max: float = 1.0


@dataclass(frozen=True)
class ManyResult:
    """An N-way comparison: every side's median and its ratio to the first's."""

    sides: list[Side]
    rounds: int

    def render(self) -> str:
        lines = []
        for k, side in enumerate(self.sides, 1):
            line = f"{k} {_side(side.module, side.plugins)}: median {_fmt(side.median_ms)}"
            if k > 1:
                line += f"  {k}/1 = {side.ratio:.3f}  (per round {side.ratio_min:.3f} to {side.ratio_max:.3f})"
            lines.append(line)
        return "\n".join([*lines, f"each ratio is a median over the first's; {self.rounds} rounds, the sides in turn in each"])


def _side(module: Path, plugins: Sequence[str]) -> str:
    return f"{module}" + (f" with {', '.join(plugins)}" if plugins else "")


def parse_side(text: str) -> tuple[str, list[str]]:
    """`M.vmfb` or `M.vmfb:P1.so[,P2.so]`: a module and the plugins that side alone loads. A
    module whose own path holds a ':' is taken whole when it exists as written."""
    module, sep, plugins = text.partition(":")
    if not sep or os.path.exists(text):
        return text, []
    named = [p for p in plugins.split(",") if p]
    if not named:
        raise PyreeError(f"'{text}' names no plugin after ':'", fix="write MODULE.vmfb:PLUGIN.so[,PLUGIN2.so], or the module alone")
    return module, named


def summarize(a: PathLike, b: PathLike, a_times: Sequence[float], b_times: Sequence[float]) -> CompareResult:
    """The ratio is that of the printed medians, so a reader can check it; the rounds give its spread."""
    ratios = [bt / at for at, bt in zip(a_times, b_times) if at > 0]
    a_median = statistics.median(a_times)
    if not ratios or a_median <= 0:
        raise PyreeError("module A measured no time", file=a)
    b_median = statistics.median(b_times)
    return CompareResult(Path(a), Path(b), a_median, b_median, b_median / a_median, min(ratios), max(ratios), len(a_times))


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.2f} us" if ms < 1 else f"{ms:.3f} ms"


_UNIT_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0}


def parse_benchmark_json(text: str, *, module: PathLike) -> list[Timing]:
    """Aggregate records (mean, median, stddev) per benchmark from --benchmark_format=json."""
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else {}
    except ValueError as exc:
        raise PyreeError(f"iree-benchmark-module printed no readable JSON ({exc})", file=module, details=text[-2000:]) from None
    runs: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for record in data.get("benchmarks", []):
        name = record.get("run_name", record.get("name", "?"))
        scale = _UNIT_TO_MS.get(record.get("time_unit", "ns"), 1e-6)
        if record.get("run_type") == "aggregate":
            runs.setdefault(name, {})[record.get("aggregate_name", "")] = float(record["real_time"]) * scale
        else:
            counts[name] = counts.get(name, 0) + 1
            runs.setdefault(name, {}).setdefault("_single", float(record["real_time"]) * scale)
    timings = []
    for name, values in runs.items():
        single = values.get("_single", 0.0)
        timings.append(Timing(name, values.get("mean", single), values.get("median", single), values.get("stddev", 0.0), counts.get(name, 1)))
    if not timings:
        raise PyreeError("iree-benchmark-module reported no benchmarks", file=module, details=text[-2000:],
                         fix="check --function; a dumped _benchmark.mlir has one function per dispatch")  # fmt: skip
    return timings


def _argv(module: Path, function: str | None, inputs: Sequence[str], plugins: Sequence[PathLike], device: str, repetitions: int, min_time: float) -> list[str]:
    checks.parse_inputs(inputs)
    args = [f"--module={module}", f"--device={device}", "--benchmark_format=json", f"--benchmark_repetitions={repetitions}",
            f"--benchmark_min_time={min_time}s"]  # fmt: skip
    if function:
        args.append(f"--function={function}")
    args += [f"--input={i}" for i in inputs]
    args += [f"--executable_plugin={plugin_flag(p)}" for p in plugins]
    return toolchain.iree_benchmark_module().command(*args)


def _explain_failure(output: str) -> str:
    """The tool's message and run's hints, without the benchmark JSON printed before it failed."""
    cut = output.find("\n{")
    message = output[:cut] if cut >= 0 else output
    return explain_run_failure(message) or message


def bench(
    module: PathLike,
    function: str | None = None,
    *,
    inputs: Sequence[str] = (),
    plugins: Sequence[PathLike] = (),
    device: str = "local-sync",
    repetitions: int = 5,
    min_time: float = 0.1,
    skip_unavailable: bool = False,
    timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
) -> BenchResult:
    """Time `function` (or every function) of a module; mean and median per benchmark.

    iree-benchmark-module is stopped after `timeout` seconds (a plugin that loops)."""
    mod = require_file(module, "module")
    if repetitions < 1:
        raise PyreeError("--repetitions must be at least 1", fix="pass --repetitions 5, for example")
    with processes.time_limit(check_timeout(timeout)):  # one bound for the whole command: the device probe too
        require_device(device, skip_unavailable=skip_unavailable, module=mod)
        cpus.note_mismatches(mod, plugins)  # a time measured with a baseline plugin in a host module is said to be one
        return _bench_bounded(mod, function, inputs, plugins, device, repetitions, min_time, timeout)


def _bench_bounded(
    mod: Path,
    function: str | None,
    inputs: Sequence[str],
    plugins: Sequence[PathLike],
    device: str,
    repetitions: int,
    min_time: float,
    timeout: float | None,
) -> BenchResult:
    argv = _argv(mod, function, inputs, plugins, device, repetitions, min_time)
    # The JSON goes to a file of its own: a plugin that prints to stdout would split it.
    with tempfile.TemporaryDirectory(prefix="pyree-bench.") as tmp:
        report = Path(tmp) / "benchmark.json"
        argv += [f"--benchmark_out={report}", "--benchmark_out_format=json"]
        with echo.Stopwatch(f"iree-benchmark-module {mod.name}"):
            result = processes.spawn(
                argv, what=f"benchmarking {mod.name}", file=mod, fix="run it with `pyree-build run` first to see that it works",
                explain=_explain_failure, timeout=timeout, crash_hint=crash_hint(plugins), runs_user_code=bool(plugins),
            )  # fmt: skip
        text = report.read_text(encoding="utf-8", errors="replace") if report.is_file() else result.stdout
    return BenchResult(mod, parse_benchmark_json(text, module=mod))


def compare(
    a: PathLike,
    b: PathLike,
    function: str | None = None,
    *,
    inputs: Sequence[str] = (),
    plugins: Sequence[PathLike] = (),
    plugins_a: Sequence[PathLike] = (),
    plugins_b: Sequence[PathLike] = (),
    device: str = "local-sync",
    repetitions: int = 3,
    rounds: int = 5,
    min_time: float = 0.1,
    skip_unavailable: bool = False,
    timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
) -> CompareResult:
    """Alternate A and B `rounds` times; the ratio B/A of their medians, per round. `plugins`
    load on both sides, `plugins_a` / `plugins_b` on one only (one module and two plugins: an
    A/B of two builds of a kernel)."""
    a_times, b_times = _alternate([(a, plugins_a), (b, plugins_b)], function, inputs, plugins, device, repetitions, rounds, min_time,
                                  skip_unavailable, timeout)  # fmt: skip
    result = summarize(a, b, a_times, b_times)
    return dataclasses.replace(result, a_plugins=tuple(str(p) for p in plugins_a), b_plugins=tuple(str(p) for p in plugins_b))


def compare_many(
    sides: Sequence[tuple[PathLike, Sequence[PathLike]]],
    function: str | None = None,
    *,
    inputs: Sequence[str] = (),
    plugins: Sequence[PathLike] = (),
    device: str = "local-sync",
    repetitions: int = 3,
    rounds: int = 5,
    min_time: float = 0.1,
    skip_unavailable: bool = False,
    timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
) -> ManyResult:
    """Each side (a module, the plugins it alone loads) timed in turn, `rounds` times; every
    side's median and its ratio to the first side's."""
    if len(sides) < 2:
        raise PyreeError(f"a comparison takes at least two sides, got {len(sides)}", fix="pyree-build bench --compare A.vmfb B.vmfb ...")
    times = _alternate(sides, function, inputs, plugins, device, repetitions, rounds, min_time, skip_unavailable, timeout)
    first = statistics.median(times[0])
    if first <= 0:
        raise PyreeError("the first side measured no time", file=sides[0][0])
    out = []
    for (module, own), t in zip(sides, times):
        per_round = [x / f for f, x in zip(times[0], t) if f > 0]
        median = statistics.median(t)
        out.append(Side(Path(module), tuple(str(p) for p in own), median, median / first, min(per_round), max(per_round)))
    return ManyResult(out, rounds)


def _alternate(
    sides: Sequence[tuple[PathLike, Sequence[PathLike]]], function: str | None, inputs: Sequence[str], plugins: Sequence[PathLike],
    device: str, repetitions: int, rounds: int, min_time: float, skip_unavailable: bool, timeout: float | None,
) -> list[list[float]]:  # fmt: skip
    """Each side's time (the sum of its benchmarks' medians) in each round, the sides in turn
    within a round, so drift in clock speed or load reaches all of them alike."""
    if rounds < 1:
        raise PyreeError("--rounds must be at least 1", fix="pass --rounds 5, for example")
    for k, (module, own) in enumerate(sides):
        require_file(module, f"module {'AB'[k] if len(sides) == 2 else k + 1}")
        for plugin in own:
            require_file(plugin, "plugin")
    require_device(device, skip_unavailable=skip_unavailable)
    times: list[list[float]] = [[] for _ in sides]
    for _ in range(rounds):
        for (module, own), side_times in zip(sides, times):
            result = bench(module, function, inputs=inputs, plugins=[*plugins, *own], device=device, repetitions=repetitions,
                           min_time=min_time, timeout=timeout)  # fmt: skip
            side_times.append(sum(t.median_ms for t in result.timings))
    return times
