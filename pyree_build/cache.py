"""Outputs that are either complete and correct or absent, and depfiles for CMake/Ninja."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

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


def _temp_name(final: Path, suffix: str = ".tmp") -> Path:
    """A hidden sibling name that records its writer's pid, so leftovers of a killed build can be swept."""
    sweep_stale_temps(final)
    return final.parent / f".{final.name}.{os.getpid()}-{os.urandom(4).hex()}{suffix}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_temps(final: Path) -> None:
    """Remove temporaries of `final` left by writers that no longer run (a killed build).

    A running writer's temporaries are left alone, so concurrent builds never race here.
    """
    import re

    # Also matches what a killed tool derived from our name (clang writes `<output>-<random>.tmp`).
    pattern = re.compile(re.escape(f".{final.name}.") + r"(\d+)-[0-9a-f]{8}[.-]")
    try:
        siblings = list(final.parent.iterdir())
    except OSError:
        return
    for path in siblings:
        m = pattern.match(path.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


@contextlib.contextmanager
def atomic_outputs(finals: Sequence[str | os.PathLike[str]]) -> Iterator[list[Path]]:
    """Yield a temporary path beside each of `finals`; rename them into place only if the
    block succeeds, all in one tight loop after it.

    A crash, an error or a kill in the block leaves every final file as it was before (or
    absent), never a partial file, nor a partial set of files that belong together (one
    per arch or sm), that a later build would trust. The paths are only names: the tool
    creates the files, so they get the usual mode (umask, +x for a linker).
    """
    pairs = []
    for final in map(Path, finals):
        prepare_output_dir(final.parent)
        pairs.append((_temp_name(final), final))
    try:
        yield [tmp for tmp, _ in pairs]
        for tmp, final in pairs:
            if not tmp.exists() or tmp.stat().st_size == 0:
                raise PyreeError("the tool reported success but wrote no output", file=final)
        for tmp, final in pairs:
            os.replace(tmp, final)
    finally:
        for tmp, _ in pairs:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


@contextlib.contextmanager
def atomic_output(final: str | os.PathLike[str]) -> Iterator[Path]:
    """`atomic_outputs` for one file."""
    with atomic_outputs([final]) as (tmp,):
        yield tmp


def remove_stale(path: str | os.PathLike[str]) -> None:
    """Delete an earlier output before rebuilding it, so a failed rebuild leaves nothing to trust."""
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()


@contextlib.contextmanager
def scratch_dir(near: Path, label: str) -> Iterator[Path]:
    """A private build directory for intermediates, removed afterwards; never beside the sources."""
    prepare_output_dir(near)
    tmp = _temp_name(near / label, ".build")
    tmp.mkdir()
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


# --- Content-addressed action cache -------------------------------------------------
#
# Layout under the cache root:
#   manifests/<base>.json  for one action on one primary input: the dependency sets seen
#                          so far, each with the content hashes it had and its entry key
#   entries/<entry>/       the outputs of one build, named 0, 1, ... in output order
#   locks/<base>.lock      serialises read-modify-write of one manifest
# <base> hashes the action, its flags, the tools' identities and the primary inputs' bytes;
# <entry> also hashes every dependency the build reported (included headers, tools), so an
# edited header is a miss even though the source did not change. Entries are written to a
# temporary directory and renamed into place; a manifest is replaced atomically under its
# lock, and each output's hash is checked on a hit, so a killed or concurrent build can
# leave garbage but never an entry that would be trusted wrongly.

CACHE_ENV = "PYREE_BUILD_CACHE"
_LARGE_FILE = 4 << 20  # tools and libraries: hashed by size and mtime, not content
_MANIFEST_ENTRIES = 8


def cache_root() -> Path | None:
    """The cache directory, or None when caching is off (PYREE_BUILD_CACHE=off)."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None and configured.strip().lower() in ("", "0", "off", "no", "false"):
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pyree_build"


def _hash_file(path: Path) -> str | None:
    import hashlib

    try:
        st = path.stat()
        if not path.is_file():
            return None
        if st.st_size > _LARGE_FILE:
            return f"stat:{st.st_size}:{st.st_mtime_ns}"
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _digest(*parts: str) -> str:
    import hashlib

    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()[:40]


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    import fcntl

    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_manifest(path: Path) -> list[dict]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [e for e in data if isinstance(e, dict) and "entry" in e and "deps" in e and "outputs" in e]
    except (OSError, ValueError, TypeError):
        return []  # absent or unreadable: a miss, and the next store rewrites it


def _place(cached_file: Path, final: Path) -> None:
    """Hard-link (or copy) a cached output into place, atomically."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.urandom(6).hex()}.tmp"
    try:
        try:
            os.link(cached_file, tmp)
        except OSError:
            shutil.copy2(cached_file, tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _lookup(root: Path, base: str, outputs: Sequence[Path]) -> list[str] | None:
    for entry in reversed(_read_manifest(root / "manifests" / f"{base}.json")):
        if any(_hash_file(Path(dep)) != digest for dep, digest in entry["deps"].items()):
            continue
        entry_dir = root / "entries" / entry["entry"]
        files = [entry_dir / str(i) for i in range(len(outputs))]
        if len(entry["outputs"]) != len(outputs) or any(_hash_file(f) != d for f, d in zip(files, entry["outputs"])):
            shutil.rmtree(entry_dir, ignore_errors=True)  # damaged: drop it, rebuild
            continue
        for cached_file, final in zip(files, outputs):
            _place(cached_file, final)
        return list(entry["deps"])
    return None


def _store(root: Path, base: str, outputs: Sequence[Path], deps: Sequence[str]) -> None:
    import json

    dep_hashes = {}
    for dep in dict.fromkeys(os.path.abspath(d) for d in deps):
        digest = _hash_file(Path(dep))
        if digest is not None:
            dep_hashes[dep] = digest
    output_hashes = [_hash_file(o) for o in outputs]
    if any(h is None for h in output_hashes):
        return
    entry = _digest(base, *(f"{k}={v}" for k, v in sorted(dep_hashes.items())))
    entries = root / "entries"
    entries.mkdir(parents=True, exist_ok=True)
    final_dir = entries / entry
    if not final_dir.is_dir():
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{entry}.", dir=entries))
        try:
            for i, out in enumerate(outputs):
                shutil.copy2(out, tmp_dir / str(i))
            os.rename(tmp_dir, final_dir)
        except OSError:
            pass  # another writer stored the same entry first
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    manifest = root / "manifests" / f"{base}.json"
    with _locked(root / "locks" / f"{base}.lock"):
        known = [e for e in _read_manifest(manifest) if e["entry"] != entry]
        known.append({"entry": entry, "deps": dep_hashes, "outputs": output_hashes})
        manifest.parent.mkdir(parents=True, exist_ok=True)
        tmp = manifest.parent / f".{manifest.name}.{os.urandom(6).hex()}.tmp"
        tmp.write_text(json.dumps(known[-_MANIFEST_ENTRIES:]), encoding="utf-8")
        os.replace(tmp, manifest)


def cached_action(
    action: str,
    *,
    key: Sequence[str],
    inputs: Sequence[Path],
    outputs: Sequence[Path],
    build: Callable[[], list[str]],
) -> list[str]:
    """Produce `outputs` from the cache, or by `build()` and then store them.

    `key` holds everything besides file contents that changes the result (flags, tool
    identities, output names); `inputs` are the files read first (sources). `build`
    writes the outputs and returns every file it read. Returns those dependencies.
    """
    from . import tools

    root = cache_root()
    if root is None:
        return build()
    input_hashes = [f"{p.resolve()}={_hash_file(p)}" for p in inputs]
    # Output suffixes, not names: the same build under another name is the same entry.
    base = _digest(action, *key, *(o.suffix for o in outputs), *input_hashes)
    try:
        deps = _lookup(root, base, outputs)
    except OSError:
        deps = None
    if deps is not None:
        tools.log_step(f"  {action}: cache hit ({', '.join(o.name for o in outputs)})")
        return deps
    remote = _remote_tier(root)
    if remote is not None:
        deps = remote.fetch(base, outputs, _deps_unchanged)
        if deps is not None:
            tools.log_step(f"  {action}: remote cache hit ({', '.join(o.name for o in outputs)})")
            with contextlib.suppress(OSError):
                _store(root, base, outputs, deps)  # the local tier answers next time
            return deps
    deps = build()
    try:
        _store(root, base, outputs, deps)
    except OSError as exc:  # a full or read-only cache must not fail the build
        tools.log_step(f"  note: not cached ({exc.strerror or exc})")
    else:
        if remote is not None:
            remote.upload(base, outputs, _remote_dep_hashes(deps))
    return deps


# --- The remote tier (pyree_build/remote_cache.py), asked only on a local miss --------


def _remote_tier(root: Path):  # type: ignore[no-untyped-def]
    if not os.environ.get("PYREE_BUILD_REMOTE_CACHE"):
        return None  # the common case costs no import
    from . import remote_cache

    return remote_cache.from_env(state_dir=root)


def _deps_unchanged(deps: dict[str, str]) -> bool:
    return all(_hash_file(Path(dep)) == digest for dep, digest in deps.items())


def _remote_dep_hashes(deps: Sequence[str]) -> dict[str, str]:
    hashes = {}
    for dep in dict.fromkeys(os.path.abspath(d) for d in deps):
        digest = _hash_file(Path(dep))
        if digest is not None:
            hashes[dep] = digest
    return hashes


def cache_info() -> dict[str, object]:
    root = cache_root()
    if root is None:
        return {"root": None, "entries": 0, "bytes": 0}
    entries = [p for p in (root / "entries").glob("*") if p.is_dir() and not p.name.startswith(".")] if (root / "entries").is_dir() else []
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0
    return {"root": str(root), "entries": len(entries), "bytes": size}


def cache_clear() -> int:
    """Remove every cache entry; returns how many there were."""
    root = cache_root()
    if root is None or not root.is_dir():
        return 0
    count = int(cache_info()["entries"])  # type: ignore[arg-type]
    for sub in ("manifests", "entries", "locks"):
        shutil.rmtree(root / sub, ignore_errors=True)
    return count
