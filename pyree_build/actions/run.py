"""Modules run with iree-run-module: the device check before, the results (whole, never
elided) and the checks of its output after.

Which devices exist, whether one is usable here and what a failure on it means are asked
of the backend that serves the device (pyree_build.backends).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from pyree_build import backends
from pyree_build.actions import arguments, checks
from pyree_build.actions.results import (
    NPY_TENSOR,
    exported_functions,
    format_result,
    function_parameters,
    function_results,
    load_npy,
    npy_text,
    result_text,
)
from pyree_build.backends.llvm_cpu.imports import require_resolved
from pyree_build.backends.llvm_cpu.loader import EMBEDDED_PREFIX, plugin_flag
from pyree_build.core import echo, lazy, processes, reads, toolchain
from pyree_build.core.errors import PyreeError, require_file

if TYPE_CHECKING:
    import subprocess

    import numpy

np = lazy.module("numpy")

PathLike = str | os.PathLike[str]

__all__ = [
    "DEFAULT_RUN_TIMEOUT_S", "EMBEDDED_PREFIX", "SKIP_EXIT_CODE", "DeviceUnavailable", "RunResult", "check_timeout", "crash_hint",
    "explain_run_failure", "format_result", "function_results", "npy_text", "plugin_flag", "require_device", "run", "run_calls", "run_to_arrays",
]  # fmt: skip

# Exit code ctest reads as "skipped" (SKIP_RETURN_CODE), used when a test asks for a GPU
# that this machine does not have.
SKIP_EXIT_CODE = 77
# A bound on any one run or benchmark: generous, yet a plugin that loops (or waits on
# something that never comes) ends the run with a message instead of hanging CI forever.
DEFAULT_RUN_TIMEOUT_S = 300.0
# iree-run-module elides results longer than this (1024 by default) with "...".
_NO_ELISION = f"--output_max_element_count={1 << 30}"
# The child that calls a function several times in one process (run_calls).
_CALLS_CHILD = "pyree_build.actions.run_calls"
_RESULT_HEADING = re.compile(r"^result\[\d+\]:", re.MULTILINE)  # compiled in the server, not in each worker


class DeviceUnavailable(PyreeError):
    """The requested device is not present; ctest reads the exit code as 'skipped'."""


def _backend_of(device: str) -> backends.Backend:
    """The backend serving `device`: one of its `devices`, or a device of it as IREE names one
    (`vulkan://0`, `cuda://GPU-...`)."""
    backend = backends.for_device(device)
    if backend is None or device.split("://", 1)[0] not in backend.devices:
        raise PyreeError(f"unknown device '{device}'", fix=f"use one of: {', '.join(backends.devices())}")
    return backend


def require_device(device: str, *, skip_unavailable: bool = False, module: Path | None = None) -> None:
    """Stop before running on a device that is not usable (its backend's probe says so): a
    clear error, or with `skip_unavailable` the exit code ctest reads as 'skipped'. With
    `module`, also before running a module that the backend knows would go wrong there."""
    driver = device.split(":", 1)[0]
    backend = backends.for_device(device)
    if backend is None:
        return
    usable, reason = backend.probe(driver)
    if not usable:
        raise DeviceUnavailable(
            f"skipped: {reason}" if skip_unavailable else f"device {driver} is not usable: {reason}",
            fix=backend.unusable_fix(driver),
            exit_code=SKIP_EXIT_CODE if skip_unavailable else 1,
        )
    if module is not None:
        backend.check_module(module, device)


def explain_run_failure(text: str, device: str | None = None) -> str | None:
    """A better message for a failed run, from the backend of `device` (any backend's, if none is named)."""
    backend = backends.for_device(device) if device else None
    for candidate in [backend] if backend is not None else backends.builtin():
        hint = candidate.explain_run(text)
        if hint:
            return hint
    return None


_explain_run_failure = explain_run_failure  # the name bench and older callers use


def check_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not timeout > 0:
        raise PyreeError(f"--timeout must be a positive number of seconds, got {timeout}", fix="pass e.g. --timeout 300")
    return timeout


def crash_hint(plugins: Sequence[PathLike], *, timed_out_too: bool = True) -> str:
    """What usually makes a run crash or hang, naming the plugins that were loaded."""
    if not plugins:
        return (
            "no plugin was loaded, so the module (or the runtime) itself failed; check that it was compiled for this "
            "device, and rerun with the same inputs under a debugger"
        )
    names = ", ".join(os.fspath(p) for p in plugins)
    return (
        f"plugin(s) loaded: {names}; a crash or hang here is most often in a plugin's import. Likely causes:\n"
        "- the import is declared in the MLIR without `llvm.bareptr = true`, so the plugin reads memref descriptors "
        "where it expects plain pointers\n"
        "- the plugin's argument struct does not match the func.call in the MLIR (operand order, count or sizes, "
        "and the hal.import.fields appended at its end)\n"
        "- the plugin was built for another ABI or architecture, or against another executable_plugin.h\n"
        + ("- an endless loop in an import, or an import waiting on something that never comes" if timed_out_too else "")
    )


class Ran(NamedTuple):
    """A run as the tool did it: its argv (result paths under `results_dir`), stdout, result
    bytes: what a plan of the native client remembers (client/plans.py)."""

    argv: list[str]
    results_dir: str
    stdout: str
    results: list[bytes]


class HandedOver(Protocol):
    """A run of this very argv that another process made (the native client's run of a plan,
    client/plans.Outcome), handed to this one to check and report as its own."""

    @property
    def argv(self) -> list[str]: ...  # as the plan has it: NUL where the results directory goes
    @property
    def results_dir(self) -> str: ...
    @property
    def returncode(self) -> int: ...
    @property
    def stdout(self) -> bytes: ...
    @property
    def stderr(self) -> bytes: ...
    @property
    def seconds(self) -> float: ...
    @property
    def timed_out(self) -> bool: ...


class RunResult:
    """A run's text and timing; `outputs` (the results as numpy arrays) are made when first
    read, so a run that only prints or checks text never imports numpy (~100 ms)."""

    def __init__(
        self, module: Path, function: str, stdout: str, seconds: float, outputs: list[numpy.ndarray] | Callable[[], list[numpy.ndarray]] | None = None
    ) -> None:
        self.module = module
        self.function = function
        self.stdout = stdout
        self.seconds = seconds
        self._outputs = outputs if outputs is not None else []
        # For the native client (client/plans.py): the tool's run as it was; None for a
        # run the client handed over.
        self.ran: Ran | None = None

    @property
    def outputs(self) -> list[numpy.ndarray]:
        if callable(self._outputs):
            self._outputs = self._outputs()
        return self._outputs

    def __repr__(self) -> str:
        return f"RunResult(module={self.module!r}, function={self.function!r}, seconds={self.seconds:.3f})"


class _NpyOutputs:
    """The results of a run, read from its .npy files' bytes when first asked for."""

    def __init__(self, raw: list[bytes]) -> None:
        self.raw = raw

    def __call__(self) -> list[numpy.ndarray]:
        return [load_npy(data) for data in self.raw]


class _TextOutputs:
    """The results of a run, parsed from its printed text when first asked for."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self) -> list[numpy.ndarray]:
        return checks.parse_outputs(self.text)


def _check_run_inputs(mod: Path, inputs: Sequence[str], plugins: Sequence[PathLike], device: str, timeout: float | None, skip_unavailable: bool) -> None:
    """Every check that can fail before the module runs, in the order a user meets them."""
    checks.parse_inputs(inputs)
    check_timeout(timeout)
    if plugins:
        require_resolved(mod, plugins)  # names a missing import, where the runtime would not
    _backend_of(device)
    require_device(device, skip_unavailable=skip_unavailable, module=mod)


def _run_argv(
    mod: Path, function: str, device: str, plugin_flags: Sequence[str], inputs: Sequence[str], files: list[Path], npy: bool, flags: Sequence[str]
) -> list[str]:
    return toolchain.iree_run_module().command(
        f"--module={mod}",
        f"--function={function}",
        f"--device={device}",
        *(f"--executable_plugin={p}" for p in plugin_flags),
        *(f"--input={i}" for i in inputs),
        *(f"--output=@{f}" for f in files),
        *([] if npy else [_NO_ELISION]),
        *flags,
    )


def _spawn_run(
    argv: list[str], mod: Path, function: str, device: str, plugins: Sequence[PathLike], npy: bool, timeout: float | None, results: Path,
    handed_over: Callable[[], HandedOver | None] | None,
) -> tuple[subprocess.CompletedProcess[str], float, bool]:  # fmt: skip
    """The tool's run: (its result, seconds, whether the native client ran it and handed it over)."""
    # Under -v, the command a user can paste: the same run, its results printed in full
    # by iree-run-module itself instead of written to this run's private .npy files.
    echo.echo_command(echo.shell_line([a for a in argv if not a.startswith("--output=@")] + ([] if not npy else [_NO_ELISION])))
    what = f"running {function} on {device}" + (f" with plugin(s) {', '.join(os.fspath(p) for p in plugins)}" if plugins else "")
    how = dict(what=what, file=mod, explain=functools.partial(explain_run_failure, device=device), timeout=timeout, crash_hint=crash_hint(plugins))
    handed = None if handed_over is None else _handed_over(argv, results, handed_over())
    if handed is not None:  # the tool ran already: what it did is checked and reported here
        return processes.ran_elsewhere(argv, handed.returncode, handed.stdout, handed.stderr, timed_out=handed.timed_out, **how), handed.seconds, True  # type: ignore[arg-type]
    start = time.perf_counter()
    with echo.muted_commands():
        result = processes.spawn(argv, runs_user_code=bool(plugins), **how)  # type: ignore[arg-type]
    return result, time.perf_counter() - start, False


def _handed_over(argv: list[str], results: Path, outcome: HandedOver | None) -> HandedOver | None:
    """The native client's run of this very argv (client/plans.py), its result files moved to
    `results`; None when it handed over none, or another run's."""
    if outcome is None:
        return None
    try:
        if outcome.argv != [a.replace(os.fspath(results), "\0") for a in argv]:
            return None
        for name in os.listdir(outcome.results_dir):
            os.replace(os.path.join(outcome.results_dir, name), results / name)
        return outcome
    finally:
        shutil.rmtree(outcome.results_dir, ignore_errors=True)


def _require_all_results(produced: int, expected: int, mod: Path, function: str, plugins: Sequence[PathLike], output: str) -> None:
    if produced >= expected:
        return
    raise PyreeError(
        f"iree-run-module exited 0 but produced {produced} of the {expected} results of {function}",
        file=mod,
        details=(
            "the process ended before the function returned: something called exit() "
            + (f"(most likely a plugin: {', '.join(os.fspath(p) for p in plugins)})" if plugins else "")
            + "\noutput:\n"
            + output.strip()
        ),
        fix="an import must return a status to the runtime, never end the process",
    )


def run(
    module: PathLike,
    function: str,
    *,
    inputs: Sequence[str] = (),
    plugins: Sequence[PathLike] = (),
    device: str = "local-sync",
    expect: Sequence[str] = (),
    check_file: PathLike | None = None,
    flags: Sequence[str] = (),
    skip_unavailable: bool = False,
    check_prefixes: Sequence[str] = (),
    timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
    expect_close: Sequence[str] = (),
    rtol: float = checks.DEFAULT_RTOL,
    atol: float = checks.DEFAULT_ATOL,
    handed_over: Callable[[], HandedOver | None] | None = None,
) -> RunResult:
    """Run `function` of `module` with iree-run-module; check its output if asked.

    Results come back whole, of any size: tensors through one `.npy` file each (exact
    values), printed as iree-run-module prints them; other results as its text, never
    elided. A run that exits without producing the function's results (a plugin that
    called exit()) is an error, as is one killed by a signal or by `timeout` seconds.
    `handed_over` (the CLI's: client/plans.take_outcome), asked just before the tool would
    start, gives the run of this argv the native client made already, if it made one.
    """
    mod = require_file(module, "module")
    inputs = _untyped_scalars(mod, function, inputs)
    plugin_flags = [plugin_flag(p) for p in plugins]
    with processes.time_limit(check_timeout(timeout)):  # one bound for the whole command: the import check too
        return _run_bounded(mod, function, inputs, plugins, plugin_flags, device, expect, check_file, flags, skip_unavailable,
                            check_prefixes, timeout, expect_close, rtol, atol, handed_over)  # fmt: skip


def _run_bounded(
    mod: Path, function: str, inputs: Sequence[str], plugins: Sequence[PathLike], plugin_flags: Sequence[str], device: str,
    expect: Sequence[str], check_file: PathLike | None, flags: Sequence[str], skip_unavailable: bool,
    check_prefixes: Sequence[str], timeout: float | None, expect_close: Sequence[str], rtol: float, atol: float,
    handed_over: Callable[[], HandedOver | None] | None,
) -> RunResult:  # fmt: skip
    _check_run_inputs(mod, inputs, plugins, device, timeout, skip_unavailable)
    toolchain.iree_run_module()  # a missing runner is named before the module is inspected
    signature = function_results(mod, function)
    if signature is None:
        _require_function(mod, function)
    npy = signature is not None and len(signature[1]) == signature[0] and all(NPY_TENSOR.match(t) for t in signature[1])
    with tempfile.TemporaryDirectory(prefix="pyree-run.") as tmp:
        files = [Path(tmp) / f"result{k}.npy" for k in range(signature[0])] if npy and signature else []
        argv = _run_argv(mod, function, device, plugin_flags, inputs, files, npy, flags)
        reads.note(*_tool_reads(mod, plugins, argv[0], inputs))
        result, seconds, handed = _spawn_run(argv, mod, function, device, plugins, npy, timeout, Path(tmp), handed_over)
        stdout = result.stdout
        produced = sum(f.is_file() for f in files) if npy else len(_RESULT_HEADING.findall(stdout))
        if signature is not None:
            _require_all_results(produced, signature[0], mod, function, plugins, stdout + result.stderr)
        outputs: Callable[[], list[numpy.ndarray]] = _TextOutputs(stdout)
        raw: list[bytes] = []
        if npy and signature:
            raw = [f.read_bytes() for f in files]
            outputs = _NpyOutputs(raw)
            stdout += "".join(result_text(k, data, declared) for k, (data, declared) in enumerate(zip(raw, signature[1])))
        ran = None if handed else Ran(argv, tmp, result.stdout, raw)
    if expect:
        checks.check_expected(stdout, expect, source=str(mod))
    if check_file:
        checks.check_with_filecheck(stdout, os.fspath(check_file), source=str(mod), prefixes=check_prefixes)
    if expect_close:
        checks.check_close(outputs(), expect_close, rtol=rtol, atol=atol, source=str(mod))
    run_result = RunResult(mod, function, stdout, seconds, outputs)
    run_result.ran = ran
    return run_result


def _tool_reads(mod: Path, plugins: Sequence[PathLike], runner: str, inputs: Sequence[str]) -> list[str]:
    """What the tool reads (no `open` of this process, so noted for core/reads.py): the
    runner, the module, each plugin, each input's file, in every form `--input` takes."""
    named = [os.fspath(p).removeprefix(EMBEDDED_PREFIX) for p in plugins]
    return [runner, os.fspath(mod), *named, *(os.fspath(spec.file) for spec in checks.parse_inputs(inputs) if spec.file is not None)]


def _require_function(mod: Path, function: str) -> None:
    """Name the module's functions when `function` is not one of them (before running it)."""
    names = exported_functions(mod)
    if names is not None and function not in names:
        raise PyreeError(
            f"the module has no function '{function}'",
            file=mod,
            fix=f"name one of its functions: {', '.join(names) or '(none exported)'} (the MLIR's public func.func names; --function NAME)",
        )


def run_to_arrays(
    module: PathLike,
    function: str,
    inputs: Sequence[object] = (),
    *,
    plugins: Sequence[PathLike] = (),
    device: str = "local-sync",
    timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
) -> list[numpy.ndarray]:
    """Run with iree-run-module and return the results as numpy arrays; `inputs` may be
    arrays (passed through .npy files) or input spec strings.

    For devices whose results IREE's Python runtime cannot read back: on lavapipe it
    cannot import host memory (minImportedHostPointerAlignment 4096), the tool can.
    """
    mod = require_file(module, "module")
    with input_specs(mod, function, inputs) as specs:
        return run(mod, function, inputs=specs, plugins=plugins, device=device, timeout=timeout).outputs


def run_calls(
    module: PathLike,
    function: str,
    calls: Sequence[Sequence[object]],
    *,
    plugins: Sequence[PathLike] = (),
    device: str = "local-sync",
    timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
) -> list[list[numpy.ndarray]]:
    """`function` called once per entry of `calls` (its inputs, as run_to_arrays takes them):
    each call's results as numpy arrays, the same as run_to_arrays gives.

    Where each process builds the device's pipelines again at a cost (the backend's
    `pipelines_per_process`: Vulkan, whose lavapipe compiles each shader with LLVM) and no plugin
    is loaded, every call runs in one child process with the module loaded once
    (actions/run_calls.py, through IREE's Python runtime), bounded by `timeout` seconds a call;
    elsewhere each call is one iree-run-module, as a run is. Where the runtime refuses the module
    or a call there, iree-run-module runs each call instead and its message names the problem."""
    mod = require_file(module, "module")
    if len(calls) < 2 or plugins or not _backend_of(device).pipelines_per_process:
        return [run_to_arrays(mod, function, c, plugins=plugins, device=device, timeout=timeout) for c in calls]
    check_timeout(timeout)
    require_device(device, module=mod)
    batched = _calls_in_one_process(mod, function, calls, device, timeout)
    if batched is None:
        return [run_to_arrays(mod, function, c, device=device, timeout=timeout) for c in calls]
    return batched


def _calls_in_one_process(mod: Path, function: str, calls: Sequence[Sequence[object]], device: str, timeout: float | None) -> list[list[numpy.ndarray]] | None:
    """Every call in one child process; None where it ended with an error of its own (the runtime
    refused the module or a call, or cannot be imported): a crash or a timeout is raised."""
    with contextlib.ExitStack() as stack:
        specs = [_untyped_scalars(mod, function, stack.enter_context(input_specs(mod, function, c))) for c in calls]
        out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pyree-run.")))
        spec = {"module": os.fspath(mod), "function": function, "device": device, "calls": specs, "out": os.fspath(out)}
        argv = [*toolchain.python_module(_CALLS_CHILD), json.dumps(spec)]
        reads.note(*_tool_reads(mod, (), sys.executable, [i for s in specs for i in s]))
        limit = None if timeout is None else timeout * len(calls)
        with processes.time_limit(limit):
            result = processes.spawn(
                argv, what=f"calling {function} {len(calls)} times on {device} in one process", file=mod, check=False,
                explain=functools.partial(explain_run_failure, device=device), timeout=limit, crash_hint=crash_hint(()),
            )  # fmt: skip
        if result.returncode != 0:
            return None
        return [[load_npy((out / f"{i}_{j}.npy").read_bytes()) for j in range(_count(out, i))] for i in range(len(calls))]


def _count(out: Path, call: int) -> int:
    """How many results call `call` saved (`<call>_<j>.npy`)."""
    return sum(1 for name in os.listdir(out) if name.startswith(f"{call}_"))


@contextlib.contextmanager
def input_specs(module: Path, function: str, values: Sequence[object]) -> Iterator[list[str]]:
    """`--input` specs for `values`: a string as it is, a number as the bare number a scalar
    parameter takes, anything else through a .npy file (which lives until the block ends)."""
    declared: list[str] = []
    if any(not isinstance(v, str) or arguments.is_typed_scalar_spec(v) for v in values):
        declared = function_parameters(module, function) or []
    with tempfile.TemporaryDirectory(prefix="pyree-run.") as tmp:
        yield [_input_spec(v, declared[i] if i < len(declared) else None, i, Path(tmp)) for i, v in enumerate(values)]


def _untyped_scalars(mod: Path, function: str, inputs: Sequence[str]) -> list[str]:
    """`f32=2` for a scalar parameter, as the bare `2` iree-run-module takes."""
    if not any(arguments.is_typed_scalar_spec(v) for v in inputs):
        return list(inputs)
    declared = function_parameters(mod, function) or []
    return [_input_spec(v, declared[i] if i < len(declared) else None, i, mod.parent) for i, v in enumerate(inputs)]


def _input_spec(value: object, declared: str | None, position: int, tmp: Path) -> str:
    if arguments.is_scalar(declared) and (not isinstance(value, str) or arguments.is_typed_scalar_spec(value)):
        return repr(arguments.scalar(value, declared or "", position))
    if isinstance(value, str):
        return value
    array = np.asarray(value)
    if array.dtype == object:
        raise PyreeError(
            f"input {position} must be an array, a number or an --input spec string, got {type(value).__name__}",
            fix="pass e.g. np.ones(8, np.float32), 2.0 or '8xf32=1'",
        )
    path = tmp / f"input{position}.npy"
    np.save(path, array)
    return f"@{path}"
