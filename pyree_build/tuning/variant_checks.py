"""One variant built and checked: its plugin (a GPU kernel's object and module) built through the
plugin action, its results compared with the reference's (the comparison rule of actions/checks),
its function called several times in one process (tuning/calls.py) and with random inputs. A wrong
result, a crash or a hang is the variant's status, never an error of the tune.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyree_build.actions import checks
from pyree_build.actions import run as run_action
from pyree_build.backends.llvm_cpu import plugins as plugin_action
from pyree_build.core import echo, lazy, processes
from pyree_build.core.errors import PyreeError
from pyree_build.tuning.plan import AS_WRITTEN_ORDER, BUILD_FAILED, WRONG, Case, PathLike, Plan, Variant, classify, runs_with

if TYPE_CHECKING:
    import numpy

np = lazy.module("numpy")
_tune_gpu = lazy.module("pyree_build.tuning.gpu")


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


def as_written_first(plan: Plan, variants: Sequence[Variant], directory: Path) -> None:
    """The variants whose plugin is, byte for byte, the sources' own build (every swept macro at
    the value the source picks for this CPU, an `#if defined(__AVX512F__)` default included) go
    first in the declared order: among variants noise cannot tell apart they win, so a tune on a
    noisy machine keeps the kernel as written, not the first value a declaration lists. A GPU
    kernel's variants keep the declared order (each is a module of its own, compiled anew), as do
    the variants of sources that do not build without the swept -Ds (a knob with no default)."""
    if plan.gpu or not any(v.status == "ok" and v.plugin for v in variants):
        return
    try:
        as_written = build_variant(plan, Variant({}), directory)
    except PyreeError:
        return
    mark_as_written(variants, as_written.read_bytes())


def mark_as_written(variants: Sequence[Variant], as_written: bytes) -> None:
    """as_written_first's rule, given the bytes of the sources' own build (made where the
    variants were: a plugin names the path of the source it was built from)."""
    for v in variants:
        if v.status == "ok" and v.plugin and Path(v.plugin).is_file() and Path(v.plugin).read_bytes() == as_written:
            v.order = AS_WRITTEN_ORDER


# Each check calls the function this many times in one process: a variant right on its first
# call only (state kept between calls) is wrong, and must never be chosen.
CHECK_CALLS = 3


# What the child process of the repeated calls may take beyond the calls (Python, numpy and
# iree.runtime starting on a loaded machine): a slow start must never read as a hang.
_START_ALLOWANCE_S = 30.0


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
    status, why = compare(plan, plugin, outputs, expected)
    if status != "ok":
        return status, why
    if not plan.gpu:
        return _check_repeated_calls(plan, plugin, expected, cases)
    return _check_cases_by_runs(plan, module, cases)


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
        status, why = compare(plan, module, outputs, case.expected)
        if status != "ok":
            return status, f"random inputs {' '.join(case.inputs)}: {why}"
    return "ok", ""


def _check_repeated_calls(plan: Plan, plugin: PathLike, expected: Sequence[numpy.ndarray], cases: Sequence[Case]) -> tuple[str, str]:
    calls = [Case(plan.inputs, list(expected))] * CHECK_CALLS + list(cases)
    with tempfile.TemporaryDirectory(prefix="pyree-tune-check.") as tmp:
        spec = {"module": plan.module, "function": plan.function, "device": plan.device, "plugins": [*plan.plugins, os.fspath(plugin)], "out": tmp,
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
            status, why = compare(plan, plugin, outputs, case.expected)
            if status != "ok" and call < CHECK_CALLS:
                return status, f"call {call + 1} of {CHECK_CALLS} in one process: {why}"
            if status != "ok":
                return status, f"random inputs {' '.join(case.inputs)}: {why}"
    return "ok", ""


def compare(plan: Plan, plugin: PathLike, outputs: Sequence[numpy.ndarray], expected: Sequence[numpy.ndarray]) -> tuple[str, str]:
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


def build_only(plan: Plan, variant: Variant, directory: Path) -> Variant:
    try:
        build_variant(plan, variant, directory)
    except PyreeError as error:
        variant.status, variant.reason = BUILD_FAILED, error.what
    return variant


def log_checked(variants: Sequence[Variant]) -> None:
    for v in variants:
        echo.log_step(f"  {v.label}: {'correct' if v.status == 'ok' else v.status}" + (f" (on {v.node})" if v.node else ""))
