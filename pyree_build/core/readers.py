"""Reading a file that a user or a server names: only a regular file, and never blocking.

Opening a FIFO for reading blocks until a writer comes, and a device may never end; a check
by name before the open races with the file changing. So every such open is non-blocking,
and the open file itself is checked (fstat) before a byte is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from pyree_build.core.errors import PyreeError, as_path

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
}
# Flag names whose value the tool writes (dumps, IR printouts, an output file).
_WRITTEN = re.compile(r"(-to$|dump|output-file|print-ir)")
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words ("a FIFO (named pipe)")."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def problem(path: str | os.PathLike[str]) -> str | None:
    """None for a regular file (a link to one counts); else what it is instead, in words:
    "not found", "a FIFO (named pipe)", ... Never opens it."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return "not found"
    return None if stat.S_ISREG(st.st_mode) else kind(st.st_mode)


def open_fd(path: str | os.PathLike[str]) -> int | None:
    """A file descriptor open for reading on `path` when it is a regular file, else None;
    never blocks (a FIFO without a writer, a terminal) and never follows a race between a
    check and the open: the open file itself is checked."""
    try:
        fd = os.open(path, _FLAGS)
    except (OSError, ValueError):
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def sha256_of(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of a regular file's bytes (all of them), or None for anything else (absent, a
    directory, a FIFO or device, unreadable): the one file hash of pyree_build, what the cache
    keys, outputs' manifests and tune's records compare. A name from a remote record or a
    user's argument can never hang it (open_fd)."""
    fd = open_fd(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if hasattr(hashlib, "file_digest"):  # Python 3.11+
                return hashlib.file_digest(f, "sha256").hexdigest()
            digest = hashlib.sha256()
            while chunk := f.read(1 << 20):
                digest.update(chunk)
            return digest.hexdigest()
    except OSError:
        return None


# The sha256 of files pyree_build wrote and hashed in this process, by their identity (device,
# inode, size, modification time): a rename keeps all four, so an output published from the
# private file the cache just hashed is not read again for its manifest (575 MB of weights:
# 0.4 s). A file changed since then has another size or time, or, written within the
# filesystem's time step at the same size, is recorded as written and later reported as edited.
_WRITTEN_HASHES: dict[tuple[int, int, int, int], str] = {}
_WRITTEN_KEPT = 256  # a long-running server keeps the last few only


def _identity(path: str | os.PathLike[str]) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def note_written_hash(path: str | os.PathLike[str], digest: str) -> None:
    """Remember `digest` as the bytes of `path`, a file this process just wrote and hashed."""
    identity = _identity(path)
    if identity is not None:
        _WRITTEN_HASHES[identity] = digest
        while len(_WRITTEN_HASHES) > _WRITTEN_KEPT:
            del _WRITTEN_HASHES[next(iter(_WRITTEN_HASHES))]


def sha256_of_written(path: str | os.PathLike[str]) -> str | None:
    """sha256_of, answered from note_written_hash while the file is the one noted."""
    identity = _identity(path)
    known = _WRITTEN_HASHES.get(identity) if identity is not None else None
    return known if known is not None else sha256_of(path)


@contextlib.contextmanager
def open_regular(path: object, role: str) -> Iterator[BinaryIO]:
    """`path` open for reading, or the PyreeError that says it is missing or not a regular file."""
    p = as_path(path, role)
    fd = open_fd(p)
    if fd is None:
        what = problem(p) or "not readable"
        raise PyreeError(
            f"{role} not found" if what == "not found" else f"{role} is {what}, not a regular file",
            file=p,
            fix=f"pass a regular file; the path is resolved from the current directory ({Path.cwd()})",
        )
    with os.fdopen(fd, "rb") as f:
        yield f


def read_regular(path: object, role: str) -> bytes:
    with open_regular(path, role) as f:
        return f.read()


def _marked_iree(flatbuffer: bytes) -> bool:
    # The file identifier follows the root offset, after a size prefix where there is one.
    return b"IREE" in (flatbuffer[4:8], flatbuffer[8:12])


def is_iree_module(data: bytes) -> bool:
    """A .vmfb: a FlatBuffer whose file identifier is IREE, either bare or as the first entry,
    module.fb, of the zip iree-compile wraps it in by default."""
    if not data.startswith(b"PK\x03\x04"):
        return _marked_iree(data)
    name_length, extra_length = struct.unpack_from("<HH", data, 26) if len(data) >= 30 else (0, 0)
    start = 30 + name_length + extra_length
    return data[30 : 30 + name_length] == b"module.fb" and _marked_iree(data[start : start + 12])


def read_module(path: object, role: str = "module") -> bytes:
    """The bytes of an IREE module (.vmfb), or the PyreeError that says the file is not one."""
    data = read_regular(path, role)
    if not is_iree_module(data):
        raise PyreeError(
            f"not an IREE module: a .vmfb is a FlatBuffer marked IREE (bare, or as module.fb in a zip), and this {role} is neither",
            file=as_path(path, role),
            fix="pass a module that iree-compile (or `pyree-build compile`) wrote",
        )
    return data


def special_files_named(argv: Sequence[str], base: Path | None = None) -> list[tuple[str, Path, str]]:
    """(flag, path, what it is) for each value of a flag in `argv` (`--f=V`, `--f V`, `NAME=V`,
    comma-separated parts) that names an existing file that is neither a regular file nor a
    directory: a tool reading it would block (a FIFO) or never end (a device)."""
    here = base or Path.cwd()
    found = []
    name = ""
    for arg in argv:
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq:
                continue
        else:
            value = arg
        if _WRITTEN.search(name):  # the tool writes there: /dev/stderr is a fine place
            continue
        parts = {value, *value.split(",")}
        rest = value
        while "=" in rest:
            rest = rest.split("=", 1)[1]
            parts |= {rest, *rest.split(",")}
        for part in sorted(p for p in parts if p):
            try:
                st = os.stat(here / part)
            except (OSError, ValueError):
                continue
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                found.append((name, here / part, kind(st.st_mode)))
    return found
