"""call_in_child: run a function that is not ours to trust (a plugin's query) in a forked
child of its own process group, bounded, and return its pickled result; a crash or a hang
there becomes a PyreeError, never the end of pyree_build."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO, NoReturn

from pyree_build.core import lazy
from pyree_build.core.errors import PyreeError
from pyree_build.core.processes import reaping, stops

# Loaded when first used: only a plugin query in a child needs pickle (~2 ms) or the prctl
# call (ctypes).
libc = lazy.module("pyree_build.core.libc")
pickle = lazy.module("pickle")


@functools.cache
def _set_pdeathsig() -> Callable[[], None] | None:
    """A function that makes the calling (forked) process get SIGKILL when its parent dies.

    It covers the one stop no handler can see (SIGKILL of pyree_build): the child dies with
    it instead of writing into the output directory later. Linux only; looked up in the
    parent, once, so that the forked child runs no lookup.
    """
    prctl = libc.function("prctl") if sys.platform.startswith("linux") else None
    if prctl is None:
        return None
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)
    return functools.partial(prctl, pr_set_pdeathsig, sigkill, 0, 0, 0)


def warm_up() -> None:
    """Look up now what every call_in_child would (prctl, through ctypes): the pyree_build
    server does it once, before it forks, for all its workers."""
    _set_pdeathsig()


def call_in_child(fn: Callable[..., object], *args: object, what: str, file: str | os.PathLike[str] | None, timeout: float) -> object:
    """Run `fn(*args)` in a forked child (its own process group) and return its result.

    For code that is not ours to trust inside this process (a plugin's query function): a
    crash or a hang there becomes a PyreeError naming the signal or the timeout, never the
    end of pyree_build. `fn` returns or raises something picklable; a PyreeError it raises is
    raised here as it was.
    """
    stops.check_stopped()
    bound, command_limit = stops._bounded(timeout)
    timeout = timeout if bound is None else bound
    die_with_parent = _set_pdeathsig()
    # Loaded here, in the parent: the forked child must not import (another thread may have
    # held the import lock at the fork).
    dumps = pickle.dumps
    max_fd = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    with stops._spawning():
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            _run_child(fn, args, read_fd, write_fd, max_fd, die_with_parent, dumps)
        os.close(write_fd)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # also here: the child may not have run yet
        stops._register(pid, what)
    ticks = reaping.start_ticks(pid) if reaping._SUBREAPER else None
    child = _Child(pid)
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            chunks, timed_out = _read_until_closed(pipe, time.monotonic() + timeout, child)
        if timed_out or not child(10.0):
            reaping.end_group(pid, child)
    except BaseException:
        if child.status is None:
            reaping.end_group(pid, child)
        raise
    finally:
        stops._unregister(pid)
        if ticks is not None:  # what the code forked (a plugin's constructor, its query) was reparented here
            reaping.end_descendants(tool=(pid, ticks))
    if timed_out:
        raise PyreeError(f"{what} did not return within {command_limit} (it was stopped)", file=file,
                         fix="look for an endless loop or a blocking call in that code")  # fmt: skip
    return _child_result(child.status or 0, chunks, what=what, file=file)


def _run_child(
    fn: Callable[..., object], args: tuple[object, ...], read_fd: int, write_fd: int, max_fd: int,
    die_with_parent: Callable[[], None] | None, dumps: Callable[[object], bytes],
) -> NoReturn:  # fmt: skip
    """The forked child: run `fn`, write its pickled outcome to `write_fd`, and exit."""
    code = 0
    try:
        # The fork happened under _SPAWN_LOCK (and maybe another thread's _LIVE_LOCK): this
        # child's copies stay held, and the parent's tools are not this child's to end.
        stops._SPAWN_LOCK, stops._LIVE_LOCK, stops._SPAWNING = threading.Lock(), threading.RLock(), False
        stops._LIVE.clear()
        os.close(read_fd)
        # Nothing of the parent's but the standard streams: other threads' tool pipes (their
        # read ends: the sweep for a daemon holding them would take this child for one) and,
        # in a server worker, the client's connection.
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, max_fd)
        os.setpgid(0, 0)
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        if die_with_parent is not None:
            die_with_parent()
        try:
            payload = dumps(("ok", fn(*args)))
        except PyreeError as err:
            payload = dumps(("pyree", (err.what, err.file, err.fix, err.details)))
        except BaseException as exc:  # noqa: BLE001 - reported by the parent
            payload = dumps(("error", f"{type(exc).__name__}: {exc}"))
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)


class _Child:
    """A forked child as end_group()'s wait_leader; keeps its wait status once reaped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status: int | None = None

    def __call__(self, seconds: float) -> bool:
        if self.status is not None:  # reaped already
            return True
        end = time.monotonic() + seconds
        pause = 0.0002  # the child is usually exiting already: look again soon, then less often
        while True:
            done, st = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = st
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.01)


def _read_until_closed(pipe: BinaryIO, deadline: float, child: _Child) -> tuple[list[bytes], bool]:
    """What the child wrote until its end closed, and whether `deadline` came first. Once the
    child has exited, a descendant it left holding the pipe (a fork, even after setsid()) is
    ended rather than waited for. Raises Stopped when a stop comes meanwhile."""
    chunks: list[bytes] = []
    exited_at: float | None = None
    while True:
        if stops._STOP_SIGNAL is not None:
            raise stops.Stopped(stops._STOP_SIGNAL)
        left = deadline - time.monotonic()
        if left <= 0:
            return chunks, True
        ready, _, _ = select.select([pipe], [], [], min(left, 0.25 if exited_at is None else reaping._DRAIN_S))
        if not ready and child(0.0):
            exited_at = exited_at or time.monotonic()
            if time.monotonic() - exited_at >= reaping._DRAIN_S:
                reaping.end_descendants([pipe])
        if ready:
            chunk = pipe.read(65536)
            if not chunk:
                return chunks, False
            chunks.append(chunk)


def _child_result(st: int, chunks: list[bytes], *, what: str, file: str | os.PathLike[str] | None) -> object:
    """The value the child returned, or the PyreeError for how it ended."""
    if os.WIFSIGNALED(st):
        raise PyreeError(f"{what} crashed: killed by {stops.signal_name(os.WTERMSIG(st))}", file=file,
                         fix="debug that code (e.g. under gdb); pyree_build ran it in a child process, so nothing else was harmed")  # fmt: skip
    if not chunks:
        code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else st
        raise PyreeError(f"{what} ended the process (exit code {code}) without returning", file=file,
                         fix="the code must return, not call exit()")  # fmt: skip
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "pyree":
        what_, file_, fix_, details_ = value
        raise PyreeError(what_, file=file_, fix=fix_, details=details_)
    if kind == "error":
        raise PyreeError(f"{what} failed: {value}", file=file)
    return value
