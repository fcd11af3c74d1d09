"""What pyree_build prints: step lines, and under -v every command ready to paste into a shell."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pyree_build.core import escape

if TYPE_CHECKING:
    pass

# 0 = errors only (-q), 1 = one line per step (default), 2 = every tool command (-v).
VERBOSITY = 1


def set_verbosity(level: int) -> None:
    global VERBOSITY
    VERBOSITY = level


def log_step(message: str) -> None:
    message = escape.terminal(message)  # a step's note may quote a model's names
    if VERBOSITY >= 2:  # under -v the whole output is a shell script: steps are its comments
        message = "\n".join("# " + line for line in message.splitlines())
    if VERBOSITY >= 1:
        _write_line(message)


def _write_line(text: str) -> None:
    # One write per line, under a lock: steps run in threads, and a line split between two
    # writes could interleave with another thread's (breaking a pasted -v script).
    global _LINES_WRITTEN
    with _WRITE_LOCK:
        _LINES_WRITTEN += 1
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def lines_written() -> int:
    """How many lines this process has printed through echo (a step that printed nothing
    leaves it as it was: `run` writes a plan for the native client only for such a run)."""
    return _LINES_WRITTEN


_WRITE_LOCK = threading.Lock()
_LINES_WRITTEN = 0


# --- Paste-able commands (-v) -------------------------------------------------------
#
# Under -v every step that makes a file prints a shell line that makes the same file when
# pasted (tools, `mkdir -p`, the `mv` of an atomic rename, equivalents of in-process steps),
# and everything else is a `# ` comment. The lines are also recorded, so the cache can show a
# hit as the commands that would have run.

_RECORDERS: list[list[str]] = []
_RECORD_LOCK = threading.Lock()


def shell_line(argv: Sequence[str | os.PathLike[str]], *, cwd: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None, stdout: str | os.PathLike[str] | None = None) -> str:  # fmt: skip
    """`argv` as one line of POSIX shell, run in `cwd` (default: this one) as `(cd DIR && ...)`,
    so that it means the same pasted anywhere."""
    line = shlex.join(os.fspath(a) for a in argv)
    if env:
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + line
    if stdout is not None:
        line += " > " + shlex.quote(os.fspath(stdout))
    return f"(cd {shlex.quote(os.fspath(cwd or os.getcwd()))} && {line})"


_MUTED = threading.local()


@contextlib.contextmanager
def muted_commands() -> Iterator[None]:
    """Neither print nor record the commands of this thread inside the block (a cache hit
    places its outputs quietly, then prints the commands that made them)."""
    _MUTED.depth = getattr(_MUTED, "depth", 0) + 1
    try:
        yield
    finally:
        _MUTED.depth -= 1


def echo_command(line: str, note: str | None = None) -> None:
    """Print (under -v) and record one paste-able shell line."""
    if getattr(_MUTED, "depth", 0):
        return
    with _RECORD_LOCK:
        for recorder in _RECORDERS:
            recorder.append(line)
    if VERBOSITY >= 2:
        _write_line(line + (f"  # {note}" if note else ""))


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Collect the lines `echo_command` prints inside the block."""
    lines: list[str] = []
    with _RECORD_LOCK:
        _RECORDERS.append(lines)
    try:
        yield lines
    finally:
        with _RECORD_LOCK:
            # By identity: list.remove compares contents, and two recordings open at once in
            # threads (one arch's cached library inside another's build) may hold equal lines.
            _RECORDERS[:] = [r for r in _RECORDERS if r is not lines]


def make_dir(path: Path) -> Path:
    """mkdir -p, shown under -v so that pasted commands find their directories."""
    if not path.is_dir():
        echo_command(shell_line(["mkdir", "-p", path]))
        path.mkdir(parents=True, exist_ok=True)
    return path


def python_line(*args: str | os.PathLike[str]) -> list[str]:
    """This Python with `args`: the paste-able form of a step pyree_build does in-process."""
    return [sys.executable, *(os.fspath(a) for a in args)]


class Stopwatch:
    """Times one step and prints `step ... 0.12 s` at the default verbosity."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.seconds = time.perf_counter() - self.start
        if exc_type is None:
            log_step(f"  {self.label} ({self.seconds:.2f} s)")
