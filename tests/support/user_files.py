"""Shared by the tests: null_device, snapshot (once in test_file_safety.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`: its type, mode, and bytes (files) or target (links)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISREG(st.st_mode):
                content: object = p.read_bytes()
            elif stat.S_ISLNK(st.st_mode):
                content = os.readlink(p)
            else:
                content = None
            out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), content)
    return out


def null_device(directory: Path) -> Path:
    """A private null device (as root), so a regression can never replace the machine's
    /dev/null while the test runs; without root /dev/null itself cannot be replaced."""
    if os.geteuid() != 0:
        return Path("/dev/null")
    node = directory / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return node
