"""The wire between a `pyree-build` client and the per-user server (pyree_build/server/), shared
by the Python client, the server, the `server status|stop` verb and the native client's build.

Standard library only, and only what a client needs: the Python client imports this module
and nothing else of pyree_build before the server answers, so its start-up stays small.
core/native_client.c speaks the same protocol; a change here is a change there (PROTOCOL).

A request is one frame: a 4-byte little-endian length, then NUL-terminated fields
    PROTOCOL, kind ("run" | "status" | "stop"), identity, cwd, umask (octal), argc, argv..., env...
with the client's fds 0, 1, 2 attached to the length (SCM_RIGHTS) for "run". The server's
worker answers lines: "ok PID", "stale", "refused WHY", then "exit CODE" (run) or one JSON line
(status, stop). During a run the client sends one byte per signal it got (the signal number);
its end of the connection closing means it is gone.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import sys

PROTOCOL = "pyree_build-server-1"
SERVER_ENV = "PYREE_BUILD_SERVER"  # "off": each command runs in its own process, without the server
IDLE_ENV = "PYREE_BUILD_SERVER_IDLE"  # seconds without a request before the server exits
DEFAULT_IDLE_S = 900.0
# The environment variables that change what Python imports (sys.path): a server serves only
# clients that agree on them, so a PYTHONPATH'd backend or package is never missed.
PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# sun_path holds 107 bytes and a NUL: a longer $XDG_RUNTIME_DIR (+ /pyree_build/s-KEY.sock,
# 36 bytes) falls back to /tmp.
_MAX_DIR = 64


class Unsafe(Exception):
    """The socket directory may be read or replaced by another user: never used."""


OFF_VALUES = ("off", "0", "no", "false")  # native_client.c has the same list


def enabled(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether commands go to the server: unless PYREE_BUILD_SERVER says off."""
    return env.get(SERVER_ENV, "on").strip().lower() not in OFF_VALUES


def identity() -> str:
    """Which Python, environment and pyree_build this process is: a server serves only its own."""
    return "|".join((PROTOCOL, os.path.realpath(sys.executable), sys.prefix, _PACKAGE_DIR))


# How a client starts a server, or the CLI in a process of its own (the native client's
# fallback): `python -c BOOT PACKAGE_DIR server|cli ARGS...`. Not `python -m`, which puts the
# caller's directory first on sys.path: from a checkout's root (or any directory holding a
# `pyree_build/` or a module named like a dependency) that process would import the caller's
# files instead of the environment's. BOOT drops that entry, then loads exactly the package the
# client runs (PACKAGE_DIR, from its identity) where plain import would find another one.
BOOT = """import importlib.util as u, os, sys
if sys.path and sys.path[0] == "": del sys.path[0]
d = sys.argv[1]
init = os.path.join(d, "__init__.py")
s = u.find_spec("pyree_build")
if s is None or s.origin is None or os.path.realpath(s.origin) != os.path.realpath(init):
    s = u.spec_from_file_location("pyree_build", init, submodule_search_locations=[d])
    m = u.module_from_spec(s); sys.modules["pyree_build"] = m; s.loader.exec_module(m)
what, sys.argv = sys.argv[2], ["pyree-build", *sys.argv[3:]]
if what == "server": from pyree_build.server.daemon import main
else: from pyree_build.cli import main
sys.exit(main(sys.argv[1:]))
"""


def boot_argv(what: str, args: list[str]) -> list[str]:
    """The command that runs this pyree_build's server (`what` "server") or CLI ("cli") in a new
    process, importing nothing from the caller's directory."""
    return [sys.executable, "-c", BOOT, _PACKAGE_DIR, what, *args]


def fnv1a64(data: bytes) -> int:
    """The hash naming the socket (also in native_client.c, which has no other hash at hand)."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def socket_key(ident: str, env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    text = ident + "".join("\0" + env.get(name, "") for name in PATH_ENV)
    return f"{fnv1a64(text.encode()):016x}"


def socket_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/") and len(runtime) < _MAX_DIR and os.path.isdir(runtime):
        return os.path.join(runtime, "pyree_build")
    return f"/tmp/pyree_build-{os.getuid()}"


def check_dir(path: str, create: bool = True) -> str:
    """`path`, made 0700 if absent; refused (Unsafe) unless it is a real directory of this
    user that no group or other user can open: anyone who could would get a shell as us."""
    try:
        if create:
            os.mkdir(path, 0o700)
        info = os.lstat(path)
    except FileExistsError:
        info = os.lstat(path)
    except FileNotFoundError:
        return path  # not created: nothing in it to trust or not
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise Unsafe(f"{path} is not a directory of uid {os.getuid()} with mode 0700 (mode {info.st_mode & 0o7777:o}, uid {info.st_uid})")
    return path


def socket_path(env: dict[str, str] | os._Environ[str] = os.environ, create: bool = True) -> str:
    return os.path.join(check_dir(socket_dir(env), create), f"s-{socket_key(identity(), env)}.sock")


def encode(kind: str, argv: list[str], env: dict[str, str] | os._Environ[str], cwd: str) -> bytes:
    umask = os.umask(0o022)
    os.umask(umask)
    fields = [PROTOCOL, kind, identity(), cwd, f"{umask:o}", str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    body = b"".join(os.fsencode(f) + b"\0" for f in fields)
    return struct.pack("<I", len(body)) + body


def decode(body: bytes) -> dict[str, object]:
    fields = [os.fsdecode(f) for f in body.split(b"\0")[:-1]]
    if len(fields) < 6 or fields[0] != PROTOCOL:
        raise ValueError("not a pyree_build request of this protocol")
    argc = int(fields[5])
    env = dict(f.split("=", 1) for f in fields[6 + argc :] if "=" in f)
    return {"kind": fields[1], "identity": fields[2], "cwd": fields[3], "umask": int(fields[4], 8), "argv": fields[6 : 6 + argc], "env": env}


def connect(path: str, timeout: float | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def send_request(sock: socket.socket, frame: bytes, fds: list[int]) -> None:
    """The length goes with the fds (one sendmsg), the fields after it."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
    sock.sendmsg([frame[:4]], ancillary)
    sock.sendall(frame[4:])


def read_line(sock: socket.socket) -> str:
    """One reply line ('' when the server closed the connection first)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            return ""
        data += chunk
    return data[:-1].decode()


def control(kind: str, env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, object] | None:
    """Ask the running server for its `kind` ("status" or "stop") report; None if none runs."""
    try:
        sock = connect(socket_path(env, create=False), timeout=10)
    except OSError:
        return None
    with sock:
        send_request(sock, encode(kind, [], {}, "/"), [])
        line = read_line(sock)
    if not line.startswith("{"):
        raise OSError(f"the server answered {line!r}")
    report = json.loads(line)
    assert isinstance(report, dict)
    return report


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie nobody reaps, where no init does, has stopped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
