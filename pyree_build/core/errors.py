"""The one error type a user ever sees: which file, what is wrong, what to do."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from pyree_build.core import escape

_MAX_DETAIL_LINES = 40


def trim(text: str, max_lines: int = _MAX_DETAIL_LINES) -> str:
    """Keep the head and tail of long tool output; the middle is rarely the cause."""
    lines = text.rstrip().splitlines()
    if len(lines) <= max_lines:
        return "\n".join(lines)
    head = max_lines // 2
    tail = max_lines - head
    skipped = len(lines) - max_lines
    return "\n".join(lines[:head] + [f"... ({skipped} lines not shown) ..."] + lines[-tail:])


class PyreeError(Exception):
    """A failure the user can fix. The CLI prints `render()` and exits with `exit_code`."""

    def __init__(
        self,
        what: str,
        *,
        file: str | os.PathLike[str] | None = None,
        fix: str | None = None,
        details: str | None = None,
        command: Sequence[str] | None = None,
        exit_code: int = 1,
    ) -> None:
        super().__init__(what)
        self.what = what
        self.file = str(file) if file is not None else None
        self.fix = fix
        self.details = details
        self.command = list(command) if command else None
        self.exit_code = exit_code

    def render(self) -> str:
        # What goes to the terminal through one rule: a message may quote a model's names or a
        # tool's output, and neither may move the cursor or reorder the line (escape.terminal).
        where = f"{escape.terminal(self.file)}: " if self.file else ""
        parts = [f"error: {where}{escape.terminal(self.what)}"]
        if self.details:
            parts.append(_indent(escape.terminal(trim(self.details))))
        if self.command:
            parts.append("  command: " + escape.terminal(shlex.join(self.command)))
        if self.fix:
            parts.append("  fix: " + escape.terminal(self.fix))
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()


def _indent(text: str) -> str:
    return "\n".join("  | " + line for line in text.splitlines())


def shown(value: object) -> str:
    """`value` as an error message quotes it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# The path check lives here, below core.args (which offers it as args.path), because
# require_file needs it and errors imports nothing of the package but escape (which imports nothing).
def as_path(value: object, role: str) -> Path:
    """`value` as a Path: a str or os.PathLike, not empty."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        text = os.fspath(value)
        if isinstance(text, str) and text:
            return Path(text)
    raise PyreeError(
        f"{role} must be a path (a str or pathlib.Path), got {type(value).__name__} {shown(value)}",
        fix=f"pass the {role} as a string or a pathlib.Path",
    )


def require_file(path: object, role: str) -> Path:
    """Return `path` as a Path, or raise a PyreeError naming the missing input (or a wrong type)."""
    p = as_path(path, role)
    if not p.is_file():
        what = f"{role} not found" if not p.exists() else f"{role} is not a regular file"
        raise PyreeError(what, file=p, fix=f"check the path; it is resolved from the current directory ({Path.cwd()})")
    return p
