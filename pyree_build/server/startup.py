"""The server's start: every module a command needs imported before the first fork (and
what their warm_up() hooks find), no thread left running, and the listening socket bound."""

from __future__ import annotations

import importlib
import os
import pkgutil
import socket
import sys
import threading

from pyree_build.core import lazy
from pyree_build.server.state import log

# Every module of pyree_build is imported by the server, and every module they name lazily
# (core/lazy.py: numpy, pyelftools, cuda.bindings, concurrent.futures...), so a worker starts
# with what a verb needs loaded (~0.5 s, once; a worker importing pyelftools and a thread pool
# itself cost ~60 ms a plugin build). Except these, by name or package: a Ray client and
# onnxruntime start threads; IREE's Python bindings and onnx hold 25-80 MB that every fork would
# map, for the few verbs that use them.
NOT_PRELOADED = ("pyree_build.tuning.on_ray", "onnxruntime", "onnx", "iree.runtime", "iree.compiler", "torch", "iree.turbine")
# Each thread pool a native library would start at import (numpy's BLAS) is held to one
# thread: the server must have no thread when it forks.
ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def preload() -> None:
    for name in ONE_THREAD:
        os.environ.setdefault(name, "1")
    package = importlib.import_module("pyree_build")
    names = [m.name for m in pkgutil.walk_packages(package.__path__, "pyree_build.") if not m.name.endswith("__main__")]
    for module in names:
        _import(module, quiet=False)
    for module in list(lazy.NAMED):
        _import(module, quiet=True)  # an optional dependency (an extra) may be missing
    _warm_up(names)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    if threads != 1:
        raise SystemExit(f"pyree_build server: {threads} threads after the imports; forking would be unsafe")


def _import(module: str, *, quiet: bool) -> None:
    if any(module == n or module.startswith(n + ".") for n in NOT_PRELOADED):
        return
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - a module that fails here fails again, visibly, in the worker that needs it
        if not quiet:
            log(f"preload {module}: {err}")


def _warm_up(names: list[str]) -> None:
    """What each process would otherwise find out on its first command (a probe of setpriv is a
    spawn, ~3 ms; a verb's parser ~2 ms): a module that keeps such facts offers `warm_up()`,
    called once here, so every worker starts with them."""
    for loaded in [sys.modules[n] for n in names if n in sys.modules]:
        warm_up = loaded.__dict__.get("warm_up")
        if callable(warm_up):
            try:
                warm_up()
            except Exception as err:  # noqa: BLE001 - a fact not found now is found, or fails visibly, in a worker
                log(f"warm-up of {loaded.__name__}: {err}")


def listen(path: str) -> tuple[socket.socket, int, str]:
    """Bind beside `path` and rename onto it: a client sees no socket or a listening one."""
    tmp = os.path.join(os.path.dirname(path), f".{os.getpid()}.tmp")  # no longer than `path`: sun_path is short
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(tmp)
    os.chmod(tmp, 0o600)
    sock.listen(128)
    os.rename(tmp, path)
    return sock, os.stat(path).st_ino, tmp


def on_term(_signum: int, _frame: object) -> None:
    raise SystemExit(0)
