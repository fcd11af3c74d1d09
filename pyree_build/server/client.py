"""`pyree-build` and `python -m pyree_build`: hand the command to the per-user server, or run it
in this process (PYREE_BUILD_SERVER=off, the `server` verb, or no server to be had).

Kept to the standard library's smallest modules and client/protocol.py: this module's
imports are the Python client's whole start-up cost; the CLI loads only on the in-process path.
"""

from __future__ import annotations

import errno
import fcntl
import importlib
import os
import signal
import socket
import sys
import time

from pyree_build.client import protocol

# How long a first client waits for the server it started to listen (its imports take ~0.5 s).
START_TIMEOUT_S = 20.0
# Verbs that run in the client's own process: `server` inspects or stops the server itself.
IN_PROCESS_VERBS = ("server",)
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
REFUSED = -1  # _exchange: the server will not serve this client (another identity)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    protocol.std_fds_open()  # before any socket exists: one must never land on fds 0-2
    _std_streams()
    try:
        serve = protocol.enabled() and not any(a in IN_PROCESS_VERBS for a in args[:3])
        if serve:
            protocol.idle_seconds()
    except protocol.BadSetting as err:
        print(err, file=sys.stderr)
        return 1
    if serve:
        code = served(args)
        if code is not None:
            return code
    return in_process(args)


def _std_streams() -> None:
    """Python leaves sys.stdout (stdin, stderr) None when its fd was closed at start-up, and a
    command's first print or flush failed; std_fds_open() has put /dev/null on that fd since."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        if getattr(sys, name) is None:
            stream = open(fd, "r" if fd == 0 else "w", closefd=False, errors="backslashreplace" if fd == 2 else None)  # noqa: SIM115 - it lives as long as the process
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)


def in_process(args: list[str]) -> int:
    """The command in this process, which is the whole program (the console script, `python -m
    pyree_build`, the native client's fallback): so it may reap a tool's orphans itself."""
    processes = importlib.import_module("pyree_build.core.processes")
    processes.become_subreaper()
    cli_main = importlib.import_module("pyree_build.cli").main
    with processes.command_ends_its_processes():
        return int(cli_main(args))


def _note(text: str) -> None:
    print(f"pyree_build: {text}; running in this process", file=sys.stderr)


def served(args: list[str]) -> int | None:
    """The command's exit code as the server's worker ran it; None when no server can take it."""
    try:
        path = protocol.socket_path()
        cwd = os.getcwd()
    except protocol.Unsafe as err:
        _note(f"not using the server: {err}")
        return None
    except OSError:
        return None
    frame = protocol.encode("run", args, os.environ, cwd)
    for _attempt in range(3):
        sock = connect_or_start(path)
        if sock is None:
            return None
        with sock:
            code = _exchange(sock, frame, path)
        if code == REFUSED:
            return None
        if code is not None:
            return code
    return None


class _Forward:
    """Signal handler: each signal the client gets goes to the worker, which stops as the CLI
    does in process (its tools ended, temporaries removed, exit 128 + the signal)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.last: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.last = signum
        try:  # noqa: SIM105 - contextlib.suppress would add an import to every client's start-up
            self.sock.send(bytes([signum]))
        except OSError:
            pass


def _exchange(sock: socket.socket, frame: bytes, path: str) -> int | None:
    """Send the request and wait for the exit code; None: nothing ran, try again."""
    forward = _Forward(sock)
    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        try:
            protocol.send_request(sock, frame, [0, 1, 2])  # open, and none of them a socket of ours (main)
            reply = protocol.read_line(sock)
        except OSError:
            return None
        if not reply.startswith("ok "):
            if reply.startswith("refused"):
                _note(f"the server {reply}")
                return REFUSED
            return None  # "stale" (the server exits; the next try starts a fresh one) or gone
        try:
            end = protocol.read_line(sock)
        except OSError:
            end = ""
        if end.startswith("exit "):
            return int(end.split()[1])
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
    print(f"pyree_build: the server's worker ended without an exit code (its log: {_log_path(path)})", file=sys.stderr)
    return 1 if forward.last is None else 128 + forward.last


def _log_path(path: str) -> str:
    return path.removesuffix(".sock") + ".log"


_NOBODY = object()  # no server listens: start one


def _connect(path: str) -> socket.socket | None | object:
    """A connection; _NOBODY when no server listens there; None when the socket cannot be used."""
    try:
        return protocol.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        return _NOBODY
    except protocol.NotOurs as err:
        _note(f"not using the server: {err}")
        return None
    except OSError:
        return None


def connect_or_start(path: str) -> socket.socket | None:
    """A connection to the server at `path`, started if none answers; one client starts it while
    the others wait on the lock (ninja -j). None: the server could not be started."""
    first = _connect(path)
    if first is not _NOBODY:
        return first  # type: ignore[return-value]
    lock = os.open(path.removesuffix(".sock") + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        again = _connect(path)  # another client may have started it while this one waited
        return _start(path) if again is _NOBODY else again  # type: ignore[return-value]
    finally:
        os.close(lock)


def _start(path: str) -> socket.socket | None:
    """Start a server for `path` (its own session, fds 0-2 on /dev/null and its log) and wait until it listens."""
    try:  # noqa: SIM105 - contextlib.suppress would add an import to every client's start-up
        os.unlink(path)  # a dead server's socket: nobody listens on it
    except FileNotFoundError:
        pass
    log = _log_path(path)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    argv = protocol.boot_argv("server", ["--socket", path])
    try:
        pid = os.posix_spawn(sys.executable, argv, os.environ, file_actions=actions, setsid=True)
    except OSError:
        return None
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return protocol.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                return None
        if os.waitpid(pid, os.WNOHANG)[0]:
            return None  # it exited: its log says why
        time.sleep(0.01)
    return None
