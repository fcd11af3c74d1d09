"""Checks that a file is what a build step makes, by its first bytes.

Bytes from the remote cache tier become outputs only after their step's check passes
(cache.local.cached_action's `check`): a server answering with some other file, of the
right hash but the wrong kind (an HTML page, an ELF for another machine, PTX for another
sm), costs a local build instead. Each backend composes these with what it knows (the sm,
the gfx, the arch).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

from pyree_build.core.errors import PyreeError

PathLike = str | os.PathLike[str]

ELF_MAGIC = b"\x7fELF"
ELF_TYPES = {1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN"}
_ZIP_LOCAL = b"PK\x03\x04"
_HEAD = 4096


def _head(path: PathLike, size: int = _HEAD) -> bytes:
    with open(path, "rb") as f:
        return f.read(size)


def _bad(path: PathLike, what: str) -> PyreeError:
    return PyreeError(what, file=path, fix="rebuild it (a cache entry with other bytes is not used)")


def require_magic(path: PathLike, magic: bytes, what: str) -> None:
    """`path` starts with `magic`, the mark of `what`."""
    if _head(path, len(magic)) != magic:
        raise _bad(path, f"not {what}")


def magic_check(magic: bytes, what: str) -> Callable[[Sequence[PathLike]], None]:
    """A cached_action `check`: every output starts with `magic`."""

    def check(paths: Sequence[PathLike]) -> None:
        for path in paths:
            require_magic(path, magic, what)

    return check


def require_elf(path: PathLike, *, machine: int, elf_type: str) -> None:
    """A 64-bit little-endian ELF of `machine` (e_machine) and `elf_type` (ET_REL, ET_DYN)."""
    head = _head(path, 64)
    if len(head) < 64 or head[:4] != ELF_MAGIC or head[4] != 2 or head[5] != 1:
        raise _bad(path, "not a 64-bit little-endian ELF file")
    kind, found = struct.unpack_from("<HH", head, 16)
    if found != machine or ELF_TYPES.get(kind) != elf_type:
        raise _bad(path, f"an ELF {ELF_TYPES.get(kind, kind)} for machine {found}, not {elf_type} for machine {machine}")


def require_vmfb(path: PathLike) -> None:
    """An IREE module: its FlatBuffer (identifier `IREE`, after the root offset, and the size
    when size-prefixed, as iree-compile writes it), bare or as the first file of the ZIP
    archive iree-compile writes."""
    head = _head(path)
    at = 0
    if head[:4] == _ZIP_LOCAL and len(head) >= 30:
        name_len, extra_len = struct.unpack_from("<HH", head, 26)
        at = 30 + name_len + extra_len
    if b"IREE" not in (head[at + 4 : at + 8], head[at + 8 : at + 12]):
        raise _bad(path, "not an IREE module (.vmfb)")


def require_text(path: PathLike, marker: bytes, what: str) -> bytes:
    """A text file (no NUL, UTF-8) holding `marker`; returns its bytes."""
    data = Path(path).read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(path, f"not {what} (not UTF-8 text)") from None
    if b"\0" in data or marker not in data:
        raise _bad(path, f"not {what}")
    return data
