"""What a command read, recorded where each file is opened.

A remembered verdict (a plan of the native client, client/plans.py) stands only for
the files it was drawn from, so those are not listed by hand (a list misses a form: the
`@file` of `--expect-close 8xf32=@ref.bin` was missed): Python's audit hook sees every
`open` of this process (`open()`, `os.open`, numpy's loads), and the few reads that are no
`open` here are noted by the code that makes them (`note`): a tool's own reads, named by
its argv, and a file's content taken from a memo by its stat.

The hook is process-wide and cannot be removed: it is installed once and does nothing
outside a `recording()` scope but test one global. Not inputs, so not recorded:
- reads of the import system (code: pyree_build's own is in the plans' code stamp);
- files and directories the command made itself (opened for writing, `os.mkdir`): a run's
  temporary results, its outputs;
- the `own` directories the scope names: pyree_build's cache and server directories,
  whose entries are named by the content of recorded inputs, or are the plans themselves;
- an already open descriptor (no name to stat);
- the kernel's reports (/proc, /sys), which pyree_build's process control reads around every
  tool: no stat stands for them, and a tool's file named there is no plan's (`note`).
What cannot be recorded as a stat (a directory listed, a pipe, a device) makes the
recording `complete` False, and no verdict is remembered from it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_LISTINGS = frozenset({"os.listdir", "os.scandir"})
_EVENTS = frozenset({"open", "os.mkdir", *_LISTINGS})
_KERNEL = ("/proc/", "/sys/")


class Reads:
    """The files a scope read (absolute, and where a symlink leads), and whether that is all of it."""

    def __init__(self, own: Sequence[str]) -> None:
        self.paths: dict[str, None] = {}
        self.unrecordable: str | None = None
        self._own_dirs = [os.path.join(os.path.realpath(d), "") for d in own]
        self._made_files: set[str] = set()

    @property
    def complete(self) -> bool:
        return self.unrecordable is None

    def _own(self, real: str) -> bool:
        return real in self._made_files or any(os.path.join(real, "").startswith(d) for d in self._own_dirs)

    def _made(self, path: str, *, directory: bool) -> None:
        real = os.path.realpath(path)
        if directory:
            self._own_dirs.append(os.path.join(real, ""))
        else:
            self._made_files.add(real)

    def _read(self, path: str) -> None:
        named = os.path.abspath(path)
        real = os.path.realpath(named)
        if not self._own(real):
            self.paths[named] = None
            self.paths[real] = None

    def _listed(self, path: str) -> None:
        if not self._own(os.path.realpath(path)):
            self.unrecordable = self.unrecordable or f"listed the directory {path}"


# The scopes are the process's, not a thread's: a read by any thread of the command (a worker
# pool's) belongs to it, and recording more than a scope's own reads only makes a plan stat
# more. Pausing is the thread's own: one thread's reads that are no input (a tool's version)
# must not silence another thread's, nor may its restore drop a scope that thread opened.
_ACTIVE: list[Reads] = []
_ACTIVE_LOCK = threading.Lock()


class _Pauses(threading.local):
    depth = 0


_PAUSED = _Pauses()
_INSTALLED = False


def _recorders() -> list[Reads]:
    """The scopes a read of this thread goes to (none while this thread is paused)."""
    if not _ACTIVE or _PAUSED.depth:
        return []
    with _ACTIVE_LOCK:
        return _ACTIVE[:]


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _ACTIVE or event not in _EVENTS:
        return
    path = args[0] if args else None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if event in _LISTINGS and path is None:
        path = "."
    if not isinstance(path, str | os.PathLike) or _importing():
        return
    path = os.fspath(path)
    if _of_the_kernel(path):
        return
    for reads in _recorders():
        if event == "os.mkdir":
            reads._made(path, directory=True)
        elif event == "open" and isinstance(args[2], int) and args[2] & _WRITES:
            reads._made(path, directory=False)
        elif event == "open":
            reads._read(path)
        else:
            reads._listed(path)


def _of_the_kernel(path: str | os.PathLike[str]) -> bool:
    """Whether a path is one of the kernel's reports (/proc, /sys, or a file in them): what the
    process control reads around every tool, never an input of the command."""
    return os.path.join(os.path.abspath(path), "").startswith(_KERNEL)


def _importing() -> bool:
    """Whether the import system is the reader (its frames are frozen importlib's)."""
    frame = sys._getframe(2)  # 0: this function, 1: the hook
    return frame is not None and frame.f_code.co_filename.startswith("<frozen importlib")


@contextlib.contextmanager
def recording(own: Sequence[str | os.PathLike[str]] = ()) -> Iterator[Reads]:
    """Record what is read until the block ends (scopes nest: each records all of its block)."""
    global _INSTALLED
    if not _INSTALLED:
        sys.addaudithook(_hook)
        _INSTALLED = True
    reads = Reads([os.fspath(d) for d in own])
    with _ACTIVE_LOCK:
        _ACTIVE.append(reads)
    try:
        yield reads
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.remove(reads)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Nothing read in this block is recorded: for reads that are no input of the command,
    such as listing the search path for a tool's version, where the tool's own file (which
    a plan stats) changes with any reinstall."""
    _PAUSED.depth += 1
    try:
        yield
    finally:
        _PAUSED.depth -= 1


def note(*paths: str | os.PathLike[str]) -> None:
    """Record reads that are no `open` in this process: what a tool started here reads, or a
    file whose content a memo stands for by its stat."""
    for path in paths:
        if _of_the_kernel(path):
            unrecordable(f"read {os.fspath(path)}, a report of the kernel")
        for reads in _recorders():
            reads._read(os.fspath(path))


def unrecordable(why: str) -> None:
    """Something was read that no stat can stand for: nothing read in this scope is remembered."""
    for reads in _recorders():
        reads.unrecordable = reads.unrecordable or why
