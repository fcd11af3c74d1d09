"""What stops a command: SIGINT and SIGTERM (stop_on_signals, request_stop, check_stopped,
Stopped), the registry of every live tool's process group that a stop ends, the spawn lock
that orders a fork before its registration, and a command's time limit (time_limit).

The registry's globals (_LIVE, _LIVE_LOCK, _SPAWN_LOCK, _SPAWNING, _STOP_SIGNAL) live here
only: the other modules of this package read and rebind them as `stops._NAME`, never through
a copy (a forked child rebinds the locks, a stop the signal)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import threading
import time
from collections.abc import Iterator


class Stopped(KeyboardInterrupt):
    """pyree_build was asked to stop (SIGINT or SIGTERM); every tool it started has been ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them


# Every running child, by process group (= its pid: each runs in its own session), so that a
# stop can end all of them, also those started by worker threads.
_LIVE: dict[int, str] = {}
# Reentrant: the stop handler reads _LIVE and may run in the main thread while it holds the lock.
_LIVE_LOCK = threading.RLock()
# Held from a child's fork to its registration in _LIVE, and by every sweep for what a tool
# left behind (end_descendants). Without it a sweep in one thread saw another thread's child
# before it was registered (an orphan of ours, by its parent pid and start time) and killed
# it, and a child forked while another thread's Popen still held its pipes' write ends kept
# them (call_in_child's fork never execs) and was taken for a daemon holding that tool's pipes.
_SPAWN_LOCK = threading.Lock()
_STOP_SIGNAL: int | None = None


class _Deadline:
    """When the whole command must be done (time.monotonic()), and the limit it was given."""

    def __init__(self, at: float, total: float) -> None:
        self.at = at
        self.total = total


# The bound of the command under way in this thread (None: unbounded). Every tool and child it
# starts gets what is left of it, so that a command has one bound, however many steps it takes.
_DEADLINE: contextvars.ContextVar[_Deadline | None] = contextvars.ContextVar("pyree_build_deadline", default=None)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """While in this block, every tool and child started here ends within `seconds` from now
    in all (an outer, earlier limit still holds). None: no limit of its own."""
    if seconds is None:
        yield
        return
    outer = _DEADLINE.get()
    limit = _Deadline(time.monotonic() + seconds, seconds)
    token = _DEADLINE.set(outer if outer is not None and outer.at <= limit.at else limit)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _bounded(timeout: float | None) -> tuple[float | None, str | None]:
    """The seconds a tool may run: its own `timeout` or what is left of the command's limit,
    whichever ends first; and the limit to name when it runs out ("5 s, the command's limit")."""
    limit = _DEADLINE.get()
    if limit is None:
        return timeout, None if timeout is None else f"{timeout:g} s"
    left = max(0.0, limit.at - time.monotonic())
    if timeout is None or left < timeout:
        return left, f"{limit.total:g} s, the command's time limit (--timeout)"
    return timeout, f"{timeout:g} s"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _register(pgid: int, name: str) -> None:
    with _LIVE_LOCK:
        _LIVE[pgid] = name
    if _STOP_SIGNAL is not None:  # the stop came while this child was starting
        _killpg(pgid, signal.SIGTERM)


def _unregister(pgid: int) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(pgid, None)


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _terminate_all() -> None:
    with _LIVE_LOCK:
        groups = list(_LIVE)
    for pgid in groups:
        _killpg(pgid, signal.SIGTERM)


def request_stop(signum: int) -> None:
    """Stop every tool now (SIGTERM to each group); each spawn() then ends its own and raises Stopped."""
    global _STOP_SIGNAL
    if _STOP_SIGNAL is None:
        _STOP_SIGNAL = signum
    _terminate_all()


def check_stopped() -> None:
    if _STOP_SIGNAL is not None:
        raise Stopped(_STOP_SIGNAL)


def _on_stop_signal(signum: int, _frame: object) -> None:
    """The SIGINT/SIGTERM handler stop_on_signals installs. Between a child's fork and its
    registration the stop is only recorded: raised there, it left a started tool that nothing
    would end; registered, the child is ended at once (_register) and the wait that follows
    raises Stopped. In a shielded block it is raised when the block ends."""
    global _HELD_STOP
    first = _STOP_SIGNAL is None
    request_stop(signum)
    if not first or _SPAWNING:  # a second signal must not interrupt the cleanup of the first
        return
    if _SHIELD_DEPTH:
        _HELD_STOP = signum
        return
    raise Stopped(signum)


# How many shielded blocks the main thread is in, and the stop that came meanwhile (shielded).
_SHIELD_DEPTH = 0
_HELD_STOP: int | None = None


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A block that a stop must not cut short: removing a command's temporaries, renaming a set
    of outputs that belong together into place. A SIGINT or SIGTERM that comes meanwhile ends
    every tool at once, as always, and raises Stopped when the outermost such block is over.
    A stop raised halfway left a scratch directory half removed, or one sm's PTX renamed into
    place and not the other's. Signals reach only the main thread: elsewhere a plain block."""
    global _SHIELD_DEPTH, _HELD_STOP
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _SHIELD_DEPTH += 1
    try:
        yield
    finally:
        _SHIELD_DEPTH -= 1
        if not _SHIELD_DEPTH and _HELD_STOP is not None:
            held, _HELD_STOP = _HELD_STOP, None
            raise Stopped(held)


# Whether the main thread (where signal handlers run) is between a fork and its registration.
_SPAWNING = False


@contextlib.contextmanager
def _spawning() -> Iterator[None]:
    """_SPAWN_LOCK, and for the main thread the stop handler's deferral (_on_stop_signal)."""
    global _SPAWNING
    main = threading.current_thread() is threading.main_thread()
    with _SPAWN_LOCK:
        if main:
            _SPAWNING = True
        try:
            yield
        finally:
            if main:
                _SPAWNING = False


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While in this block, SIGINT and SIGTERM end every tool pyree_build started and raise
    `Stopped` (a KeyboardInterrupt) in the main thread, so `finally` blocks remove temporaries.

    The CLI runs every verb inside it; Python callers may use `with pb.stop_on_signals():`.
    Outside the main thread it does nothing (Python delivers signals to the main thread only).
    """
    global _STOP_SIGNAL, _HELD_STOP
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _on_stop_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        _STOP_SIGNAL = _HELD_STOP = None
