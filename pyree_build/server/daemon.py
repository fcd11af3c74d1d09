"""The per-user server: a warm process that has imported what commands need and forks one
worker per connection, so a command costs a fork instead of a Python start-up and its imports.

The accept loop is single-threaded and starts no threads (BLAS pools are held to one thread
before numpy loads), so fork is safe. A worker owns its connection: it receives the client's
fds 0-2 and runs the CLI on them (output goes straight to the client's terminal or pipes, in
order, isatty where it is), in the client's cwd, umask and environment; a signal number from
the client is raised in the worker (processes.stop_on_signals stops the tools as in process),
and the client vanishing is a SIGTERM. The server exits after an idle time, when its package
files change (it answers "stale", so the client starts a fresh one), or on `server stop`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import gc
import importlib
import io
import json
import mmap
import os
import pkgutil
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from pyree_build.cache import facts
from pyree_build.client import protocol
from pyree_build.core import lazy, libc, processes
from pyree_build.server import prefault, reuse
from pyree_build.server.watch import Watch

# Every module of pyree_build is imported by the server, and every module they name lazily
# (core/lazy.py: numpy, pyelftools, cuda.bindings, concurrent.futures...), so a worker starts
# with what a verb needs loaded (~0.5 s, once; a worker importing pyelftools and a thread pool
# itself cost ~60 ms a plugin build). Except these, by name or package: a Ray client and
# onnxruntime start threads; IREE's Python bindings and onnx hold 25-80 MB that every fork would
# map, for the few verbs that use them.
NOT_PRELOADED = ("pyree_build.tuning.on_ray", "onnxruntime", "onnx", "iree.runtime", "iree.compiler")
# Each thread pool a native library would start at import (numpy's BLAS) is held to one
# thread: the server must have no thread when it forks.
_ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
_REQUEST_TIMEOUT_S = 30.0
# Learning which pages workers write (server/prefault.py): a report adding fewer pages than
# _SETTLED_BELOW is "settled"; after _SETTLED_AFTER of those in a row, one worker in
# _REPORT_EVERY reports.
_SETTLED_BELOW, _SETTLED_AFTER, _REPORT_EVERY = 16, 8, 64
_PR_SET_PDEATHSIG = 1  # for a client to send its request once connected
# A worker's report (_report) is one datagram: its kind, then pages or facts (JSON).
_PAGES, _FACTS, _MAX_REPORT = b"P", b"F", 1 << 18  # the default socket buffer caps a datagram about there
_SPARES, _QUIET_S = 2, 0.05  # spare workers kept waiting, and when they are forked: see _Pool
# A worker serves at most _COMMANDS commands (server/reuse.py), and waits for the next one at
# most _AGAIN_S: the workers a parallel build left beyond the pool's size then exit.
_COMMANDS, _AGAIN_S = 500, 20.0


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
    # protocol.context() of the server, after its imports: what every worker runs with,
    # so the only context it may serve.
    context: bytes = b""
    bound: str = ""  # the name the listening socket was bound to: a client's end reports it as its peer
    plan: reuse.Plan = field(default_factory=reuse.Plan)  # where pyree_build keeps state (server/reuse.py)
    reaps: bool = False  # the server is a subreaper: a killed worker's tools become its children (_Pool.reap)

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


def _log(text: str, fd: int = 2) -> None:
    """One line to the server's log (its stderr), timestamped. A write that fails (a full
    disk, the log on /dev/full) loses the line, never the server: a failing print() raised
    in the accept loop and took it down, and every new server died at its first line."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n".encode(errors="backslashreplace")
    with contextlib.suppress(OSError):
        os.write(fd, line)


def _preload() -> None:
    for name in _ONE_THREAD:
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
            _log(f"preload {module}: {err}")


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
                _log(f"warm-up of {loaded.__name__}: {err}")


def _listen(path: str) -> tuple[socket.socket, int, str]:
    """Bind beside `path` and rename onto it: a client sees no socket or a listening one."""
    tmp = os.path.join(os.path.dirname(path), f".{os.getpid()}.tmp")  # no longer than `path`: sun_path is short
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(tmp)
    os.chmod(tmp, 0o600)
    sock.listen(128)
    os.rename(tmp, path)
    return sock, os.stat(path).st_ino, tmp


def _ours(state: State) -> bool:
    try:
        return os.stat(state.path).st_ino == state.inode
    except OSError:
        return False


def unlink_if_ours(state: State) -> None:
    if _ours(state):
        with contextlib.suppress(OSError):
            os.unlink(state.path)


def _on_term(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyree_build.server", description="the per-user pyree_build server (started by the client)")
    parser.add_argument("--socket", required=True, help="the socket path (core/protocol.socket_path)")
    parser.add_argument("--idle", type=float, default=None, help=f"seconds without work before exiting (default ${protocol.IDLE_ENV} or 900)")
    a = parser.parse_args(argv)
    os.closerange(3, 1 << 16)  # nothing the client's parent passed down (a jobserver's pipe) stays open here
    try:
        idle = protocol.idle_seconds({protocol.IDLE_ENV: str(a.idle)} if a.idle is not None else os.environ)
    except protocol.BadSetting as err:
        raise SystemExit(str(err)) from None
    state = State(a.socket, idle, Watch())  # before the imports: an edit during them is seen
    gc.disable()  # no collection in the server: it would leave freed holes in pages its workers share
    _preload()
    facts.absorb([])  # what the imports learned is the server's own: no worker reports it back
    state.plan = reuse.Plan.of_loaded()
    libc.function("prctl")  # looked up before the forks
    context = protocol.context()
    if context is None:
        raise SystemExit("pyree_build server: /proc/self cannot be read, so no client's context can be compared with this server's")
    state.context = context
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.chdir("/")  # no client's directory is held busy
    state.reaps = processes.become_subreaper()
    sock, state.inode, state.bound = _listen(a.socket)
    _log(f"pid {os.getpid()} listening on {a.socket}")
    try:
        serve(sock, state)
    finally:
        if os.getpid() == state.pid:  # never in a forked spare or worker (see _spare)
            unlink_if_ours(state)
    return 0


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
                _log(f"worker {pid} was killed by {signal.Signals(os.WTERMSIG(status)).name}")


def _die_with_parent(parent: int | None) -> None:
    """A spare dies with the server (SIGKILL, a crash): else it would hold the socket open and
    take one more client, after which nobody accepts and clients would hang instead of starting
    a new server. A worker (parent None) outlives it: `server stop` lets commands finish."""
    prctl = libc.function("prctl")
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL) if parent else 0, 0, 0, 0)
    if parent and os.getppid() != parent:  # it died before prctl
        os._exit(0)


@dataclass
class _Spare:
    """A worker forked ahead of its request, and the pipe on which the server tells it that
    no worker is busy, so it may copy pages ahead (_wait_for_client)."""

    pid: int
    go: int  # -1 for a worker back from a command (told already: it copies nothing ahead)
    ticks: int  # when it started (/proc/PID/stat): what it starts is no older
    told: bool = False

    def tell(self) -> None:
        if not self.told:
            self.told = True
            with contextlib.suppress(OSError):
                os.write(self.go, b"g")


def _notice(kind: bytes) -> bytes:
    """What a spare ("a": it took a client) or a worker ("d": its command is done and it exits;
    "r": done, and it waits for another client) tells the server: one pipe write under PIPE_BUF,
    so notices from several processes never interleave."""
    return kind + struct.pack("<i", os.getpid())


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
        _die_with_parent(parent)
        conn, copied = _wait_for_client(sock, state, go_r)
        assert conn is not None  # no timeout: it waits until a client comes or the server ends
        _die_with_parent(None)
        os.write(notices, _notice(b"a"))
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


def _wait_for_client(sock: socket.socket, state: State, go: int, timeout: float | None = None) -> tuple[socket.socket | None, set[int]]:
    """Wait for a client (the listening socket is non-blocking, so of the spares woken by one
    client, those that lose the race to accept go on waiting), copying pages ahead once the
    server says no command runs: a copy made while a command runs takes the CPU from it on a
    machine with few cores. A client that comes first is served at once, without the copies.
    No connection (None) after `timeout` seconds; `go` -1: no copies (a worker back from a command)."""
    copied: set[int] = set()
    waiting: list[socket.socket | int] = [sock, go] if go >= 0 else [sock]
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        ready, _, _ = select.select(waiting, [], [], None if deadline is None else max(0.0, deadline - time.monotonic()))
        if not ready and deadline is not None and time.monotonic() >= deadline:
            return None, copied
        if go in ready:
            waiting = [sock]
            copied = prefault.copy_ahead(frozenset(state.learned), lambda: bool(select.select([sock], [], [], 0)[0]))
        if sock in ready or go in ready:
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                continue
            conn.setblocking(True)
            return conn, copied


def _drain(fd: int) -> list[tuple[bytes, int]]:
    """The notices (_notice) waiting on the non-blocking pipe: (kind, pid) each."""
    data = b""
    with contextlib.suppress(BlockingIOError):
        data = os.read(fd, 4095)
    return [(data[i : i + 1], struct.unpack("<i", data[i + 1 : i + 5])[0]) for i in range(0, len(data) - 4, 5)]


@dataclass
class _Pool:
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
        for kind, pid in _drain(self.notices_r):
            if kind == b"a":
                self.spares.pop(pid, None)
        for pid in self.spares:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


def serve(sock: socket.socket, state: State) -> None:
    """Keep spare workers waiting for connections until idle (no request, no worker) for
    state.idle_s, or until the socket is no longer ours (removed, or taken by a newer server)."""
    notices_r, notices_w = os.pipe()
    os.set_blocking(notices_r, False)
    sock.setblocking(False)  # for the spares: see _wait_for_client
    reports, state.report = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    reports.setblocking(False)
    # A worker's end is seen at once (SIGCHLD wakes the loop), so the tools of one that was
    # killed are ended at once too.
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    pool = _Pool(sock, state, notices_w, notices_r)
    pool.refill(client_waiting=False)
    last = time.monotonic()
    try:
        while True:
            pool.reap()
            now = time.monotonic()
            if pool.children:
                last = now
            elif now - last >= state.idle_s or not _ours(state):
                return
            # The listening socket only when no spare is left to take a client (else they do).
            waits: list[int | socket.socket] = [notices_r, reports.fileno(), wake_r, *([] if pool.spares else [sock])]
            quiet = pool.quiet_in()
            timeout = max(0.0, min(1.0, state.idle_s - (now - last), quiet if quiet is not None else 1.0))
            ready, _, _ = select.select(waits, [], [], timeout)
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            _learn(reports, state)
            for kind, pid in _drain(notices_r) if notices_r in ready else []:
                pool.note(kind, pid)
            pool.reap()
            if pool.refill(client_waiting=sock in ready):
                last = time.monotonic()
    finally:
        # Only the server: a forked worker must never get here (_spare), as its copies of the
        # spares are other processes' workers, and its _drain would take the server's notices.
        if os.getpid() == state.pid:
            pool.kill_spares()


def _learn(reports: socket.socket, state: State) -> None:
    """Take what workers reported: the pages they wrote, which the next spares copy ahead; the
    facts they learned (cache/facts.py), which the next spares then know."""
    while True:
        try:
            data = reports.recv(_MAX_REPORT)
        except BlockingIOError:
            return
        if data[:1] == _FACTS:
            with contextlib.suppress(ValueError):
                facts.absorb(json.loads(data[1:]))
            continue
        new = prefault.learn(state.learned, prefault.decode(data[1:]))
        state.settled = state.settled + 1 if new < _SETTLED_BELOW else 0
        state.learned_pages = len(state.learned)


def _report(state: State, copied: set[int] | None) -> None:
    """Tell the server the facts this worker learned, and which pages it wrote that its spare
    had not copied ahead (`copied` None: none, after its first command they are its own). A
    scan of pagemap costs a few ms of CPU: once reports add almost nothing, one worker in
    _REPORT_EVERY still reports (a verb not seen yet)."""
    if state.report is None:
        return
    learned = facts.hand_over()
    if learned:
        with contextlib.suppress(OSError, ValueError):  # never waits: a server gone or busy (or a report too long) misses it
            state.report.send(_FACTS + json.dumps(learned).encode(), socket.MSG_DONTWAIT)
    if copied is None or (state.settled >= _SETTLED_AFTER and state.requests % _REPORT_EVERY):
        return
    new = [page for page in prefault.written_since_fork() if page not in copied and page not in state.learned]
    with contextlib.suppress(OSError):
        state.report.send(_PAGES + prefault.encode(new[: prefault.MAX_LEARNED]), socket.MSG_DONTWAIT)


def _receive(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    conn.settimeout(_REQUEST_TIMEOUT_S)
    head, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * struct.calcsize("i")), socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4])
    if len(head) != 4:
        raise ValueError("short request")
    (size,) = struct.unpack("<I", head)
    body = b""
    while len(body) < size:
        chunk = conn.recv(min(1 << 16, size - len(body)))
        if not chunk:
            raise ValueError("truncated request")
        body += chunk
    conn.settimeout(None)
    return protocol.decode(body), fds


def _print_exc() -> None:
    """traceback.print_exc() to the client's stderr, which may be gone (a ninja job's pipe once
    ninja was stopped): a failure to print is not an error of the command's."""
    with contextlib.suppress(BaseException):
        traceback.print_exc()


def worker(conn: socket.socket, sock: socket.socket, state: State, copied: set[int], notices: int) -> None:
    """Serve connections, then _exit: a worker never returns into the accept loop, not even
    when printing its error fails (BrokenPipeError) or a signal's exception comes meanwhile.
    It tells the server (`notices`) when each command is done, before its own report; after
    a command it could be put back as it was forked (server/reuse.py), it waits on `sock` for
    the next client as a spare does, else it exits."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)  # the server's, which its SIGCHLDs wake
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        baseline = reuse.Baseline.capture(state.plan, but=conn.fileno())
        for served in range(_COMMANDS):
            if served:
                state.count_again()
            code, clean = _answer(conn, state, *_receive(conn))
            conn.close()  # the client has its answer: what follows is off its path
            again = clean and served + 1 < _COMMANDS and _may_serve_again(state, baseline)
            with contextlib.suppress(OSError):
                os.write(notices, _notice(b"r" if again else b"d"))
            _report(state, None if served else copied)
            if not again:
                break
            code, following = 0, _next_client(sock, state, notices)
            if following is None:
                break
            conn = following
    except BaseException:  # noqa: BLE001 - a worker reports on its client's stderr and exits; it must never return
        _print_exc()
    finally:
        os._exit(code)


def _may_serve_again(state: State, baseline: reuse.Baseline) -> bool:
    """Whether this worker, its command done, is put back as forked (else it exits)."""
    if os.getppid() != state.pid or not _ours(state):  # its server exited, or is retiring
        return False
    try:
        left = baseline.why_not()
        if left is None:
            baseline.restore()
    except Exception as err:  # noqa: BLE001 - a worker that cannot tell (or put back) its state exits, as before reuse
        left = f"its state could not be checked or put back ({err!r})"
    if left is not None:
        _log(f"worker {os.getpid()} exits after its command: {left}", baseline.std[2])  # fd 2 may still be the client's
        return False
    return True


def _next_client(sock: socket.socket, state: State, notices: int) -> socket.socket | None:
    """As a spare again: die with the server while waiting, outlive it once serving."""
    _die_with_parent(state.pid)
    conn, _ = _wait_for_client(sock, state, -1, _AGAIN_S)
    if conn is not None:
        _die_with_parent(None)
        os.write(notices, _notice(b"a"))
    return conn


def _reply(conn: socket.socket, line: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(line.encode() + b"\n")


def status(state: State) -> dict[str, object]:
    return {
        "pid": state.pid,
        "socket": state.path,
        "uptime_s": round(time.time() - state.started, 1),
        "requests": state.requests,
        "idle_timeout_s": state.idle_s,
        "python": sys.executable,
        "identity": protocol.identity(),
        "learned_pages": state.learned_pages,
        "served_again": state.again,
        "facts_known": facts.known_count(),
    }


def _answer(conn: socket.socket, state: State, request: dict[str, object], fds: list[int]) -> tuple[int, bool]:
    """The request answered: (exit code, whether it ran cleanly, so that the worker may serve again)."""
    kind = request["kind"]
    client, uid, _gid = protocol.peer(conn)
    if uid != os.geteuid():  # its directory is 0700, but the socket file alone says nothing of who connects
        _reply(conn, f"refused: uid {uid} is not this server's")
        return 1, False
    # Status and stop run nothing of the client's: whoever can reach this socket (this user, its
    # directory is 0700) may ask, whatever pyree_build it runs, so `server stop` always works.
    if kind in ("status", "stop"):
        if kind == "stop":
            _retire(state)  # first: once the client has the answer, no new client reaches this server
        _reply(conn, json.dumps(status(state)))
        state.count_request()
        return 0, kind == "status"
    if request["identity"] != protocol.identity():
        _reply(conn, f"refused: this server is {protocol.identity()}, not {request['identity']}")
        return 1, False
    if state.watch.changed() or not _ours(state):  # its code changed, or it is retiring: a fresh server serves this
        _retire(state)
        _reply(conn, "stale")
        return 0, False
    if kind != "run" or len(fds) != 3:
        _reply(conn, f"refused: a {kind} request with {len(fds)} fds")
        return 1, False
    # The client's own context, read from /proc (never taken from the request): a worker runs
    # with the server's limits, groups, namespaces and root, so only a client equal in all of
    # them is served; another one has a socket of its own (its key hashes its context), so this
    # happens only on a CRC collision or a context changed meanwhile.
    theirs = protocol.context(client)
    if theirs != state.context:
        _reply(conn, f"refused: the client's process context differs from this server's ({protocol.context_differences(state.context, theirs)})")
        return 1, False
    return run(conn, state, request, [_not_a_connection_here(fd, state) for fd in fds])


def _not_a_connection_here(fd: int, state: State) -> int:
    """`fd`, or /dev/null if it is a connection to this server (a client whose fd 0-2 was
    closed when it made its socket passes its own end as the command's stdin or stdout: the
    tools' output then came back as control bytes, and its worker held the client's connection
    open so that a killed client's command ran on)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return fd
        with socket.socket(fileno=os.dup(fd)) as other:
            if other.family != socket.AF_UNIX or other.getpeername() != state.bound:
                return fd
    except OSError:
        return fd
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    os.close(fd)
    return null


def _retire(state: State) -> None:
    """Stop the server this worker was forked from: no new client reaches it (its socket is
    removed now), and it exits at once (SIGTERM); workers already running finish their commands."""
    unlink_if_ours(state)
    if os.getppid() == state.pid:  # else that server is gone already (and the parent is now another process)
        with contextlib.suppress(OSError):
            os.kill(state.pid, signal.SIGTERM)


def _adopt(state: State, request: dict[str, object], fds: list[int]) -> None:
    """Become the client's process: its fds 0-2, cwd, umask, environment and argv."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    env = request["env"]
    assert isinstance(env, dict)
    reuse.become_environment(env)
    os.umask(int(str(request["umask"])))
    cwd = str(request["cwd"])
    os.chdir(cwd)  # never on sys.path: the server was started without it (protocol.BOOT)
    encoding, _, errors = env.get("PYTHONIOENCODING", "").partition(":")
    encoding = encoding or sys.stdout.encoding or "utf-8"
    streams = {
        "stdin": io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding, errors or "strict"),
        "stdout": io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding, errors or "strict", line_buffering=os.isatty(1)),
        # As Python opens stderr: line-buffered, and no character can make writing an error fail.
        "stderr": io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding, "backslashreplace", line_buffering=True),
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)  # what a library restores or writes to after a redirect
    argv = request["argv"]
    assert isinstance(argv, list)
    sys.argv = ["pyree-build", *argv]


class _ClientWatch:
    """The client's signals, raised here; its end closing (it was killed) is a SIGTERM.

    Driven by SIGIO (O_ASYNC on the connection): the kernel interrupts whatever the worker
    waits in, and the handler runs on the main thread, as a signal from a terminal would. A
    thread did this before; starting it cost 0.3-5 ms of every command on a busy machine."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.on, self.raised = conn, True, False
        signal.signal(signal.SIGIO, self._on_io)  # before O_ASYNC: SIGIO's default is to terminate
        fcntl.fcntl(conn.fileno(), fcntl.F_SETOWN, os.getpid())
        self._async(True)
        self._on_io()  # what the client sent before O_ASYNC was set

    def _async(self, on: bool) -> None:
        flags = fcntl.fcntl(self.conn.fileno(), fcntl.F_GETFL)
        fcntl.fcntl(self.conn.fileno(), fcntl.F_SETFL, flags | os.O_ASYNC if on else flags & ~os.O_ASYNC)

    def _on_io(self, _signum: int = 0, _frame: object = None) -> None:
        while self.on:
            try:
                data = self.conn.recv(64, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.stop()
            self.raised = True  # the command may have stopped anywhere: its worker exits after it
            for signum in data or bytes([signal.SIGTERM]):
                signal.raise_signal(signum)

    def stop(self) -> None:
        """No signal of the client's is raised after this (the command is over)."""
        if self.on:
            self.on = False
            with contextlib.suppress(OSError):
                self._async(False)
            signal.signal(signal.SIGIO, signal.SIG_IGN)


def _exit_code(err: SystemExit) -> int:
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def run(conn: socket.socket, state: State, request: dict[str, object], fds: list[int]) -> tuple[int, bool]:
    """Run the CLI as `python -m pyree_build ARGV` would in the client's process: (exit code,
    whether it ended by returning or exiting, no error escaping and no signal of the client's)."""
    _adopt(state, request, fds)
    watch = _ClientWatch(conn)
    _reply(conn, f"ok {os.getpid()}")
    cli_main = importlib.import_module("pyree_build.cli").main
    processes.become_subreaper()  # the worker is the command's whole process: a tool's orphans reparent here
    if state.reaps:
        processes.parent_ends_tools()
    clean = False
    try:
        with processes.command_ends_its_processes():
            code = int(cli_main(sys.argv[1:]))
        clean = True
    except SystemExit as err:
        code, clean = _exit_code(err), True
    except KeyboardInterrupt:
        _print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - as Python reports an uncaught error: traceback, exit 1
        _print_exc()  # the exit line below is sent also when the client's stderr is gone
        code = 1
    atexit._run_exitfuncs()
    watch.stop()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    state.count_request()
    _reply(conn, f"exit {code}")
    return code, clean and not watch.raised
