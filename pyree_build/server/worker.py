"""A worker: a forked process that waits for a client (as a spare), becomes the client's
process (its fds 0-2, cwd, umask, environment, argv), runs its one command through the CLI,
answers its exit code, and then exits or, put back as it was forked (server/reuse.py), waits
for the next client."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib
import io
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import time
import traceback

from pyree_build.cache import facts
from pyree_build.client import protocol
from pyree_build.core import libc, processes
from pyree_build.server import prefault, reuse
from pyree_build.server.state import FACTS, PAGES, REPORT_EVERY, SETTLED_AFTER, State, log, ours, unlink_if_ours

_REQUEST_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1  # for a client to send its request once connected
# A worker serves at most _COMMANDS commands (server/reuse.py), and waits for the next one at
# most _AGAIN_S: the workers a parallel build left beyond the pool's size then exit.
_COMMANDS, _AGAIN_S = 500, 20.0


def die_with_parent(parent: int | None) -> None:
    """A spare dies with the server (SIGKILL, a crash): else it would hold the socket open and
    take one more client, after which nobody accepts and clients would hang instead of starting
    a new server. A worker (parent None) outlives it: `server stop` lets commands finish."""
    prctl = libc.function("prctl")
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL) if parent else 0, 0, 0, 0)
    if parent and os.getppid() != parent:  # it died before prctl
        os._exit(0)


def notice(kind: bytes) -> bytes:
    """What a spare ("a": it took a client) or a worker ("d": its command is done and it exits;
    "r": done, and it waits for another client) tells the server: one pipe write under PIPE_BUF,
    so notices from several processes never interleave."""
    return kind + struct.pack("<i", os.getpid())


def wait_for_client(sock: socket.socket, state: State, go: int, timeout: float | None = None) -> tuple[socket.socket | None, set[int]]:
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


def _report(state: State, copied: set[int] | None) -> None:
    """Tell the server the facts this worker learned, and which pages it wrote that its spare
    had not copied ahead (`copied` None: none, after its first command they are its own). A
    scan of pagemap costs a few ms of CPU: once reports add almost nothing, one worker in
    REPORT_EVERY still reports (a verb not seen yet)."""
    if state.report is None:
        return
    learned = facts.hand_over()
    if learned:
        with contextlib.suppress(OSError, ValueError):  # never waits: a server gone or busy (or a report too long) misses it
            state.report.send(FACTS + json.dumps(learned).encode(), socket.MSG_DONTWAIT)
    if copied is None or (state.settled >= SETTLED_AFTER and state.requests % REPORT_EVERY):
        return
    new = [page for page in prefault.written_since_fork() if page not in copied and page not in state.learned]
    with contextlib.suppress(OSError):
        state.report.send(PAGES + prefault.encode(new[: prefault.MAX_LEARNED]), socket.MSG_DONTWAIT)


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
                os.write(notices, notice(b"r" if again else b"d"))
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
    if os.getppid() != state.pid or not ours(state):  # its server exited, or is retiring
        return False
    try:
        left = baseline.why_not()
        if left is None:
            baseline.restore()
    except Exception as err:  # noqa: BLE001 - a worker that cannot tell (or put back) its state exits, as before reuse
        left = f"its state could not be checked or put back ({err!r})"
    if left is not None:
        log(f"worker {os.getpid()} exits after its command: {left}", baseline.std[2])  # fd 2 may still be the client's
        return False
    return True


def _next_client(sock: socket.socket, state: State, notices: int) -> socket.socket | None:
    """As a spare again: die with the server while waiting, outlive it once serving."""
    die_with_parent(state.pid)
    conn, _ = wait_for_client(sock, state, -1, _AGAIN_S)
    if conn is not None:
        die_with_parent(None)
        os.write(notices, notice(b"a"))
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
    if state.watch.changed() or not ours(state):  # its code changed, or it is retiring: a fresh server serves this
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
    os.chdir(cwd)  # never on sys.path: the server was started without it (client.protocol.BOOT)
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
