"""Outputs that are either complete and correct or absent, and depfiles for CMake/Ninja."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterable, Iterator

from .errors import PyreeError


def prepare_output_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PyreeError(
            f"cannot create output directory: {exc.strerror}",
            file=path,
            fix="choose an output path in a directory you can write to",
        ) from None
    if not os.access(path, os.W_OK):
        raise PyreeError("output directory is not writable", file=path, fix="choose an output path in a directory you can write to")


@contextlib.contextmanager
def atomic_output(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it into place only if the block succeeds.

    A crash, an error or a kill in the block leaves `final` as it was before (or absent),
    never a partial file that a later build would trust.
    """
    final_path = Path(final)
    prepare_output_dir(final_path.parent)
    # Only a name: the tool creates the file, so it gets the usual mode (umask, +x for a linker).
    tmp = final_path.parent / f".{final_path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        yield tmp
        if not tmp.exists() or tmp.stat().st_size == 0:
            raise PyreeError("the tool reported success but wrote no output", file=final_path)
        os.replace(tmp, final_path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def remove_stale(path: str | os.PathLike[str]) -> None:
    """Delete an earlier output before rebuilding it, so a failed rebuild leaves nothing to trust."""
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()


@contextlib.contextmanager
def scratch_dir(near: Path, label: str) -> Iterator[Path]:
    """A private build directory for intermediates, removed afterwards; never beside the sources."""
    prepare_output_dir(near)
    tmp = Path(tempfile.mkdtemp(prefix=f".{label}.", suffix=".build", dir=near))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _escape_dep(path: str) -> str:
    return path.replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")


def write_depfile(depfile: str | os.PathLike[str], target: str | os.PathLike[str], deps: Iterable[str | os.PathLike[str]]) -> None:
    """Write a Make/Ninja depfile: `target: dep dep ...`, deduplicated, absolute paths."""
    seen: dict[str, None] = {}
    for dep in deps:
        seen.setdefault(os.path.abspath(os.fspath(dep)), None)
    text = _escape_dep(os.path.abspath(os.fspath(target))) + ": " + " \\\n  ".join(_escape_dep(d) for d in seen) + "\n"
    with atomic_output(depfile) as tmp:
        tmp.write_text(text, encoding="utf-8")


def parse_depfile(path: str | os.PathLike[str]) -> list[str]:
    """Dependencies listed in a compiler-written depfile (`-MD -MF`), in order."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    text = text.replace("\\\n", " ")
    _, _, rest = text.partition(": ")
    deps: list[str] = []
    current = ""
    i = 0
    while i < len(rest):
        ch = rest[i]
        if ch == "\\" and i + 1 < len(rest) and rest[i + 1] == " ":
            current += " "
            i += 2
            continue
        if ch.isspace():
            if current:
                deps.append(current)
                current = ""
        else:
            current += ch
        i += 1
    if current:
        deps.append(current)
    return deps
