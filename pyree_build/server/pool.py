"""The server's pool: spare workers forked ahead of their clients (each copies pages ahead
while no command runs), the workers serving commands, and the children a worker left behind,
which the server (a subreaper) ends and reaps."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import struct
import time
from dataclasses import dataclass, field

from pyree_build.core import processes
from pyree_build.server.state import State, log
from pyree_build.server.worker import die_with_parent, notice, wait_for_client, worker

_SPARES, _QUIET_S = 2, 0.05  # spare workers kept waiting, and when they are forked: see Pool


def _reap(children: dict[int, int]) -> None:
    """Forget the workers that ended; the log names any a signal killed (its client then saw
    the connection close without an exit code)."""
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            del children[pid]
            if os.WIFSIGNALED(status):
                log(f"worker {pid} was killed by {signal.Signals(os.WTERMSIG(status)).name}")


@dataclass
class _Spare:
    """A worker forked ahead of its request, and the pipe on which the server tells it that
    no worker is busy, so it may copy pages ahead (wait_for_client)."""

    pid: int
    go: int  # -1 for a worker back from a command (told already: it copies nothing ahead)
    ticks: int  # when it started (/proc/PID/stat): what it starts is no older
    told: bool = False

    def tell(self) -> None:
        if not self.told:
            self.told = True
            with contextlib.suppress(OSError):
                os.write(self.go, b"g")


def _spare(sock: socket.socket, state: State, notices: int) -> _Spare:
    """Fork a worker ahead of its request: it copies the memory it shares with the server
    when told no command runs (server/prefault.py), takes a client, says so on `notices`, and
    serves it. The fork (~2 ms) and most page copies (~4 ms) are then off every request's path."""
    gc.freeze()  # the worker's collections never touch (so never copy) the server's objects
    parent = os.getpid()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(go_r)
        return _Spare(pid, go_w, processes.start_ticks(pid) or 0)
    gc.enable()
    try:
        os.close(go_w)
        die_with_parent(parent)
        conn, copied = wait_for_client(sock, state, go_r)
        assert conn is not None  # no timeout: it waits until a client comes or the server ends
        die_with_parent(None)
        os.write(notices, notice(b"a"))
        os.close(go_r)
    except BaseException:  # noqa: BLE001 - a spare killed while it waits (the server exiting)
        os._exit(0)
    try:
        worker(conn, sock, state, copied, notices)  # never returns
    finally:
        # Nor may an exception: unwinding here would run serve()'s and main()'s cleanup in this
        # worker, which SIGKILLs the server's other spares (by then maybe other commands'
        # workers) and removes the server's socket.
        os._exit(1)


def drain(fd: int) -> list[tuple[bytes, int]]:
    """The notices (notice) waiting on the non-blocking pipe: (kind, pid) each."""
    data = b""
    with contextlib.suppress(BlockingIOError):
        data = os.read(fd, 4095)
    return [(data[i : i + 1], struct.unpack("<i", data[i + 1 : i + 5])[0]) for i in range(0, len(data) - 4, 5)]


@dataclass
class Pool:
    """The spares waiting for clients and the workers serving them.

    A fork write-locks memory-map structures the server shares with its workers, so a fork
    while a command runs stalled it by 1-3 ms; a pool of spares lets the server fork only when
    no command has run for _QUIET_S (a command typed or run by a build right after another
    finds a spare forked before both), or when a client waits and no spare is left."""

    sock: socket.socket
    state: State
    notices: int  # the pipe's write end, which the spares inherit
    notices_r: int
    spares: dict[int, _Spare] = field(default_factory=dict)
    children: dict[int, int] = field(default_factory=dict)  # workers not reaped, and their start ticks
    busy: set[int] = field(default_factory=set)  # workers whose command is not done (they may still be reporting)
    last_done: float = 0.0  # when a command last ended (time.monotonic())

    def quiet_in(self) -> float | None:
        """Seconds until the pool may be topped up (0: now), None while a command runs or it is full."""
        if self.busy or len(self.spares) >= _SPARES:
            return None
        return max(0.0, self.last_done + _QUIET_S - time.monotonic())

    def refill(self, client_waiting: bool) -> bool:
        """Fork a spare for a waiting client if none is left; top the pool up once quiet. True if it forked."""
        forked = False
        while (not self.spares and client_waiting) or (len(self.spares) < _SPARES and self.quiet_in() == 0):
            spare = _spare(self.sock, self.state, self.notices)
            self.spares[spare.pid] = spare
            forked = True
            client_waiting = False
        if not self.busy:
            for spare in self.spares.values():
                spare.tell()
        return forked

    def note(self, kind: bytes, pid: int) -> None:
        if kind == b"a":
            self.busy.add(pid)
            spare = self.spares.pop(pid, None)
            if spare is not None:
                _close(spare.go)
                self.children[pid] = spare.ticks
            return
        if pid in self.busy:
            self.busy.discard(pid)
            self.last_done = time.monotonic()
        if kind == b"r" and pid in self.children:  # a spare again, until its next client ("a") or its exit
            self.spares[pid] = _Spare(pid, -1, self.children.pop(pid), told=True)

    def reap(self) -> None:
        """Forget the workers and spares that ended; end and reap every other child. The server
        is a subreaper: what a worker left running (a killed worker's tools, a plugin's fork
        that outlived its command) was reparented here, and is ended as a pdeathsig wrapper
        would have ended it (processes.parent_ends_tools); one that ended is reaped, never
        left a zombie."""
        _reap(self.children)
        if self.busy - set(self.children):
            self.busy &= set(self.children)
            self.last_done = time.monotonic()
        for pid in list(self.spares):  # killed while it waited, or before its notice came
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                _close(self.spares.pop(pid).go)
        if self.state.reaps:
            processes.end_orphans((self.state.pid, 0), set(self.children) | set(self.spares))

    def kill_spares(self) -> None:
        """On the way out: the spares that have no client of their own to finish."""
        for kind, pid in drain(self.notices_r):
            if kind == b"a":
                self.spares.pop(pid, None)
        for pid in self.spares:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)
