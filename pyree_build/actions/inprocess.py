"""Run a module inside this Python process through `iree.runtime`, returning numpy arrays.

IREE's runtime reads the `--executable_plugin` flags when a HAL driver is created, and a
loaded plugin stays loaded (a system plugin's dlopen handle, a standalone plugin's image)
until the process ends. The flags only ever grow (each parse appends), and when two loaded
plugins export one import, the one parsed last provides it. So each set of plugins gets a
driver and device of its own, created right after its plugins were parsed (again, if they
were parsed before): that device's imports resolve to exactly those plugins, as they were
then, and a device made earlier keeps the plugins it was made with. A plugin whose path
this process already loaded with other bytes (the notebook loop: edit, rebuild, run again)
is loaded from a copy named by its content, since dlopen would hand back the old library.
A wrong (stale) result is never returned, and an edit never needs a new process.

A module is loaded once per (file, device, plugins) and kept, so a call after the first
costs the call itself (tens of microseconds), not a new context.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyree_build.actions import arguments, checks
from pyree_build.actions.results import exported_functions
from pyree_build.actions.run import DEFAULT_RUN_TIMEOUT_S, crash_hint, plugin_flag, require_device, run_to_arrays
from pyree_build.backends.llvm_cpu.imports import require_resolved
from pyree_build.backends.llvm_cpu.loader import EMBEDDED_PREFIX
from pyree_build.core import lazy, processes
from pyree_build.core.errors import PyreeError, require_file

rt = lazy.module("iree.runtime")
rt_binding = lazy.module("iree.runtime._binding")

PathLike = str | os.PathLike[str]

# (the --executable_plugin value, the SHA-256 of the file it names), in the order given.
PluginSet = tuple[tuple[str, str], ...]

_LOCK = threading.Lock()
_DEVICES: dict[tuple[str, PluginSet], Any] = {}  # (device URI, plugins) -> a device created with them parsed last
_LOADED: dict[str, str] = {}  # plugin path this process parsed -> the digest of what it held then
_COPIES: list[Path] = []  # the directory of content-named copies, made on first need
_SESSIONS: dict[tuple[Any, ...], Any] = {}  # (module file's identity, device, plugins) -> its loaded functions
# Drivers with a call that never returned (timed out or interrupted): the runtime cannot stop a
# call, so it goes on in its thread; later runs on that driver go to iree-run-module.
_STUCK: set[str] = set()


def _driver_name(device: str) -> str:
    return device.split("://", 1)[0]


def plugin_set(plugin_flags: Sequence[str]) -> PluginSet:
    """Each plugin flag with the digest of the file it names, as it is now."""
    return tuple((flag, hashlib.sha256(Path(flag.removeprefix(EMBEDDED_PREFIX)).read_bytes()).hexdigest()) for flag in plugin_flags)


def _copy_dir() -> Path:
    if not _COPIES:
        made = Path(tempfile.mkdtemp(prefix="pyree_build-plugins-"))
        atexit.register(shutil.rmtree, made, True)
        _COPIES.append(made)
    return _COPIES[0]


def _is_image(flag: str) -> bool:
    """Whether IREE loads the plugin as a standalone image it reads itself (an `embedded:` flag
    or a `.sos` file: IREE's own rule), not with dlopen."""
    return flag.startswith(EMBEDDED_PREFIX) or Path(flag).suffix == ".sos"


def _loadable(flag: str, digest: str) -> str:
    """The flag to parse for a plugin: itself, or a copy named by its content. A standalone
    image is always copied: every driver made later reads every plugin parsed so far again, so
    its file must outlive the caller's (a temporary build, a cleared cache). A system plugin is
    copied when this process loaded its path with other bytes (dlopen would return that
    library); otherwise it stays where it is (it may load libraries beside it), and once loaded
    it stays loaded, so a later driver finds it by name even if the file goes."""
    image = _is_image(flag)
    path = flag.removeprefix(EMBEDDED_PREFIX)
    if not image and _LOADED.get(path, digest) == digest:
        return flag
    copy = _copy_dir() / f"{digest[:32]}{Path(path).suffix}"
    if not copy.exists():
        partial = copy.with_name(f".{copy.name}.{os.getpid()}")
        shutil.copyfile(path, partial)
        os.replace(partial, copy)
    return (EMBEDDED_PREFIX if flag.startswith(EMBEDDED_PREFIX) else "") + str(copy)


def device_for(device: str, want: PluginSet) -> Any:
    """A device on which `want`'s plugins (as hashed) provide the imports: made on first
    need, then kept. None when the driver has a call that never returned."""
    driver = _driver_name(device)
    with _LOCK:
        if driver in _STUCK or driver in _UNUSABLE:
            return None
        made = _DEVICES.get((device, want))
        if made is not None:
            return made
        flags = [_loadable(flag, digest) for flag, digest in want]
        if flags:
            rt.flags.parse_flags(*(f"--executable_plugin={flag}" for flag in flags))
        for (flag, digest), loaded in zip(want, flags):
            if loaded == flag and not _is_image(flag):
                _LOADED[flag] = digest
        made = rt_binding.create_hal_driver(driver).create_device_by_uri(device)
        _DEVICES[(device, want)] = made
        return made


# Drivers that cannot be made again in this process: a plugin parsed for an earlier run (every
# driver loads them all) no longer loads (its file went, or it fails now). Reason, by driver.
_UNUSABLE: dict[str, str] = {}


def _poisoned(driver: str, message: str, want: PluginSet) -> bool:
    """Whether a failure to make a driver is about an earlier run's plugin rather than this
    run's own: then later runs on the driver go to iree-run-module, with the reason."""
    if "Error creating driver" not in message or any(flag.removeprefix(EMBEDDED_PREFIX) in message for flag, _ in want):
        return False
    with _LOCK:
        _UNUSABLE[driver] = f"a plugin an earlier run loaded cannot be loaded again ({message.strip().splitlines()[-1]})"
    return True


def _session(mod: Path, device: str, want: PluginSet) -> Any:
    """The module's functions, loaded on the device of `want` (kept for the next call while
    the file is unchanged)."""
    stat = mod.stat()
    key = (str(mod), stat.st_ino, stat.st_size, stat.st_mtime_ns, device, want)
    with _LOCK:
        kept = _SESSIONS.get(key)
    if kept is not None:
        return kept
    hal_device = device_for(device, want)
    if hal_device is None:
        return None
    config = rt.Config(device=hal_device)
    context = rt.SystemContext(config=config)
    vm_module = rt.VmModule.copy_buffer(context.instance, mod.read_bytes())
    context.add_vm_module(vm_module)
    functions = context.modules[vm_module.name]
    with _LOCK:
        return _SESSIONS.setdefault(key, functions)


def _note_once(driver: str, reason: str) -> None:
    with _LOCK:
        if (driver, reason) in _NOTED:
            return
        _NOTED.add((driver, reason))
    print(
        f"note: pb.run: {reason}; this run on {driver} uses iree-run-module (which can be stopped). Restart the process to run in process again.",
        file=sys.stderr,
    )


_NOTED: set[tuple[str, str]] = set()  # (driver, reason) already explained on stderr


def _is_bare(spec: str) -> bool:
    """A spec without a shape or a file: a number, for a scalar parameter (`2.5`, `f32=2.5`)."""
    parsed = checks.parse_input(spec)
    return parsed.shape is None and parsed.file is None


def _arguments(entry: object, inputs: Sequence[object]) -> list[object]:
    """Each input as iree.runtime takes it for its parameter: a Python number for a scalar
    (by the declared type), an array for anything else."""
    reflection = getattr(getattr(entry, "vm_function", None), "reflection", None) or {}
    declared = arguments.declared_parameters(reflection.get("iree.abi.declaration", ""))
    return [
        arguments.scalar(v, declared[i], i) if i < len(declared) and arguments.is_scalar(declared[i]) else checks.spec_array(v) for i, v in enumerate(inputs)
    ]


def run(
    module: PathLike,
    function: str,
    inputs: Sequence[object] = (),
    *,
    plugins: Sequence[PathLike] = (),
    device: str = "local-sync",
    timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
) -> list[np.ndarray]:
    """Call `function` of a .vmfb in this process; inputs are arrays or `--input` specs.

    The call runs in a thread of its own while this one waits: SIGINT (and a stop under
    `pb.stop_on_signals()`) and `timeout` seconds end the wait, with KeyboardInterrupt, Stopped
    or a PyreeError. The runtime cannot stop a call, so one that never returns goes on in its
    thread; later runs on that driver use iree-run-module (which can be stopped). Each plugin's
    resolve is asked first in a child process, within the same bound: one that does not answer
    there is never loaded here (a PyreeError says why)."""
    require_file(module, "module")
    # Tensors are read now, so a bad spec is named before the module loads.
    _normalized(inputs)
    return bind(module, function, plugins=plugins, device=device, timeout=timeout)(inputs)


def _normalized(inputs: Sequence[object]) -> list[object]:
    """Spec strings read as arrays; a bare number waits for the function's declaration, which
    says whether it is a scalar."""
    return [v if isinstance(v, str) and _is_bare(v) else checks.spec_array(v) if isinstance(v, str) else v for v in inputs]


def bind(
    module: PathLike, function: str, *, plugins: Sequence[PathLike] = (), device: str = "local-sync", timeout: float | None = DEFAULT_RUN_TIMEOUT_S
) -> Callable[[Sequence[object]], list[np.ndarray]]:
    """`function` of a module, loaded in this process with `plugins` and checked once (the
    plugins asked in a child, the device made), as a callable of its inputs: for a caller that
    calls the same files again (pb.load_inline's kernels, whose files never change), each call
    then costs the call (see run for how a call is bounded)."""
    mod = require_file(module, "module")
    try:
        rt.Config  # noqa: B018 - the first read imports iree.runtime: say what to install if it is missing
    except ImportError as exc:
        raise PyreeError(f"iree.runtime cannot be imported ({exc})", fix='pip install "iree-base-runtime==3.13.*"') from None
    require_device(device, module=mod)
    driver = _driver_name(device)

    def out_of_process(inputs: Sequence[object]) -> list[np.ndarray]:
        _note_once(driver, _UNUSABLE.get(driver, "an earlier call on it did not return (it still runs in this process)"))
        return run_to_arrays(mod, function, _normalized(inputs), plugins=plugins, device=device, timeout=timeout)

    with processes.time_limit(timeout):  # one bound for the plugins' check and a run out of process
        _require_resolves_answered(mod, plugins)
        want = plugin_set([plugin_flag(p) for p in plugins])
    try:
        functions = _session(mod, device, want)
        if functions is None:
            return out_of_process
        entry = functions[function]
    except (RuntimeError, ValueError) as exc:
        if not _poisoned(driver, str(exc), want):
            raise PyreeError("the runtime could not load the module", file=mod, details=str(exc), fix=_load_fix(str(exc))) from None
        return out_of_process
    except KeyError:
        names = exported_functions(mod) or []
        raise PyreeError(
            f"the module has no function '{function}'",
            file=mod,
            fix=f"name one of its functions: {', '.join(names) or '(none exported)'} (the MLIR's public func.func names)",
        ) from None

    def call(inputs: Sequence[object]) -> list[np.ndarray]:
        if driver in _STUCK:
            return out_of_process(inputs)
        args = _arguments(entry, _normalized(inputs))
        try:
            return _call_bounded(entry, args, timeout, what=f"calling {function} on {device}", file=mod, driver=driver, plugins=plugins)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise PyreeError(f"calling {function} failed", file=mod, details=str(exc), fix=_load_fix(str(exc))) from None

    return call


def call_many(module: PathLike, function: str, calls: Sequence[Sequence[object]], *, device: str) -> list[list[np.ndarray]]:
    """`function` called once per entry of `calls` (its inputs: arrays or `--input` specs), on one
    device with the module loaded once: the device builds each executable's pipelines once for
    every call (on lavapipe, LLVM compiling each shader on its first dispatch), where
    iree-run-module builds them again in each of its processes. No plugins: this runs in the child
    process run.run_calls starts (actions/run_calls.py), never in the caller's."""
    mod = require_file(module, "module")
    config = rt.Config(device)
    context = rt.SystemContext(config=config)
    vm_module = rt.VmModule.copy_buffer(context.instance, mod.read_bytes())
    context.add_vm_module(vm_module)
    entry = context.modules[vm_module.name][function]
    results = []
    for inputs in calls:
        result = entry(*_arguments(entry, inputs))
        results.append([to_host(config.device, r) for r in (result if isinstance(result, (tuple, list)) else [result])])
    return results


def to_host(device: Any, result: Any) -> np.ndarray:
    """A result as a host array. Where the device cannot import the host array to_host copies
    into (lavapipe: minImportedHostPointerAlignment 4096, numpy aligns to 64 bytes), through a
    staging buffer of the device's own, mapped after the copy."""
    if not hasattr(result, "to_host"):
        return np.asarray(result)
    try:
        return np.asarray(result.to_host())
    except ValueError as exc:
        view = getattr(result, "_buffer_view", None)
        if view is None or "import" not in str(exc):
            raise
    source = view.get_buffer()
    staging = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=source.byte_length(),
    )
    semaphore = device.create_semaphore(0)
    device.queue_copy(source, staging, wait_semaphores=rt.HalFence.create_at(semaphore, 0), signal_semaphores=rt.HalFence.create_at(semaphore, 1))
    rt.HalFence.create_at(semaphore, 1).wait()
    raw = np.array(staging.map().asarray(tuple(view.shape), rt.HalElementType.map_to_dtype(view.element_type)))
    return raw if raw.dtype == result.dtype else raw.astype(result.dtype)


def _require_resolves_answered(mod: Path, plugins: Sequence[PathLike]) -> None:
    """Loading the module calls each plugin's resolve inside a runtime call that holds the GIL:
    nothing in this process could bound it or see a SIGINT. So the plugins are asked first in a
    child (bounded by the time limit, remembered by their bytes); one that could not answer
    there (its resolve hangs or crashes) is never loaded here."""
    unasked = require_resolved(mod, plugins) if plugins else []
    if unasked:
        raise PyreeError(
            "a plugin could not be asked which imports it resolves, so pb.run does not load it into this process",
            file=mod,
            details="\n".join(unasked),
            fix="make its iree_hal_executable_plugin_resolve return (pyree_build asked it in a child process, so nothing else was "
            "harmed), or give it more time with timeout=SECONDS",
        )


def _call_bounded(
    entry: Any, args: list[object], timeout: float | None, *, what: str, file: Path, driver: str, plugins: Sequence[PathLike]
) -> list[np.ndarray]:
    """`entry(*args)` as arrays, from a thread of its own (the runtime releases the GIL while
    it runs, so this thread's wait sees signals and the clock)."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            result = entry(*args)
            results = result if isinstance(result, (tuple, list)) else [result]
            box["ok"] = [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=call, name=f"pyree_build {what}", daemon=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    worker.start()
    try:
        while worker.is_alive():
            processes.check_stopped()  # a stop that came to another thread
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise PyreeError(
                    f"{what} did not return within {timeout:g} s",
                    file=file,
                    details=crash_hint(plugins),
                    fix="see the likely causes above; the call goes on in this process (IREE's runtime cannot stop it): later runs "
                    f"on {driver} use iree-run-module; restart the process to free its core, or pass timeout=SECONDS",
                )
            worker.join(0.1 if left is None else min(0.1, left))  # interruptible: SIGINT raises here
    except BaseException:
        if worker.is_alive():
            with _LOCK:
                _STUCK.add(driver)
            # The call goes on holding the runtime's objects, so at exit nanobind would list each
            # as leaked (~200 lines on stderr): true of a call that cannot be stopped, and said
            # by the error already.
            rt_binding.disable_leak_checker()
        raise
    if "error" in box:
        raise box["error"]
    return box["ok"]


def _load_fix(message: str) -> str:
    if "no executable loader registered" in message:
        return "the module calls imports that no plugin provided: pass plugins=[...] with the plugin that exports them"
    return "check the module was compiled for this device (llvm-cpu for local-sync/local-task, cuda for cuda)"
