"""Run a module inside this Python process through `iree.runtime`, returning numpy arrays.

IREE's Python runtime creates each HAL driver once per process and reads the
`--executable_plugin` flags when it does, so the plugins a driver sees are fixed by the
first in-process run that uses that driver. This module remembers what each driver was
created with and refuses, with an explanation, a later run that asks for other plugins
(rather than silently running without them).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from pyree_build.actions import checks
from pyree_build.core.errors import PyreeError, require_file

PathLike = str | os.PathLike[str]
InputValue = "np.ndarray | str | float | int"

_LOCK = threading.Lock()
_PARSED_PLUGIN_FLAGS: tuple[str, ...] | None = None
_DRIVER_PLUGINS: dict[str, tuple[str, ...]] = {}


def _driver_name(device: str) -> str:
    return device.split("://", 1)[0]


def _register_plugins(driver: str, plugin_flags: tuple[str, ...]) -> None:
    """Make sure `driver` is (or will be) created with exactly these plugins."""
    global _PARSED_PLUGIN_FLAGS
    import iree.runtime as rt

    with _LOCK:
        if driver in _DRIVER_PLUGINS:
            have = _DRIVER_PLUGINS[driver]
            if plugin_flags and plugin_flags != have:
                raise PyreeError(
                    f"the {driver} driver of this process was created with plugins {list(have) or 'none'}; "
                    f"IREE's Python runtime cannot give it {list(plugin_flags)} now",
                    fix="pass the same plugins to every in-process run on this device, or use pb.run(..., in_process=False) "
                    "to run in a separate iree-run-module process",
                )
            return
        if plugin_flags:
            if _PARSED_PLUGIN_FLAGS is not None and _PARSED_PLUGIN_FLAGS != plugin_flags:
                raise PyreeError(
                    f"this process already registered plugins {list(_PARSED_PLUGIN_FLAGS)} with the IREE runtime",
                    fix="use the same plugins for every in-process run, or pb.run(..., in_process=False)",
                )
            if _PARSED_PLUGIN_FLAGS is None:
                rt.flags.parse_flags(*(f"--executable_plugin={p}" for p in plugin_flags))
                _PARSED_PLUGIN_FLAGS = plugin_flags
        _DRIVER_PLUGINS[driver] = _PARSED_PLUGIN_FLAGS or ()


def _to_array(value: object) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, str):
        spec = checks.parse_input(value)
        if spec.file is not None and spec.shape is None:
            return np.load(spec.file)
        dtype = checks.numpy_dtype(spec.element_type) if spec.element_type else None
        if spec.file is not None:
            return np.fromfile(spec.file, dtype=dtype).reshape(spec.shape)
        if spec.shape is None:  # a bare scalar
            return np.asarray(float(spec.values[0]))
        values = [float(v) if dtype is not None and np.issubdtype(dtype, np.floating) else int(float(v)) for v in spec.values]
        if len(values) == 1:
            return np.full(spec.shape, values[0], dtype=dtype)
        return np.asarray(values, dtype=dtype).reshape(spec.shape)
    return np.asarray(value)


def run(
    module: PathLike,
    function: str,
    inputs: Sequence[object] = (),
    *,
    plugins: Sequence[PathLike] = (),
    device: str = "local-sync",
) -> list[np.ndarray]:
    """Call `function` of a .vmfb in this process; inputs are arrays or `--input` specs."""
    from pyree_build.actions.iree import plugin_flag, require_device

    mod = require_file(module, "module")
    try:
        import iree.runtime as rt
    except ImportError as exc:
        raise PyreeError(f"iree.runtime cannot be imported ({exc})", fix='pip install "iree-base-runtime==3.13.*"') from None
    require_device(device)
    args = [_to_array(v) for v in inputs]
    _register_plugins(_driver_name(device), tuple(plugin_flag(p) for p in plugins))
    try:
        config = rt.Config(device)
        context = rt.SystemContext(config=config)
        vm_module = rt.VmModule.copy_buffer(context.instance, Path(mod).read_bytes())
        context.add_vm_module(vm_module)
        entry = context.modules[vm_module.name][function]
    except KeyError:
        raise PyreeError(f"the module has no function '{function}'", file=mod, fix="check --function against the MLIR's func.func names") from None
    except (RuntimeError, ValueError) as exc:
        raise PyreeError("the runtime could not load the module", file=mod, details=str(exc), fix=_load_fix(str(exc))) from None
    try:
        result = entry(*args)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise PyreeError(f"calling {function} failed", file=mod, details=str(exc), fix=_load_fix(str(exc))) from None
    results = result if isinstance(result, (tuple, list)) else [result]
    return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]


def _load_fix(message: str) -> str:
    if "no executable loader registered" in message:
        return "the module calls imports that no plugin provided: pass plugins=[...] with the plugin that exports them"
    return "check the module was compiled for this device (llvm-cpu for local-sync/local-task, cuda for cuda)"
