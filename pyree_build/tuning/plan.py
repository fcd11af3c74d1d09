"""What a tune sweeps and with what: the plan every variant is built, checked and timed by (`Plan`,
checked by `make_plan`), a variant and its outcome (`Variant`, `classify`), and the other inputs
a variant must also get right (`Case`). The data every other module of the sweep shares.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyree_build.actions import checks
from pyree_build.core import lazy
from pyree_build.core.errors import PyreeError, require_file

_tune_gpu = lazy.module("pyree_build.tuning.gpu")

PathLike = str | os.PathLike[str]

DEFAULT_TIMEOUT_S = 60.0

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
    # The module's other plugins (a model's other replaced kernels): loaded with every variant,
    # before it, so that the variant's own import is the one IREE resolves (the last parsed).
    plugins: list[str] = field(default_factory=list)

    @property
    def gpu(self) -> bool:
        return self.target != _tune_gpu.CPU

    @property
    def suffix(self) -> str:
        return ".sos" if self.kind == "standalone" and len(self.archs) > 1 else ".so"


# The order of a variant built as the sources are written: before every declared one.
AS_WRITTEN_ORDER = -1


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
    alternated: bool = False  # its rounds are ones it ran in turn with the kernel as written (benchmarks.confirm)

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


@dataclass(frozen=True)
class Case:
    """Other inputs a variant must also get right, with the reference's results for them."""

    inputs: list[str]
    expected: list[Any]


def classify(error: PyreeError) -> str:
    """What a failed run of a variant was: a hang (the timeout) or a crash."""
    return HUNG if "timed out" in error.what else CRASHED


def runs_with(plan: Plan, built: PathLike) -> tuple[str, list[str]]:
    """The module a variant runs with and the plugins it loads: the shared module and the
    variant's plugin (CPU), or the variant's own module (a GPU kernel, embedded in it)."""
    return (os.fspath(built), []) if plan.gpu else (plan.module, [*plan.plugins, os.fspath(built)])


def make_plan(sources: Sequence[PathLike], kind: str, module: PathLike | None, function: str, inputs: Sequence[str], archs: Sequence[str], cc: str,
              cpu: str, include_dirs: Sequence[PathLike], defines: Sequence[str], device: str | None, rtol: float, atol: float, timeout: float,
              spread: float, budget: float, max_rounds: int, repetitions: int,
              gpu: tuple[str, PathLike | None, PathLike | None, Mapping[str, Any] | None] = ("llvm-cpu", None, None, None),
              plugins: Sequence[PathLike] = ()) -> Plan:  # fmt: skip
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
        if plugins:
            raise PyreeError(f"--plugin loads CPU plugins beside each variant; a {target} kernel's variants are modules of their own",
                             fix="leave out --plugin with --target")  # fmt: skip
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
                list(defines), device, rtol, atol, timeout, spread, budget, max_rounds, repetitions, **where,  # type: ignore[arg-type]
                plugins=[str(require_file(p, "plugin (--plugin)").resolve()) for p in plugins])  # fmt: skip
