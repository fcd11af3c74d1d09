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

This module is the sweep's order of steps; each step is a module of its own: the plan and its
variants (plan.py), the knobs (params.py), the expected results and tolerance (references.py),
a variant's build and check (variant_checks.py), its benchmark (benchmarks.py), the choice
among variants (choice.py), best.json and the content key (records.py), and a tune applied to
a build (apply.py). The names `pb.tune` offers besides the verb (`pb.tune.build_tuned`, ...)
are imported here from those modules.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyree_build.actions import checks
from pyree_build.core import echo, files, lazy, processes
from pyree_build.core.errors import PyreeError
from pyree_build.core.outputs import included_files
from pyree_build.tuning.apply import build_tuned, tuned_defines
from pyree_build.tuning.benchmarks import confirm, measure_variant, separate
from pyree_build.tuning.choice import choose, ranked, render
from pyree_build.tuning.params import declared_or_refuse, declared_params, parse_params, variants_of
from pyree_build.tuning.plan import BUILD_FAILED, DEFAULT_TIMEOUT_S, Case, PathLike, Plan, Variant, make_plan
from pyree_build.tuning.records import FORMAT, content_key, read_best, recorded_winner, write_best
from pyree_build.tuning.references import prepare
from pyree_build.tuning.variant_checks import as_written_first, build_and_check, build_only, check_variant, log_checked

if TYPE_CHECKING:
    import numpy

_tune_ray = lazy.module("pyree_build.tuning.on_ray")
_tune_gpu = lazy.module("pyree_build.tuning.gpu")

# What `pb.tune.NAME` reaches besides the verb: a tune's result and records, applied to a build.
__all__ = ["FORMAT", "Plan", "TuneResult", "Variant", "build_tuned", "declared_params", "parse_params", "read_best", "tune", "tuned_defines"]

INSTALL_RAY = 'pip install "pyree_build[ray]"'


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
    plugins: Sequence[PathLike] = (),
) -> TuneResult:
    """Sweep every combination of `params` (-D values; none: the sources' knobs, in their stages:
    params.declared_stages), check, benchmark, write `output` (best.json). `plugins`: the module's
    other plugins, loaded with every variant. `target` vulkan, cuda or hip: a GPU kernel; each variant compiles `program` with `spec`."""
    stages = [parse_params(params)] if params else declared_or_refuse(sources)
    parsed = {name: values for stage in stages for name, values in stage.items()}
    out = Path(output)
    plan = make_plan(sources, kind, module, function, inputs, archs, cc, cpu, include_dirs, defines, device, checks.DEFAULT_RTOL, checks.DEFAULT_ATOL,
                     timeout, spread, budget, max_rounds, repetitions, gpu=(target, program, spec, target_options), plugins=plugins)  # fmt: skip
    settings = dict(function=function, inputs=list(inputs), expect_output=list(expect_output), kind=kind, archs=list(archs), cc=cc, cpu=cpu,
                    defines=list(defines), device=plan.device, rtol=rtol, atol=atol, spread=spread, budget=budget, max_rounds=max_rounds,
                    repetitions=repetitions, stages=[list(stage) for stage in stages],
                    **({"target": target, "target_options": plan.target_options} if plan.gpu else {}))  # fmt: skip
    key = content_key(plan.sources, include_dirs, parsed, plan.module or plan.program, reference, onnx, settings, plan.spec, plan.plugins)
    if (result := _up_to_date(out, key)) is None:
        directory = Path(build_dir) if build_dir is not None else out.parent / f"{out.stem}.variants"
        _require_ray(plan, ray)
        variants = variants_of(stages[0])
        _build_where_no_device(plan, variants, directory, jobs)
        plan, expected, cases = prepare(plan, directory, reference, onnx, expect_output, rtol, atol)
        variants = _sweep_stages(plan, stages, variants, directory, expected, jobs, cases, ray, ray_resources)
        result = _finish(plan, variants, out, expected, cases, key)
    _write_depfile(depfile, out, plan, [r for r in (reference, onnx) if r is not None])
    return result


def _sweep_stages(plan: Plan, stages: Sequence[Mapping[str, Sequence[str]]], first: list[Variant], directory: Path, expected: Sequence[numpy.ndarray],
                  jobs: int | None, cases: Sequence[Case], ray: str | None, ray_resources: Mapping[str, float] | None) -> list[Variant]:  # fmt: skip
    """The first stage's variants (`first`) swept, then each later knob alone at the values the
    sweep has chosen so far; every variant run, in order."""
    variants = list(first)
    for k, stage in enumerate(stages):
        if k:
            best, _ = choose(variants)
            if best is None:
                break
            batch = variants_of({**{name: [value] for name, value in best.params.items()}, **stage}, first_order=len(variants))
            variants += batch
        else:
            batch = variants
        if ray is not None:
            _tune_ray.sweep(plan, batch, expected, address=ray, resources=dict(ray_resources or {}), directory=directory)
        else:
            _sweep_locally(plan, batch, directory, expected, jobs, cases)
            with _quiet_steps():
                confirm(plan, variants)  # before a later stage sweeps around the winner
    return variants


def _up_to_date(out: Path, key: str) -> TuneResult | None:
    """The result already at `out` when it was tuned from the same content (records.recorded_winner)."""
    best = recorded_winner(out, key)
    if best is None:
        return None
    note = f"{out} is up to date: tuned from these same sources, module and settings; not tuned again (best {best.label})"
    return TuneResult([best], best, out, note)


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


def _sweep_locally(plan: Plan, variants: list[Variant], directory: Path, expected: Sequence[numpy.ndarray], jobs: int | None,
                   cases: Sequence[Case] = ()) -> None:  # fmt: skip
    with echo.Stopwatch(f"build and check {len(variants)} variant(s)"):
        with _quiet_steps(), processes.thread_pool(jobs) as pool:
            list(pool.map(lambda v: build_and_check(plan, v, directory, expected, cases), variants))
        log_checked(variants)
        as_written_first(plan, variants, directory)
    for v in variants:
        if v.status == "ok":
            with echo.Stopwatch(f"benchmark {v.label}"), _quiet_steps():
                measure_variant(plan, v)
    with _quiet_steps():
        separate(plan, variants)


def _require_ray(plan: Plan, ray: str | None) -> None:
    """Ray is imported here, and only here, when a sweep asks for it (`ray`: an address)."""
    if ray is None:
        return
    if plan.gpu:
        raise PyreeError(f"--ray sweeps CPU plugins; a {plan.target} kernel's variants are modules of their own, not sent through Ray yet",
                         fix="leave out --ray: the variants build in parallel here (-j) and run on this machine's device")  # fmt: skip
    try:
        importlib.import_module("ray")
    except ImportError as exc:
        raise PyreeError(f"--ray needs Ray, which cannot be imported in this Python ({exc})", fix=INSTALL_RAY) from None


def _build_where_no_device(plan: Plan, variants: list[Variant], directory: Path, jobs: int | None) -> None:
    """A GPU tune on a machine without the target's device: every variant built and compiled
    (a kernel or spec that does not build is found here too), then the error that says so."""
    if not plan.gpu or _tune_gpu.device_usable(plan.target, plan.device):
        return
    with echo.Stopwatch(f"build {len(variants)} variant(s)"), _quiet_steps(), processes.thread_pool(jobs) as pool:
        list(pool.map(lambda v: build_only(plan, v, directory), variants))
    failed = [v for v in variants if v.status == BUILD_FAILED]
    if failed:
        raise PyreeError(f"{len(failed)} variant(s) of {Path(plan.sources[0]).name} did not build", file=plan.sources[0], details=render(variants),
                         fix="fix the kernel or the spec (each variant's reason is above)")  # fmt: skip
    _tune_gpu.require_device(plan.target, plan.device, len(variants), directory)


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


# The start of a run's error when the module calls an import no loaded plugin exports
# (backends/llvm_cpu/imports.check_resolved): a tune of one kernel of several in a module.
_UNRESOLVED = "no plugin resolves import"
_UNRESOLVED_FIX = (
    "the module also calls the imports named above, which no variant exports: load the plugins that do with --plugin PATH "
    "(repeatable; CMake: PLUGINS; Python: plugins=), e.g. the model's other kernels as `pyree-build plugin` built them"
)


def _finish(plan: Plan, variants: list[Variant], out: Path, expected: Sequence[numpy.ndarray], cases: Sequence[Case] = (),
            key: str = "") -> TuneResult:  # fmt: skip
    best = _recheck_winner(plan, variants, expected, cases)
    rows = ranked(variants)
    if best is None:
        raise PyreeError(
            f"no variant of {Path(plan.sources[0]).name} both computed the right result and was measured",
            file=plan.sources[0],
            details=render(variants),
            fix=_UNRESOLVED_FIX
            if all(v.reason.startswith(_UNRESOLVED) for v in variants)
            else "fix the kernel (each variant's reason is above), or check the reference",
        )
    write_best(out, plan, variants, best, key)
    return TuneResult(rows, best, out)


def _write_depfile(depfile: PathLike | None, out: Path, plan: Plan, references: Sequence[PathLike]) -> None:
    """CMake: a changed source, header, module or reference tunes again (unless its bytes are the same: _up_to_date).
    Written when the result is up to date too: a tune stopped after its result and before its depfile
    is run again by Ninja (no log entry), and that run must still leave the inputs listed."""
    if depfile is None:
        return
    inputs = [*plan.sources, *map(str, included_files(map(Path, plan.sources), plan.include_dirs)), *filter(None, (plan.module, plan.program, plan.spec)),
              *plan.plugins]  # fmt: skip
    files.write_depfile(depfile, out, [*inputs, *(os.fspath(r) for r in references)])
