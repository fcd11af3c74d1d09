"""Whether the code a server has loaded may have changed since it started: pyree_build's
sources, or what is installed in the environment. A server that sees a change serves no more
commands (the client starts a fresh one).

Asked at every request, so it must cost almost nothing: inotify (Linux) on pyree_build's
package directories (a .py file written, added, removed or renamed; __pycache__ is ignored)
and on each site-packages directory (a pip install or uninstall adds or removes entries).
The server sets the watches before it imports anything, so an edit during its imports is
seen. Where inotify cannot be had, every watched path is stat()ed instead (~0.3 ms).

The inotify descriptor is shared by the server and all its workers: the worker that reads an
event retires the server (worker._retire), so no other reader needs to see it.
"""

from __future__ import annotations

import os
import struct
import sys

from pyree_build.core import libc

_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, 0o2000000
_CHANGES = (
    0x2  # IN_MODIFY
    | 0x4  # IN_ATTRIB
    | 0x40  # IN_MOVED_FROM
    | 0x80  # IN_MOVED_TO
    | 0x100  # IN_CREATE
    | 0x200  # IN_DELETE
    | 0x400  # IN_DELETE_SELF
    | 0x800  # IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
_IGNORED_NAMES = (b"__pycache__",)


def watched_dirs() -> list[str]:
    """pyree_build's package directories and each site-packages directory."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = []
    for root, subdirs, _ in os.walk(package):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        dirs.append(root)
    return dirs + [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]


def _stat_paths(dirs: list[str]) -> list[str]:
    """The stat fallback's paths: the directories and pyree_build's .py files in them."""
    files = [os.path.join(d, f) for d in dirs if not d.endswith(("site-packages", "dist-packages")) for f in os.listdir(d) if f.endswith(".py")]
    return dirs + files


def fingerprint(paths: list[str]) -> tuple[tuple[int, int], ...]:
    """(mtime, size) of each path, (0, 0) for one gone."""
    found = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            found.append((0, 0))
            continue
        found.append((info.st_mtime_ns, info.st_size))
    return tuple(found)


def _inotify(dirs: list[str]) -> int | None:
    """An inotify descriptor watching `dirs`, or None where there is none to be had."""
    init, add_watch = libc.function("inotify_init1"), libc.function("inotify_add_watch")
    if init is None or add_watch is None or not sys.platform.startswith("linux"):
        return None
    fd = int(init(_IN_NONBLOCK | _IN_CLOEXEC))
    if fd < 0:
        return None
    for path in dirs:
        if add_watch(fd, os.fsencode(path), _CHANGES) < 0:  # too many watches, or gone
            os.close(fd)
            return None
    return fd


class Watch:
    """Set up before the server imports; `changed()` answers in a read() or a few hundred stats."""

    def __init__(self) -> None:
        dirs = watched_dirs()
        self.fd = _inotify(dirs)
        self.paths = [] if self.fd is not None else _stat_paths(dirs)
        self.initial = fingerprint(self.paths)
        self.seen = False

    def changed(self) -> bool:
        if self.fd is None:
            return fingerprint(self.paths) != self.initial
        while not self.seen:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            self.seen = _relevant(data)
        return self.seen


def _relevant(data: bytes) -> bool:
    """Whether a batch of inotify events holds one that is not about __pycache__."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
        offset += _EVENT.size + length
        if mask & 0x4000 or name not in _IGNORED_NAMES:  # IN_Q_OVERFLOW: events were lost, so assume a change
            return True
    return False
