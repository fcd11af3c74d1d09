"""Runs the native client makes itself: a `run` command line that passed, written down.

A ctest of `pyree_add_run_test` runs the same command line at every `ctest`. Through the
server each costs the tool plus ~3 ms of Python (the request, the checks before the tool, the
results read and printed, the worker put back): more than the tool itself. So once such a run
passed, pyree_build writes a *plan* into the server's directory (the user's alone, 0700),
named by a hash of the command line, working directory, whole environment and identity:

- those four, byte for byte (the client compares them: a hash collision is never a hit);
- the stat (device, inode, size, modification and change times) of every file the run read,
  before or after the tool (its references too), as named and where its path leads: recorded
  where each is opened (core/reads.py), so no form of an option that names a file is missed.
  Only files unchanged for two seconds (core.files.settled, the rule of the cache and facts),
  so a rewrite within one time tick cannot look unchanged;
- the digest of pyree_build's own code, whose files' stats are in `plans/code-<hash of the
  identity>` (one file for all plans of an install, checked by the client too): an edited or
  upgraded pyree_build writes a new one, and no plan of the old code applies;
- the runner's argv (each result's .npy path under a directory the client makes; a NUL
  stands for that directory), the time limit;
- what the tool gave: its stdout and each result's bytes; and what pyree_build printed then.

The native client (plan_runner.c) reads the plan. When every stat is the same it runs the argv itself (its
own session, ended with the client, orphans ended when the tool exits) and, when the tool
exits 0 with the same stdout and result bytes, prints what pyree_build printed, with this
run's seconds, and exits 0: a pure function of those bytes, so the same as the full path.
Anything else (another exit, other bytes, the time limit, a file changed) is no verdict of
the client's: it hands what the tool did to the Python CLI (`take_outcome`: what it printed
through pipes, which no `ulimit -f` limits), which checks and reports it as if it had run the
tool itself, so a failure is never run again to pass.

Plans are written only where the full path prints nothing before the tool starts and at
most its one "output check passed" line after (not under -v), for the host CPU's devices
(which need no probe), without --check-file, for small outputs, with the cache on, never
for a run that read what no stat stands for, and never for a run that was handed over.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import locale
import os
import stat
import struct
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pyree_build.cache import local as cache
from pyree_build.client import protocol
from pyree_build.core import echo, files, reads

if TYPE_CHECKING:
    from pyree_build.actions.run import Ran

MAGIC = b"pyree-plan-2\n"
PLANS_DIR = "plans"
OUTCOME_ENV = "PYREE_BUILD_RAN"  # set by plan_runner.c for the Python CLI it hands a run to
MAX_PLANS = 4096  # past it the directory starts over: plans are cheap to write again
MAX_PRINTED = 4096  # printed stdout beyond this is not all held back until the end (its order would differ)
MAX_RESULTS = 1 << 20
_QUIET, _CHECK_LINE = 1, 2


def _blob(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


def _environment() -> bytes:
    """Every variable as NAME=VALUE, sorted as bytes: plan_runner.c sorts its environ the same way."""
    return b"".join(entry + b"\0" for entry in sorted(k + b"=" + v for k, v in os.environb.items()))


def key_material(args: Sequence[str]) -> bytes:
    """What a plan is for: identity, working directory, arguments and environment."""
    head = [protocol.identity(), os.getcwd(), str(len(args)), *args]
    return b"".join(os.fsencode(part) + b"\0" for part in head) + _environment()


def plans_dir(*, create: bool) -> Path | None:
    """The plans' directory, in the server's (plan_runner.c looks there); None where that
    directory is not this user's alone."""
    try:
        directory = Path(protocol.check_dir(protocol.socket_dir(), create=create)) / PLANS_DIR
        if create:
            directory.mkdir(mode=0o700, exist_ok=True)
    except (OSError, protocol.Unsafe):
        return None
    return directory


def plan_path(material: bytes, *, create: bool) -> Path | None:
    """Where the plan for `material` lives (named by its FNV-1a, as plan_runner.c names it)."""
    directory = plans_dir(create=create)
    return None if directory is None else directory / f"{protocol.fnv1a64(material):016x}"


@contextlib.contextmanager
def recording() -> Iterator[reads.Reads]:
    """What a `run` reads (its checks too), recorded for its plan: pyree_build's cache and
    server directories are its own, named by the content of what is recorded, or the plans."""
    with reads.recording(own=[d for d in (cache.cache_root(), protocol.socket_dir()) if d is not None]) as read:
        yield read


def remember_run(
    command_line: Sequence[str] | None, ran: Ran | None, read: reads.Reads, *, device: str, check_file: str | os.PathLike[str] | None, timeout: float | None,
    printed: str, check_line: str | None, quiet: bool,
) -> bool:  # fmt: skip
    """Write down a `run` that passed, and printed nothing before its tool, for the native
    client to run itself next time: where what it printed (`printed`, then `check_line`) is
    all the client needs to print and all it read (`read`, from `recording`) could be recorded.
    False (nothing written) where it cannot be one."""
    if (
        ran is None or command_line is None or echo.VERBOSITY > 1 or not device.startswith("local-") or check_file
        or not read.complete or not protocol.enabled() or cache.work_dir("facts") is None
    ):  # fmt: skip
        return False
    return write(command_line, ran, list(read.paths), timeout, printed, check_line, quiet=quiet)


def write(args: Sequence[str], ran: Ran, read_files: Sequence[str], timeout: float | None, printed: str, check_line: str | None, *, quiet: bool) -> bool:
    """Write the plan of a run that passed; False (nothing written) where it cannot be one."""
    encoding = locale.getpreferredencoding(False)  # what Popen decoded the tool's stdout with
    try:
        tool_stdout = ran.stdout.encode(encoding)
        shown = printed.encode(_stream_encoding("stdout"), "strict")
        line = check_line.encode(_stream_encoding("stderr"), "backslashreplace") if check_line is not None else b""
    except (UnicodeError, LookupError):
        return False
    stats = _stats(read_files)
    if stats is None or len(shown) > MAX_PRINTED or len(tool_stdout) + sum(map(len, ran.results)) > MAX_RESULTS:
        return False
    prefix, marker, suffix = line.partition(b"{seconds}")
    if check_line is not None and not marker:
        return False
    material = key_material(args)
    path = plan_path(material, create=True)
    code = _code_stamp()
    if path is None or code is None or not _keep_code_stamp(path.parent, code):
        return False
    argv = [os.fsencode(a).replace(os.fsencode(ran.results_dir), b"\0") for a in ran.argv]
    body = b"".join([
        MAGIC, _blob(material), _blob(code[0]), struct.pack("<I", len(stats)), *stats, struct.pack("<I", len(argv)), *map(_blob, argv),
        struct.pack("<q", -1 if timeout is None else int(timeout * 1000)), _blob(tool_stdout),
        struct.pack("<I", len(ran.results)), *map(_blob, ran.results),
        struct.pack("<I", (_QUIET if quiet else 0) | (_CHECK_LINE if check_line is not None else 0)), _blob(shown), _blob(prefix), _blob(suffix),
    ])  # fmt: skip
    _start_over_if_full(path.parent)
    return _write_whole(path, body)


def _write_whole(path: Path, body: bytes) -> bool:
    """Write `path` all or nothing (0600); False if it could not be written."""
    try:
        files.write_atomic(path, body, mode=0o600)
    except OSError:
        return False
    return True


CODE_FILE = "code"  # plans/code-FNV: one per install (identity), so two installs never take turns
_PACKAGE = Path(__file__).resolve().parent.parent


def _code_stamp() -> tuple[bytes, bytes] | None:
    """(digest, packed stats) of pyree_build's Python files (what decides a run's checks and
    output); None while one changed within the last two seconds."""
    try:
        return _settled_code_stamp()
    except OSError:
        return None


@functools.cache
def _settled_code_stamp() -> tuple[bytes, bytes]:
    """Once per process (a server is replaced when these files change; warm_up finds it before
    the server forks); an unsettled file raises, so that the next call looks again."""
    stats = _stats(sorted(os.fspath(p) for p in _PACKAGE.rglob("*.py") if "__pycache__" not in p.parts))
    if stats is None:
        raise OSError("a file of pyree_build changed within the last two seconds")
    packed = struct.pack("<I", len(stats)) + b"".join(stats)
    return hashlib.sha256(packed).hexdigest()[:32].encode(), packed


def code_path(directory: Path) -> Path:
    """The code file of this install's plans in `directory`."""
    return directory / f"{CODE_FILE}-{protocol.fnv1a64(os.fsencode(protocol.identity())):016x}"


def warm_up() -> None:
    """The server finds the code's stamp once, before it forks its workers."""
    _code_stamp()


def _keep_code_stamp(directory: Path, code: tuple[bytes, bytes]) -> bool:
    """`plans/code` names this code (its digest, then its files' stats), written if it names other code."""
    body = _blob(code[0]) + code[1]
    path = code_path(directory)
    with contextlib.suppress(OSError):
        if path.read_bytes() == body:
            return True
    return _write_whole(path, body)


def _stream_encoding(name: str) -> str:
    return getattr(getattr(sys, name), "encoding", None) or "utf-8"


def _stats(names: Sequence[str]) -> list[bytes] | None:
    """Each file's path and stat, packed; None when one is missing, not a regular file, or
    changed within the last two seconds."""
    packed = []
    for name in dict.fromkeys(names):
        try:
            st = os.stat(name)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or not files.settled(st):
            return None
        packed.append(_blob(os.fsencode(name)) + struct.pack("<qqqqq", *files.stat_signature(st)))
    return packed


def forget() -> None:
    """Remove every plan (`pyree-build cache clear`): the next run of each line is served."""
    directory = plans_dir(create=False)
    if directory is not None and directory.is_dir():
        _remove_all(directory)


def _start_over_if_full(directory: Path) -> None:
    with contextlib.suppress(OSError):
        if len(os.listdir(directory)) >= MAX_PLANS:
            _remove_all(directory)


def _remove_all(directory: Path) -> None:
    for name in os.listdir(directory):
        with contextlib.suppress(OSError):
            os.unlink(directory / name)


class Outcome(NamedTuple):
    """What the native client's run of a plan did, handed to this process (OUTCOME_ENV)."""

    argv: list[str]  # as the plan has it: NUL where the results directory goes
    results_dir: str
    returncode: int
    stdout: bytes
    stderr: bytes
    seconds: float
    timed_out: bool


def take_outcome() -> Outcome | None:
    """The run the native client handed over, once (the variable is removed at once, so a
    later call finds none and no tool started here inherits it)."""
    spec = os.environ.pop(OUTCOME_ENV, None)
    return _read_outcome(spec) if spec else None


def _read_outcome(spec: str) -> Outcome | None:
    """`v2 STATUS TIMED_OUT SECONDS OUT ERR DIR PLAN`: STATUS is the exit code, or minus the
    signal that killed the tool; OUT and ERR are pipes holding what it printed, or -1 for the
    files `stdout` and `stderr` in DIR, which also holds its result files."""
    parts = spec.split(" ", 7)
    if len(parts) != 8 or parts[0] != "v2":
        return None
    directory, plan = parts[6], parts[7]
    if not _client_made(directory, plan):
        return None
    try:
        status, timed_out, seconds = int(parts[1]), parts[2] == "1", float(parts[3])
        stdout, stderr = (_take(int(fd), os.path.join(directory, name)) for fd, name in ((parts[4], "stdout"), (parts[5], "stderr")))
        with open(plan, "rb") as f:
            argv = _plan_argv(f.read())
    except (ValueError, OSError):
        return None
    return None if argv is None else Outcome(argv, directory, status, stdout, stderr, seconds, timed_out)


def _client_made(directory: str, plan: str) -> bool:
    """Whether `directory` is a results directory the client made (this user's, 0700, named as
    it names them) and `plan` one of this user's plans: the directory is emptied and removed."""
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    plans = plans_dir(create=False)
    return (
        os.path.basename(directory).startswith("pyree-run.") and stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
        and stat.S_IMODE(info.st_mode) == 0o700 and plans is not None and os.path.dirname(plan) == os.fspath(plans)
    )  # fmt: skip


def _take(fd: int, path: str) -> bytes:
    """All a pipe the client filled holds (`fd`), or a file's bytes, the file removed."""
    if fd >= 0:
        with os.fdopen(fd, "rb") as pipe:
            return pipe.read()
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


def _plan_argv(data: bytes) -> list[str] | None:
    """The runner's argv of a plan's bytes (NUL for the results directory)."""
    if not data.startswith(MAGIC):
        return None
    try:
        _, at = _blob_at(data, len(MAGIC))  # the key
        _, at = _blob_at(data, at)  # the code's digest
        (stats,) = struct.unpack_from("<I", data, at)
        at += 4
        for _ in range(stats):
            _, at = _blob_at(data, at)
            at += 40
        (count,) = struct.unpack_from("<I", data, at)
        at += 4
        argv = []
        for _ in range(count):
            arg, at = _blob_at(data, at)
            argv.append(os.fsdecode(arg))
    except struct.error:
        return None
    return argv


def _blob_at(data: bytes, at: int) -> tuple[bytes, int]:
    """The length-prefixed bytes at `at`, and where the next field starts."""
    (n,) = struct.unpack_from("<I", data, at)
    if at + 4 + n > len(data):
        raise struct.error("a field runs past the end")
    return data[at + 4 : at + 4 + n], at + 4 + n
