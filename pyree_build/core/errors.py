"""The one error type a user ever sees: which file, what is wrong, what to do."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

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
        file: str | Path | None = None,
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
        where = f"{self.file}: " if self.file else ""
        parts = [f"error: {where}{self.what}"]
        if self.details:
            parts.append(_indent(trim(self.details)))
        if self.command:
            parts.append("  command: " + shlex.join(self.command))
        if self.fix:
            parts.append("  fix: " + self.fix)
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()


def _indent(text: str) -> str:
    return "\n".join("  | " + line for line in text.splitlines())


def require_file(path: str | Path, role: str) -> Path:
    """Return `path` as a Path, or raise a PyreeError naming the missing input (or a wrong type)."""
    from pyree_build.core.args import path as as_path

    p = as_path(path, role)
    if not p.is_file():
        what = f"{role} not found" if not p.exists() else f"{role} is not a regular file"
        raise PyreeError(what, file=p, fix=f"check the path; it is resolved from the current directory ({Path.cwd()})")
    return p
