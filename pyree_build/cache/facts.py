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
that crashed or hung when asked, is asked again next time. Nor an answer whose computation
read (core/reads.py) any file but those it is keyed by: it would stand for more than them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pyree_build.cache import local
from pyree_build.core import reads
from pyree_build.core.files import settled, stat_signature

T = TypeVar("T")

FACTS_DIR = "facts"
_FORMAT = "pyree_build.fact.v1"
# Per process: a server child or a Python session asks again without reading the file. What a
# process learns is also kept in _NEW, which a server's worker hands back to the server
# (learned/absorb), so the workers forked next start knowing it: a fresh worker read each
# fact from disk and hashed each file again (~1 ms of every served `run`). Each entry is
# under the facts directory it mirrors, and with the cache off none is kept: a fact only
# recorded (a plugin pyree_build built for a CPU) is then known to no later command, served
# or not, as it is known to no command in a process of its own.
_KNOWN: dict[str, object] = {}
# A file's SHA-256 (or a tool's identity) with the stat it had, by path; the rule of
# local._DepHashes: only for a file unchanged for two seconds, whose stat then says it is unchanged.
_DIGESTS: dict[str, tuple[list[int], str]] = {}
_NEW: list[tuple[str, str, Any]] = []
_MAX_KNOWN = 4096  # past it, a process starts over: a long-lived server never grows without bound


def remembered(
    kind: str, files: Sequence[Path], compute: Callable[[], T | None], *, depends_on: Sequence[str] = (), keep: Callable[[T], bool] = bool
) -> T | None:
    """`compute()`'s answer about `files`, remembered by their content. `compute` returns a
    JSON value (lists, dicts, strings, numbers), or None for no answer; an answer `keep`
    refuses (one that depends on more than the files) is returned but not remembered."""
    digests = [_memo(f"file:{os.fspath(f)}", f if isinstance(f, Path) else Path(f), local.hash_file) for f in files]
    if any(d is None for d in digests):
        return compute()
    key = local.digest(_FORMAT, kind, *(d or "" for d in digests), *depends_on)
    directory = local.work_dir(FACTS_DIR)
    if directory is None:  # the cache off: nothing is remembered, in this process either (see _KNOWN)
        return compute()
    memo = f"{directory}:{key}"
    if memo in _KNOWN:
        return _KNOWN[memo]  # type: ignore[return-value]
    stored = local.read_json(directory / f"{key}.json")
    if isinstance(stored, dict) and stored.get("format") == _FORMAT and stored.get("kind") == kind and "answer" in stored:
        _remember("fact", memo, stored["answer"])
        return stored["answer"]
    root = local.cache_root()
    with reads.recording(own=[root] if root is not None else []) as read:
        answer = compute()
    if answer is None or not keep(answer) or not _drawn_from(read, files):
        return answer
    _remember("fact", memo, answer)
    with contextlib.suppress(OSError):
        local.write_json(directory / f"{key}.json", {"format": _FORMAT, "kind": kind, "files": [os.fspath(f) for f in files], "answer": answer})
    return answer


def _drawn_from(read: reads.Reads, files: Sequence[Path]) -> bool:
    """Whether the answer read no file but `files` (in this process: what a tool or a forked
    child reads is the caller's to name), so that their content is all it stands for."""
    named = {p for f in files for p in (os.path.abspath(f), os.path.realpath(f))}
    return read.complete and named.issuperset(read.paths)


def tool_identity(path: Path) -> str:
    """What a tool's answers depend on: its content hash where the cache can remember it (so
    a tool of 100 MB is hashed once), else its path, size and modification time."""
    directory = local.work_dir(FACTS_DIR)
    if directory is not None:
        root = directory.parent
        return _memo(f"tool:{root}:{path}", path, lambda p: local.tool_digest(root, p)) or "missing"
    try:
        st = path.stat()
    except OSError:
        return f"missing {path}"
    return f"{path.resolve()} {st.st_size} {st.st_mtime_ns} {st.st_ino}"


def _memo(name: str, path: Path, compute: Callable[[Path], str | None]) -> str | None:
    """compute(path), remembered in this process by the file's stat (see _DIGESTS)."""
    reads.note(path)  # read, though a memo may answer without opening it
    try:
        st = os.stat(path)
    except OSError:
        return compute(path)
    sig = stat_signature(st)
    known = _DIGESTS.get(name)
    if known is not None and known[0] == sig:
        return known[1]
    digest = compute(path)
    if digest is not None and stat.S_ISREG(st.st_mode) and settled(st):
        with contextlib.suppress(OSError):
            again = os.stat(path)
            if stat_signature(again) == sig:
                _remember("digest", name, [sig, digest])
    return digest


def _remember(kind: str, name: str, value: Any) -> None:
    table: dict[str, Any] = _KNOWN if kind == "fact" else _DIGESTS
    if len(table) >= _MAX_KNOWN:
        table.clear()
    table[name] = value if kind == "fact" else (value[0], value[1])
    if len(_NEW) < _MAX_KNOWN:
        _NEW.append((kind, name, value))


def learned() -> list[tuple[str, str, Any]]:
    """What this process learned since it started (a fork: since it was forked), as JSON values."""
    return list(_NEW)


def hand_over() -> list[tuple[str, str, Any]]:
    """learned(), which the caller passes on: the next call returns only what is learned after."""
    new = list(_NEW)
    _NEW.clear()
    return new


def absorb(entries: object) -> None:
    """Take what a worker learned (`learned()`, decoded from JSON; anything malformed is skipped)."""
    if not isinstance(entries, list):
        return
    for entry in entries:
        if isinstance(entry, list) and len(entry) == 3 and entry[0] == "fact" and isinstance(entry[1], str):
            _remember("fact", entry[1], entry[2])
        elif isinstance(entry, list) and len(entry) == 3 and entry[0] == "digest" and isinstance(entry[1], str) and _digest_entry(entry[2]):
            _remember("digest", entry[1], entry[2])
    _NEW.clear()  # the server's own: none of it is news to the workers it forks


def _digest_entry(value: object) -> bool:
    return (
        isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)
        and isinstance(value[0], list) and len(value[0]) == 5 and all(isinstance(n, int) for n in value[0])
    )  # fmt: skip


def known_count() -> int:
    """How many facts (and file digests) this process knows without reading the disk."""
    return len(_KNOWN) + len(_DIGESTS)


def forget_in_process() -> None:
    """Drop what this process remembers (the stored facts stay): for tests that count asks."""
    _KNOWN.clear()
    _DIGESTS.clear()
    _NEW.clear()
