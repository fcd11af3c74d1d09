"""A worker that serves another command: only once it is what a fresh worker would be.

A fresh worker per command cost its fork, the copy-on-write faults of every page it touched
and its exit (~15 ms of CPU a `run` on 2 cores, three times the tool's own). A worker whose
command ended cleanly is put back as it was forked instead (Baseline.restore), and waits for
the next client. What a command may change is of two kinds:

- what the worker puts back: the client's fds 0-2, environment, umask, cwd, argv and streams;
  signal handlers, mask and timer; pyree_build's module globals a command rebound (echo's
  verbosity, the stop signal...: those its code can rebind, found in its bytecode once), its
  functools caches that grew (a probe made for one client is made again for the next, as in
  a fresh worker), tempfile's directory, the warnings filters, numpy's print options and
  error handling;
- what it cannot put back, so it exits as before: a thread or a child still running, a
  module imported (onnxruntime, IREE's bindings, a user's code through cffi), an fd left
  open or one of its own closed, a resource limit, sys.path, its priority, CPU affinity,
  process group or session changed, a pyree_build container (a dict, list or set at module
  level) that grew or shrank, other than the facts every worker shares by design
  (cache/facts.py). A command that failed with an uncaught error or got a signal of its
  client's may have stopped anywhere: its worker exits too (worker.run).

Everything else a command does lives in its own objects, which are gone when it returns.
"""

from __future__ import annotations

import _signal  # getsignal without signal's enum conversion: ~0.7 us a signal, 60 signals a restore
import dis
import functools
import gc
import os
import re
import resource
import signal
import sys
import tempfile
import threading
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

# Shared between commands on purpose: what a worker learns about files and tools, kept by
# their content and stat (cache/facts.py), which the server also collects from every worker.
SHARED = {"pyree_build.cache.facts": ("_KNOWN", "_DIGESTS", "_NEW")}
_RLIMITS = tuple(getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_"))
_SIGNALS = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


@dataclass
class Plan:
    """Where pyree_build keeps state, found once in the server after its imports."""

    globals: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    containers: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    caches: list[Any] = field(default_factory=list)  # functools.cache / lru_cache wrappers

    @classmethod
    def of_loaded(cls) -> Plan:
        plan = cls()
        modules = {n: m for n, m in list(sys.modules.items()) if m is not None and (n == "pyree_build" or n.startswith("pyree_build."))}
        rebound, anywhere = _rebindable(modules)
        for name, module in modules.items():
            for key, value in vars(module).items():
                if key.startswith("__") or isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
                    continue
                if isinstance(value, functools._lru_cache_wrapper):
                    plan.caches.append(value)
                    continue
                here = rebound.get(name)
                if here is None or key in here or key in anywhere:
                    plan.globals.append((vars(module), key))
                if isinstance(value, (dict, list, set)) and key not in SHARED.get(name, ()):
                    plan.containers.append((f"{name}.{key}", vars(module), key))
        plan.caches = list({id(c): c for c in plan.caches}.values())  # a cache imported into another module is one
        return plan


_GLOBAL_STORES = frozenset(dis.opmap[n] for n in ("STORE_GLOBAL", "DELETE_GLOBAL"))
_ATTRIBUTE_STORES = frozenset(dis.opmap[n] for n in ("STORE_ATTR", "DELETE_ATTR"))
# Each offset holding one of those opcodes' bytes (a lookahead: overlapping offsets are all
# found), scanned in C: dis.get_instructions took 0.35 s for pyree_build's modules.
_STORES = re.compile(b"(?=[" + b"".join(re.escape(bytes([op])) for op in sorted(_GLOBAL_STORES | _ATTRIBUTE_STORES)) + b"])")


def _rebindable(modules: dict[str, types.ModuleType]) -> tuple[dict[str, set[str] | None], set[str]]:
    """The module globals pyree_build's code can rebind once imported, read from its bytecode:
    per module, the names its functions declare `global` and assign or delete; and every
    attribute name any of its code assigns or deletes (`stops._SPAWN_LOCK = ...` from
    another module, conservatively of any object). A module whose code cannot be read is None:
    all its globals are compared. Comparing only these after each command, not all ~670 module
    globals, spares the worker ~0.25 ms a command (scattered dict reads, cold after a tool ran)."""
    found: dict[str, set[str] | None] = {}
    anywhere: set[str] = set()
    for name, module in modules.items():
        try:
            code = module.__spec__.loader.get_code(name)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - no loader, no source: compare all its globals
            code = None
        if not isinstance(code, types.CodeType):
            found[name] = None
            continue
        here: set[str] = set()
        pending = [code]
        while pending:
            current = pending.pop()
            for op, name_of in _stores(current):
                (here if op in _GLOBAL_STORES else anywhere).add(name_of)
            pending += [c for c in current.co_consts if isinstance(c, types.CodeType)]
        found[name] = here
    return found, anywhere


def _stores(code: types.CodeType) -> list[tuple[int, str]]:
    """(opcode, name) of each store or delete of a global or an attribute in `code` itself."""
    raw = code.co_code
    found = []
    for m in _STORES.finditer(raw):
        at = m.start()
        if at % 2:  # an argument byte that happens to equal the opcode
            continue
        arg, shift, before = raw[at + 1], 8, at - 2
        while before >= 0 and raw[before] == dis.EXTENDED_ARG:
            arg |= raw[before + 1] << shift
            shift, before = shift + 8, before - 2
        found.append((raw[at], code.co_names[arg]))
    return found


def _fds() -> set[int]:
    """The open fds (not the one the listing itself used)."""
    return {fd for fd in map(int, os.listdir("/proc/self/fd")) if _open(fd)}


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()


@dataclass
class Baseline:
    """The worker as forked: taken once, before its first request, and restored after each
    command it may serve again (restore)."""

    plan: Plan
    std: list[int]  # copies of the server's fds 0-2
    environ: dict[str, str]
    umask: int
    streams: dict[str, Any]
    argv: list[str]
    path: list[str]
    modules: int
    fds: set[int]
    limits: dict[int, tuple[int, int]]
    handlers: dict[int, Any]
    mask: set[int]
    values: list[Any]
    sizes: list[int]
    cached: list[int]
    tempdir: str | None
    filters: list[Any]
    process: tuple[Any, ...]
    numpy: tuple[dict[str, Any], dict[str, str]] | None

    @classmethod
    def capture(cls, plan: Plan, *, but: int) -> Baseline:
        """The worker now, `but` (the connection it has already accepted) not counted."""
        umask = os.umask(0o022)
        os.umask(umask)
        std = [os.dup(fd) for fd in range(3)]  # not inheritable: no tool gets them
        names = ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__")
        return cls(
            plan=plan, std=std, environ=dict(os.environ), umask=umask, streams={n: getattr(sys, n) for n in names},
            argv=list(sys.argv), path=list(sys.path), modules=len(sys.modules), fds=_fds() - {but},
            limits={r: resource.getrlimit(r) for r in _RLIMITS}, handlers={s: _signal.getsignal(s) for s in _SIGNALS},
            mask=set(signal.pthread_sigmask(signal.SIG_BLOCK, [])), values=[d.get(k) for d, k in plan.globals],
            sizes=[len(d[k]) for _, d, k in plan.containers], cached=[c.cache_info().currsize for c in plan.caches],
            tempdir=tempfile.tempdir, filters=list(warnings.filters), process=_process(), numpy=_numpy_state(),
        )  # fmt: skip

    def why_not(self) -> str | None:
        """What the command left that a restore cannot undo (the worker must exit), or None."""
        checks: list[tuple[Callable[[], bool], Callable[[], str]]] = [
            (lambda: _threads() != 1, lambda: f"{_threads() - 1} thread(s) still running"),
            (_child_left, lambda: "a child process is still running"),
            (lambda: len(sys.modules) != self.modules, lambda: f"{len(sys.modules) - self.modules} module(s) imported"),
            (lambda: _fds() != self.fds, lambda: f"fds {_described(_fds() ^ self.fds)} opened or closed"),
            (lambda: sys.path != self.path, lambda: "sys.path changed"),
            (lambda: _process() != self.process, lambda: "its priority, CPU affinity, process group, session or collector changed"),
            (lambda: any(resource.getrlimit(r) != v for r, v in self.limits.items()), lambda: "a resource limit changed"),
            (lambda: self._resized() is not None, lambda: f"{self._resized()} changed"),
        ]  # fmt: skip
        for failed, reason in checks:
            if failed():
                return reason()
        return None

    def _resized(self) -> str | None:
        for (name, d, k), size in zip(self.plan.containers, self.sizes, strict=True):
            if len(d[k]) != size:
                return name
        return None

    def restore(self) -> None:
        """Put back what the command changed and a fresh worker would not have (see the module)."""
        for fd, saved in enumerate(self.std):
            os.dup2(saved, fd, inheritable=True)
        for name, stream in self.streams.items():
            setattr(sys, name, stream)
        sys.argv[:] = self.argv
        become_environment(self.environ)
        os.umask(self.umask)
        os.chdir("/")
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in self.handlers.items():
            if handler is not None and _signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        for (d, k), value in zip(self.plan.globals, self.values, strict=True):
            if d.get(k) is not value:
                d[k] = value
        for cache, size in zip(self.plan.caches, self.cached, strict=True):
            if cache.cache_info().currsize != size:
                cache.cache_clear()
        tempfile.tempdir = self.tempdir
        np = sys.modules.get("numpy")
        if self.numpy is not None and np is not None and _numpy_state() != self.numpy:
            np.set_printoptions(**self.numpy[0])
            np.seterr(**self.numpy[1])
        if warnings.filters != self.filters:
            cast(list[Any], warnings.filters)[:] = self.filters
        warnings._filters_mutated()  # type: ignore[attr-defined]  # "once" warnings are said again, as to a fresh worker


def _process() -> tuple[Any, ...]:
    return os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0), os.getpgid(0), os.getsid(0), gc.isenabled()


def _numpy_state() -> tuple[dict[str, Any], dict[str, str]] | None:
    """numpy's print options and error handling (process-wide), if the server loaded numpy."""
    np = sys.modules.get("numpy")
    return None if np is None else (np.get_printoptions(), np.geterr())


def _child_left() -> bool:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return True if pid == 0 else _child_left()  # one that ended is reaped; look again


def _described(fds: set[int]) -> str:
    def what(fd: int) -> str:
        try:
            return f"{fd} ({os.readlink(f'/proc/self/fd/{fd}')})"
        except OSError:
            return f"{fd} (closed)"

    return ", ".join(what(fd) for fd in sorted(fds))


def become_environment(env: dict[str, str]) -> None:
    """os.environ made equal to `env`, touching only the variables that differ: a build's
    commands share most of theirs with the server's, and each putenv or unsetenv costs. The
    differences are found on os.environ's own bytes (its mapping decodes every key and value
    it hands out: ~0.15 ms of CPU a call in a worker, twice a command)."""
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict):  # not CPython's os.environ: compare through the mapping
        for name in [n for n in os.environ if n not in env]:
            del os.environ[name]
        for name, value in env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        return
    encoding = sys.getfilesystemencoding()
    want = {k.encode(encoding, "surrogateescape"): v.encode(encoding, "surrogateescape") for k, v in env.items()}
    have: dict[bytes, bytes] = data
    for gone in have.keys() - want.keys():
        del os.environ[gone.decode(encoding, "surrogateescape")]
    for raw_name, raw_value in want.items():
        if have.get(raw_name) != raw_value:
            os.environ[raw_name.decode(encoding, "surrogateescape")] = raw_value.decode(encoding, "surrogateescape")
