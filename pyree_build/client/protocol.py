"""The wire between a `pyree-build` client and the per-user server (pyree_build/server/), shared
by the Python client, the server, the `server status|stop` verb and the native client's build.

Standard library only, and only what a client needs: the Python client imports this module
and nothing else of pyree_build before the server answers, so its start-up stays small.
The native client (client/transport.c) speaks the same protocol; a change here is a change
there (PROTOCOL).

A request is one frame: a 4-byte little-endian length, then NUL-terminated fields
    PROTOCOL, kind ("run" | "status" | "stop"), identity, cwd, umask (octal), argc, argv..., env...
with the client's fds 0, 1, 2 attached to the length (SCM_RIGHTS) for "run". The server's
worker answers lines: "ok PID", "stale", "refused WHY", then "exit CODE" (run) or one JSON line
(status, stop). During a run the client sends one byte per signal it got (the signal number);
its end of the connection closing means it is gone.

Trust, both ways. The client sends nothing before the socket's peer credentials (SO_PEERCRED)
say this user's uid listens there. The server runs a command only for a client whose process
context (context(): ids and groups, limits, capabilities, namespaces, root, cgroup...) equals
its own, as read from /proc/PEER_PID by the worker; the socket's name hashes that context, so
a client of another context starts a server of its own instead of meeting a refusal.
A client never has its control socket on fds 0-2 (std_fds_open() first): it would pass its
own end of the connection as the command's stdin or stdout.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import struct
import sys
import time
import zlib

PROTOCOL = "pyree_build-server-1"
SERVER_ENV = "PYREE_BUILD_SERVER"  # "off": each command runs in its own process, without the server
IDLE_ENV = "PYREE_BUILD_SERVER_IDLE"  # seconds without a request before the server exits
DEFAULT_IDLE_S = 900.0
MAX_IDLE_S = 604800.0  # a week: a finite bound, so that an idle server always ends
# The environment variables that change what Python imports (sys.path): a server serves only
# clients that agree on them, so a PYTHONPATH'd backend or package is never missed.
PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# sun_path holds 107 bytes and a NUL: a longer $XDG_RUNTIME_DIR (+ /pyree_build/s-KEY.sock,
# 36 bytes) falls back to /tmp.
_MAX_DIR = 64


class Unsafe(Exception):
    """The socket directory may be read or replaced by another user: never used."""


class BadSetting(ValueError):
    """A PYREE_BUILD_SERVER_* variable holds a value the server cannot use (the message says
    which values it can)."""


# The characters of a plain decimal number: float() and C's strtod agree on such text (neither
# "inf", "nan", "0x10" nor "1_000"), so transport.c refuses exactly what this module does.
_NUMBER_CHARS = frozenset("0123456789.eE+-")


def idle_seconds(env: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """$PYREE_BUILD_SERVER_IDLE (unset or empty: the default), refused (BadSetting) unless a
    number of seconds in (0, MAX_IDLE_S]: NaN compared false everywhere and made a server that
    never exits, and so did inf."""
    text = env.get(IDLE_ENV, "").strip(" \t\n\r\f\v")  # C's isspace(), as transport.c strips
    if not text:
        return DEFAULT_IDLE_S
    try:
        value = float(text) if set(text) <= _NUMBER_CHARS else -1.0
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_IDLE_S:
        raise BadSetting(idle_error(env.get(IDLE_ENV, "")))
    return value


def idle_error(text: str) -> str:
    """The refusal of an idle value, rendered as PyreeError renders (transport.c prints the
    same words)."""
    return (
        f"error: {IDLE_ENV}={text} is not a number of seconds in (0, {MAX_IDLE_S:.0f}]\n"
        f"  fix: unset it (the default is {DEFAULT_IDLE_S:.0f}) or set a number of seconds in that range"
    )


OFF_VALUES = ("off", "0", "no", "false")  # transport.c has the same lists
ON_VALUES = ("on", "1", "yes", "true", "")


def enabled(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether commands go to the server: unless PYREE_BUILD_SERVER says off. Another value is
    refused (BadSetting): `PYREE_BUILD_SERVER=of` kept the server, silently."""
    text = env.get(SERVER_ENV, "on")
    value = text.strip(" \t\n\r\f\v").lower()
    if value in OFF_VALUES:
        return False
    if value in ON_VALUES:
        return True
    raise BadSetting(f"error: {SERVER_ENV}={text} is neither on nor off\n  fix: set it to on or off (1/0, yes/no, true/false), or unset it (on)")


@functools.cache
def identity() -> str:
    """Which Python, environment and pyree_build this process is: a server serves only its own.
    Fixed for the process's life; remembered, as a worker compares it on every request (the
    realpath alone cost ~50 us)."""
    return "|".join((PROTOCOL, os.path.realpath(sys.executable), sys.prefix, _PACKAGE_DIR))


def warm_up() -> None:
    """Found once in the server, before it forks: every worker starts knowing it."""
    identity()


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
else: from pyree_build.server.client import in_process as main
sys.exit(main(sys.argv[1:]))
"""


def boot_argv(what: str, args: list[str]) -> list[str]:
    """The command that runs this pyree_build's server (`what` "server") or CLI ("cli") in a new
    process, importing nothing from the caller's directory."""
    return [sys.executable, "-c", BOOT, _PACKAGE_DIR, what, *args]


def fnv1a64(data: bytes) -> int:
    """The hash naming the socket (also in transport.c, which has no other hash at hand)."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# What a command inherits from the process that runs it, beyond what a request carries (argv,
# cwd, umask, environment, fds 0-2): a forked worker has the server's, so a server serves only
# a client whose context is byte for byte its own. From /proc/PID/status, these lines: ids and
# groups (real, effective, saved, fs), capabilities, no_new_privs, seccomp, CPU and memory node
# affinity. Then whole files: resource limits, cgroup (its memory and CPU limits), OOM score,
# LSM label; nice, real-time priority and policy from
# /proc/PID/stat; every namespace; the root directory (chroot). transport.c builds the same
# bytes: a change here is a change there.
_STATUS_FIELDS = (
    b"Uid",
    b"Gid",
    b"Groups",
    b"CapInh",
    b"CapPrm",
    b"CapEff",
    b"CapBnd",
    b"CapAmb",
    b"NoNewPrivs",
    b"Seccomp",
    b"Cpus_allowed_list",
    b"Mems_allowed_list",
)
# Not /proc/PID/personality (linux32): reading another process's takes ptrace-attach rights,
# which Yama (ptrace_scope 1, Ubuntu's default) denies a server that is not its client's parent.
_CONTEXT_FILES = ("limits", "cgroup", "oom_score_adj", "attr/current")
_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")
_STAT_FIELDS = (16, 37, 38)  # after the ")" that ends the command name: nice, rt_priority, policy


def _read(path: str) -> bytes:
    """A /proc file whole (os.read: a buffered open() costs more than the read itself here)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def context(pid: int | str = "self") -> bytes | None:
    """Process `pid`'s context (see _STATUS_FIELDS), as this process can read it; None when
    /proc cannot tell (not mounted, or the process is gone): then nothing can be compared, and
    no server is used."""
    proc = f"/proc/{pid}"
    try:
        # A /proc of another PID namespace (`unshare -p` without --mount-proc) names processes by
        # numbers this one does not use: the server, looking its client up by its SO_PEERCRED
        # pid, would read another process's context.
        if pid == "self" and os.readlink("/proc/self") != str(os.getpid()):
            return None
        status = _read(f"{proc}/status")
        stat_fields = _read(f"{proc}/stat").rsplit(b")", 1)[-1].split()
        root = os.stat(f"{proc}/root")
    except OSError:
        return None
    if len(stat_fields) <= max(_STAT_FIELDS):
        return None
    parts = [line + b"\n" for line in status.split(b"\n") if line.split(b":", 1)[0] in _STATUS_FIELDS]
    parts.append(b"sched " + b" ".join(stat_fields[i] for i in _STAT_FIELDS) + b"\n")
    for name in _CONTEXT_FILES:
        try:
            data = _read(f"{proc}/{name}")
        except OSError:  # an LSM's label where none is loaded (EINVAL), a kernel without the file
            data = b"-"
        parts.append(name.encode() + b"\n" + data + b"\n")
    for name in _NAMESPACES:
        try:
            link = os.readlink(f"{proc}/ns/{name}")
        except OSError:  # a kernel without that namespace
            link = "-"
        parts.append(f"ns {name} {link}\n".encode())
    parts.append(f"root {root.st_dev}:{root.st_ino}\n".encode())
    return b"".join(parts)


def context_differences(mine: bytes, theirs: bytes | None) -> str:
    """The client's context lines the server's lacks, in words short enough for a refusal."""
    if theirs is None:
        return "the client's context cannot be read from /proc"
    ours = set(mine.split(b"\n"))
    lines = [" ".join(line.decode(errors="replace").split())[:60] for line in theirs.split(b"\n") if line not in ours]
    return "; ".join(lines[:3]) or "the order of its lines"


def socket_key(ident: str, env: dict[str, str] | os._Environ[str] = os.environ, ctx: bytes = b"") -> str:
    """FNV-1a of the identity, PYTHONPATH & co and the context's CRC-32 (FNV over the ~2 KB
    context costs ~2.5 ms in Python; zlib's CRC-32 ~0.3 ms, its import). Two contexts sharing a
    CRC share a socket name: the server then refuses one (it compares whole contexts)."""
    text = ident + "".join("\0" + env.get(name, "") for name in PATH_ENV)
    return f"{fnv1a64(os.fsencode(text) + bytes(1) + zlib.crc32(ctx).to_bytes(4, 'little')):016x}"


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


class NoContext(OSError):
    """This process's context cannot be read (no /proc, or another PID namespace's): no server
    can be shown to match it."""


def socket_path(env: dict[str, str] | os._Environ[str] = os.environ, create: bool = True) -> str:
    """The socket of the server for this identity, PYTHONPATH and process context."""
    ctx = context()
    if ctx is None:
        raise NoContext("/proc cannot tell this process's context (not mounted, or another PID namespace's)")
    return os.path.join(check_dir(socket_dir(env), create), f"s-{socket_key(identity(), env, ctx)}.sock")


def encode(kind: str, argv: list[str], env: dict[str, str] | os._Environ[str], cwd: str) -> bytes:
    umask = os.umask(0o022)
    os.umask(umask)
    fields = [PROTOCOL, kind, identity(), cwd, f"{umask:o}", str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    body = b"".join(os.fsencode(f) + b"\0" for f in fields)
    return struct.pack("<I", len(body)) + body


def decode(body: bytes) -> dict[str, object]:
    # Decoded whole, as os.fsdecode decodes each field (a NUL byte is never inside a character):
    # one call instead of one per variable (~0.1 ms of every request).
    fields = body.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()).split("\0")[:-1]
    if len(fields) < 6 or fields[0] != PROTOCOL:
        raise ValueError("not a pyree_build request of this protocol")
    argc = int(fields[5])
    env = dict(f.split("=", 1) for f in fields[6 + argc :] if "=" in f)
    return {"kind": fields[1], "identity": fields[2], "cwd": fields[3], "umask": int(fields[4], 8), "argv": fields[6 : 6 + argc], "env": env}


class NotOurs(OSError):
    """Another user's process listens on the socket: nothing is sent to it."""


def peer(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected AF_UNIX socket."""
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid, gid


def connect(path: str, timeout: float | None = None) -> socket.socket:
    """A connection to the server at `path`, once the socket's peer credentials say it runs as
    this user (NotOurs otherwise): a request carries the environment and the fds."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        uid = peer(sock)[1]
        if uid != os.geteuid():
            raise NotOurs(f"{path} is served by uid {uid}, not this user's ({os.geteuid()})")
    except OSError:
        sock.close()
        raise
    return sock


def std_fds_open() -> None:
    """Open /dev/null on each of fds 0-2 that is closed, before any socket is made: a socket
    landing there would be passed to the worker as the command's stdin or stdout (the tool's
    output read back as control bytes, and a killed client's connection held open by its own
    worker). A closed stdio fd reads as /dev/null, as for a tool started with it closed."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one, as those below are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # as stdio is: the tools the command starts get it too


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


# How long `control` keeps asking while the servers it reaches close without a word (retiring).
_RETIRING_WAIT_S = 10.0


def control(kind: str, env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, object] | None:
    """Ask the running server for its `kind` ("status" or "stop") report; None if none runs.

    A server that closes the connection without a word was retiring as the client connected
    (an idle timeout, a stop or a code change; its socket is removed first, and the connections
    still queued on it are dropped): asking again reaches the server that replaced it, or none."""
    deadline = time.monotonic() + _RETIRING_WAIT_S
    while True:
        try:
            sock = connect(socket_path(env, create=False), timeout=10)
        except OSError:
            return None
        with sock:
            try:
                send_request(sock, encode(kind, [], {}, "/"), [])
                line = read_line(sock)
            except (ConnectionResetError, BrokenPipeError):
                line = ""
        if line or time.monotonic() > deadline:
            break
        time.sleep(0.02)
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
