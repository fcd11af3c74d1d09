"""The backend registry: which targets exist, found by name, device or verb.

Built-in backends are listed below, one line each; other packages add theirs through the
`pyree_build.backends` entry-point group (`name = "module:ATTRIBUTE"`, the attribute a
`Backend` instance), read only when a name is not built in or everything is listed (help,
doctor), so a command that names a built-in target never scans the installed packages.
A backend module is imported on first use; its declaration imports nothing heavy.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Any

# Backend is re-exported: callers name the registry's type as `backends.Backend`.
from pyree_build.backends.base import Backend as Backend
from pyree_build.backends.base import Verb
from pyree_build.core import lazy
from pyree_build.core.errors import PyreeError

BUILTIN = {
    "llvm-cpu": "pyree_build.backends.llvm_cpu",
    "cuda": "pyree_build.backends.cuda",
    "vulkan": "pyree_build.backends.vulkan",
    "hip": "pyree_build.backends.hip",
}
ENTRY_POINT_GROUP = "pyree_build.backends"
# Scanning installed packages costs ~10 ms: only for a name not built in, or a full listing.
metadata = lazy.module("importlib.metadata")

_LOCK = threading.Lock()
_LOADED: dict[str, Backend] = {}
_EXTERNAL: dict[str, str] | None = None  # name -> "module:attribute", once scanned


def register(backend: Backend) -> Backend:
    """Add (or replace) a backend in this process; returns it, so a module can end with
    `BACKEND = register(MyBackend())`."""
    if not isinstance(backend, Backend) or not backend.name:
        raise PyreeError(f"{backend!r} is not a named pyree_build Backend", fix="subclass pyree_build.backends.base.Backend and set `name`")
    with _LOCK:
        _LOADED[backend.name] = backend
    return backend


def _external() -> dict[str, str]:
    global _EXTERNAL
    if _EXTERNAL is None:
        found = {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
        _EXTERNAL = {name: value for name, value in found.items() if name not in BUILTIN}
    return _EXTERNAL


def _load(name: str, where: str) -> Backend:
    module, _, attr = where.partition(":")
    try:
        loaded = getattr(importlib.import_module(module), attr or "BACKEND")
    except (ImportError, AttributeError) as exc:
        raise PyreeError(
            f"backend '{name}' cannot be loaded from {where} ({type(exc).__name__}: {exc})",
            fix=f"reinstall the package that provides it, or remove its `{ENTRY_POINT_GROUP}` entry point",
        ) from None
    if not isinstance(loaded, Backend) or loaded.name != name:
        raise PyreeError(
            f"{where} is not a pyree_build backend named '{name}' (found {loaded!r})",
            fix="point the entry point at a Backend instance whose `name` is the entry point's name",
        )
    return loaded


def names(*, external: bool = True) -> list[str]:
    """Every target name: the built-in ones, then registered and (with `external`) installed ones."""
    listed = [*BUILTIN, *(n for n in _LOADED if n not in BUILTIN)]
    if external:
        listed += [n for n in _external() if n not in listed]
    return listed


def get(name: str) -> Backend:
    """The backend for `--target name`, or a PyreeError listing the targets there are."""
    with _LOCK:
        found = _LOADED.get(name)
    if found is not None:
        return found
    where = BUILTIN.get(name) or _external().get(name)
    if where is None:
        raise PyreeError(f"unknown target '{name}'", fix=f"use one of: {', '.join(names())}")
    return register(_load(name, where))


def with_options(name: str, options: Mapping[str, Any]) -> Backend:
    """The backend for `name`, refusing an option (by dest) that it does not declare."""
    backend = get(name)
    declared = {o.dest for o in backend.compile_options}
    unknown = sorted(k for k in options if k not in declared)
    if unknown:
        raise PyreeError(
            f"target '{name}' has no option {', '.join(repr(k) for k in unknown)}",
            fix=f"its options are: {', '.join(sorted(declared)) or 'none'}; pass those in target_options",
        )
    return backend


def every() -> list[Backend]:
    """Every backend, built-in ones first (for help and doctor)."""
    return [get(n) for n in names()]


def builtin() -> list[Backend]:
    """The built-in backends (and those registered in this process): no package scan."""
    return [get(n) for n in names(external=False)]


def for_device(device: str) -> Backend | None:
    """The backend whose modules run on `device` (`cuda://0` -> cuda), or None for an unknown one."""
    driver = device.split("://", 1)[0].split(":", 1)[0]
    for backend in builtin():
        if driver in backend.devices:
            return backend
    for name in _external():
        backend = get(name)
        if driver in backend.devices:
            return backend
    return None


def devices(*, external: bool = True) -> list[str]:
    """Every `--device` driver name some backend serves."""
    return [d for b in (every() if external else builtin()) for d in b.devices]


def find_verb(name: str) -> tuple[Backend, Verb] | None:
    """The backend verb called `name` (`ptx`), looking at installed backends only when no
    built-in one has it."""
    for builtin_name in names(external=False):  # loaded one by one: `plugin` needs only llvm-cpu's declaration
        backend = get(builtin_name)
        for verb in backend.verbs:
            if verb.name == name:
                return backend, verb
    for external in _external():
        backend = get(external)
        for verb in backend.verbs:
            if verb.name == name:
                return backend, verb
    return None
