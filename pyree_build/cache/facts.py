"""Facts established about files, remembered by the files' content.

Every `run` (so every ctest) reads the module's function signatures with iree-dump-module
and asks each plugin, in a forked child, which of the module's imports it resolves: a few
milliseconds each, next to a tool run of about five, for answers that depend only on the
bytes of the module or plugin and on the tool that read them. Each answer is kept under a
key made of its kind, the SHA-256 of every file it was read from and what else it depends
on (the reading tool's identity, the names asked), in this process and in `<cache>/facts/`,
and used again whenever the same bytes come back. Other bytes at the same path make another
key, so an edited or rebuilt file is always read again: a fact is never stale, only unused.

Only answers are remembered, never failures: a tool that could not read a file, or a plugin
that crashed or hung when asked, is asked again next time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from pyree_build.cache import local

T = TypeVar("T")

FACTS_DIR = "facts"
_FORMAT = "pyree_build.fact.v1"
# Per process: a server child or a Python session asks again without reading the file.
_KNOWN: dict[str, object] = {}


def remembered(
    kind: str, files: Sequence[Path], compute: Callable[[], T | None], *, depends_on: Sequence[str] = (), keep: Callable[[T], bool] = bool
) -> T | None:
    """`compute()`'s answer about `files`, remembered by their content. `compute` returns a
    JSON value (lists, dicts, strings, numbers), or None for no answer; an answer `keep`
    refuses (one that depends on more than the files) is returned but not remembered."""
    digests = [local.hash_file(Path(f)) for f in files]
    if any(d is None for d in digests):
        return compute()
    key = local.digest(_FORMAT, kind, *(d or "" for d in digests), *depends_on)
    if key in _KNOWN:
        return _KNOWN[key]  # type: ignore[return-value]
    directory = local.work_dir(FACTS_DIR)
    stored = local.read_json(directory / f"{key}.json") if directory is not None else None
    if isinstance(stored, dict) and stored.get("format") == _FORMAT and stored.get("kind") == kind and "answer" in stored:
        _KNOWN[key] = stored["answer"]
        return stored["answer"]  # type: ignore[no-any-return]
    answer = compute()
    if answer is None or not keep(answer):
        return answer
    _KNOWN[key] = answer
    if directory is not None:
        with contextlib.suppress(OSError):
            local.write_json(directory / f"{key}.json", {"format": _FORMAT, "kind": kind, "files": [os.fspath(f) for f in files], "answer": answer})
    return answer


def tool_identity(path: Path) -> str:
    """What a tool's answers depend on: its content hash where the cache can remember it (so
    a tool of 100 MB is hashed once), else its path, size and modification time."""
    directory = local.work_dir(FACTS_DIR)
    if directory is not None:
        return local.tool_digest(directory.parent, path)
    try:
        st = path.stat()
    except OSError:
        return f"missing {path}"
    return f"{path.resolve()} {st.st_size} {st.st_mtime_ns} {st.st_ino}"


def forget_in_process() -> None:
    """Drop what this process remembers (the stored facts stay): for tests that count asks."""
    _KNOWN.clear()
