"""What the server and every worker forked from it share: the server's State (some of it in a
page all of them read as it is now), its log, whether the socket is still this server's, and
the format of a worker's report."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import struct
import time
from dataclasses import dataclass, field

from pyree_build.server import reuse
from pyree_build.server.watch import Watch

# Learning which pages workers write (server/prefault.py): a report adding fewer pages than
# SETTLED_BELOW is "settled"; after SETTLED_AFTER of those in a row, one worker in
# REPORT_EVERY reports.
SETTLED_BELOW, SETTLED_AFTER, REPORT_EVERY = 16, 8, 64
# A worker's report (worker._report) is one datagram: its kind, then pages or facts (JSON).
PAGES, FACTS, MAX_REPORT = b"P", b"F", 1 << 18  # the default socket buffer caps a datagram about there


@dataclass
class State:
    """The server's own facts, which a worker (forked with a copy) reports or checks."""

    path: str
    idle_s: float
    watch: Watch
    started: float = field(default_factory=time.time)
    pid: int = field(default_factory=os.getpid)
    inode: int = 0
    # The pages workers wrote (server/prefault.py), which the next spares copy ahead; workers
    # report them on `report`, a datagram socket the server reads.
    learned: dict[int, None] = field(default_factory=dict)  # in the order last reported (prefault.learn)
    report: socket.socket | None = None
    # Figures the server updates and every worker reads as they are now, not as they were when
    # it was forked (a spare waits through other commands): a page shared by all of them.
    shared: mmap.mmap = field(default_factory=lambda: mmap.mmap(-1, 4 * 8))
    # A record lock (per process, unlike flock's per open file) for workers' increments.
    lock: int = field(default_factory=lambda: os.memfd_create("pyree_build-server-lock"))
    # client.protocol.context() of the server, after its imports: what every worker runs with,
    # so the only context it may serve.
    context: bytes = b""
    bound: str = ""  # the name the listening socket was bound to: a client's end reports it as its peer
    plan: reuse.Plan = field(default_factory=reuse.Plan)  # where pyree_build keeps state (server/reuse.py)
    reaps: bool = False  # the server is a subreaper: a killed worker's tools become its children (Pool.reap)

    def _figure(self, index: int) -> int:
        return int(struct.unpack_from("<Q", self.shared, 8 * index)[0])

    def _set_figure(self, index: int, value: int) -> None:
        struct.pack_into("<Q", self.shared, 8 * index, value)

    @property
    def requests(self) -> int:
        """Requests answered: each worker counts its own before its last reply, so a client
        that has its answer is counted in what the next one is told."""
        return self._figure(0)

    def count_request(self) -> None:
        self._add(0)

    def _add(self, index: int) -> None:
        fcntl.lockf(self.lock, fcntl.LOCK_EX)
        try:
            self._set_figure(index, self._figure(index) + 1)
        finally:
            fcntl.lockf(self.lock, fcntl.LOCK_UN)

    @property
    def again(self) -> int:
        """Commands served by a worker that had served one before (server/reuse.py)."""
        return self._figure(3)

    def count_again(self) -> None:
        self._add(3)

    @property
    def settled(self) -> int:
        """Reports in a row that added almost nothing: then workers report rarely."""
        return self._figure(1)

    @settled.setter
    def settled(self, value: int) -> None:
        self._set_figure(1, value)

    @property
    def learned_pages(self) -> int:
        return self._figure(2)

    @learned_pages.setter
    def learned_pages(self, value: int) -> None:
        self._set_figure(2, value)


def log(text: str, fd: int = 2) -> None:
    """One line to the server's log (its stderr), timestamped. A write that fails (a full
    disk, the log on /dev/full) loses the line, never the server: a failing print() raised
    in the accept loop and took it down, and every new server died at its first line."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n".encode(errors="backslashreplace")
    with contextlib.suppress(OSError):
        os.write(fd, line)


def ours(state: State) -> bool:
    try:
        return os.stat(state.path).st_ino == state.inode
    except OSError:
        return False


def unlink_if_ours(state: State) -> None:
    if ours(state):
        with contextlib.suppress(OSError):
            os.unlink(state.path)
