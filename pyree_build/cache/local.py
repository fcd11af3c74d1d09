"""The content-addressed local cache: `cached_action` runs a build only when no entry holds outputs
for the same key (the action, its flags, the content of every file it read, the tools), and
otherwise copies them out; entries are published whole and checked on the way out, so a killed
build or a damaged entry is never served. The remote tier (remote.py) is asked on a local miss.

Long (~780 lines) because the key, the entry store and the action's flow (look up, build, check
what it read did not change while it ran, store) are one protocol whose steps share its locks
and its records; the atomic writes and depfiles it uses are core/files.py's."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyree_build.core import echo, files, lazy, readers, reads, toolchain
from pyree_build.core import outputs as outputs_mod
from pyree_build.core.errors import PyreeError
from pyree_build.core.files import settled, stat_signature
from pyree_build.core.inputs import Inputs, watched_directories
from pyree_build.core.package import PACKAGE_DIR

# Loaded on first use: host_cpu() only for code built for "the host", the remote tier only
# when PYREE_BUILD_REMOTE_CACHE is set (a cache hit pays for neither).
platform = lazy.module("platform")
remote_cache = lazy.module("pyree_build.cache.remote")
if TYPE_CHECKING:
    from pyree_build.cache import remote

CACHE_ENV = "PYREE_BUILD_CACHE"
# Tests set this to a directory to force interleavings: a build that has run its tool
# writes <dir>/built and waits for <dir>/built.go before checking its inputs and storing.
PAUSE_ENV = "PYREE_BUILD_CACHE_TEST_PAUSE"
_MANIFEST_ENTRIES = 8
_TAG = "CACHEDIR.TAG"
_MARK = "pyree_build cache"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    f"# This directory is a {_MARK} (PYREE_BUILD_CACHE). `pyree-build cache clear` empties it.\n"
    "# See https://bford.info/cachedir/ for the meaning of this file.\n"
)
_HEX = re.compile(r"[0-9a-f]{40}\Z")
_SHA = re.compile(r"[0-9a-f]{64}\Z")
_OWN_TEMP = re.compile(r"\.[0-9a-f]{40}(?:\.json)?\.\d+-[0-9a-f]{8}\.(?:tmp|old)\Z")
_HOST_VALUE = re.compile(r"(?:^|=)(?:host|native)\Z")
_FICLONE = 0x40049409  # ioctl: share the source's extents (btrfs, XFS, bcachefs)


def cache_root() -> Path | None:
    """The cache directory, or None when caching is off (PYREE_BUILD_CACHE=off)."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None and configured.strip().lower() in ("", "0", "off", "no", "false"):
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pyree_build"


def _note(message: str) -> None:
    """Why something in the cache was not used: shown with -v."""
    if echo.VERBOSITY >= 2:
        echo.log_step(f"  cache: {message}")


# The path may come from a remote server's record: a FIFO or device there is None, never a hang.
hash_file = readers.sha256_of


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()[:40]


digest = _digest


def is_cache_dir(root: Path) -> bool:
    """Whether `root` carries the mark this cache writes into its own directory."""
    try:
        with open(root / _TAG, encoding="utf-8", errors="replace") as f:
            return _MARK in f.read(4096)
    except OSError:
        return False


@functools.cache
def _open_cache(root: Path) -> Path | None:
    """`root` when it is this cache's directory (marking it when new or empty), else None."""
    if is_cache_dir(root):
        return root
    try:
        # Another build may be marking a new directory right now: its temporary tag does
        # not make the directory someone else's, and its finished tag makes it ours.
        others = root.is_dir() and any(not p.name.startswith(f".{_TAG}.") for p in root.iterdir())
        if root.exists() and not root.is_dir() or others and not is_cache_dir(root):
            echo.log_step(
                f"  note: not caching: {CACHE_ENV} names {root}, which is not a pyree_build cache "
                f"(it has no {_TAG} written by pyree_build); point {CACHE_ENV} at a new or empty directory"
            )
            return None
        root.mkdir(parents=True, exist_ok=True)
        files.write_atomic(root / _TAG, _TAG_TEXT)
    except OSError as exc:
        echo.log_step(f"  note: not caching: cannot use {root} ({exc.strerror or exc})")
        return None
    return root


def work_dir(name: str) -> Path | None:
    """`<cache>/<name>`, for files kept beside the cache entries (`inline`: pb.load_inline's
    builds; `cache clear` removes them too), the cache directory marked as ours first; None
    when caching is off or the directory is not a usable cache."""
    env = os.environ
    return _work_dir(env.get(CACHE_ENV), env.get("XDG_CACHE_HOME"), env.get("HOME"), name)


@functools.lru_cache(maxsize=16)
def _work_dir(_cache: str | None, _xdg: str | None, _home: str | None, name: str) -> Path | None:
    """work_dir by what cache_root reads: asked several times a command (each fact), it built
    the same paths each time (~15 us). Remembered as long as _open_cache remembers the root."""
    configured = cache_root()
    root = _open_cache(configured) if configured is not None else None
    return None if root is None else root / name


@functools.lru_cache(maxsize=1)
def host_cpu() -> str:
    """What makes code built for "the host" specific to it: the CPU's model and features."""
    model, features = "", ""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if not model and name in ("model name", "cpu model", "uarch", "cpu part"):
            model = value.strip()
        if not features and name in ("flags", "features", "isa"):
            features = " ".join(sorted(value.split()))
    return f"{platform.machine()}/{model or 'unknown model'}/features:{_digest(features)[:16]}"


def _read_json(path: Path) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        _note(f"ignoring {path}: {exc}")
        return None


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, json.dumps(data))


def read_json(path: Path) -> object:
    """A JSON file of the cache, or None where it is missing or unreadable."""
    return _read_json(path)


def write_json(path: Path, data: object) -> None:
    """Write a JSON file of the cache all or nothing (a reader never sees half of it)."""
    _write_json(path, data)


def tool_digest(root: Path, path: Path) -> str:
    """The content hash of a tool, remembered in the cache `root` by the file's stat."""
    return _tool_digest(root, path)


def _tool_digest(root: Path, path: Path) -> str:
    """The content hash of a tool (zig is 185 MB): computed once, then remembered with the
    file's device, inode, size, mtime and ctime. Any write to the file sets a new ctime,
    which no user command can set back, and a hash is only remembered for a file unchanged
    for two seconds, so a later write always shows in the stat."""
    reads.note(path)  # read, though the memo may answer without opening it
    try:
        st = path.stat()
    except OSError:
        return "missing"
    memo = root / "tools" / f"{_digest(str(path.resolve()))}.json"
    known = _read_json(memo)
    if isinstance(known, dict) and known.get("stat") == stat_signature(st) and isinstance(known.get("sha256"), str) and _SHA.match(known["sha256"]):
        return known["sha256"]
    digest = hash_file(path)
    if digest is None:
        return "unreadable"
    with contextlib.suppress(OSError):
        if settled(st) and stat_signature(path.stat()) == stat_signature(st):
            _write_json(memo, {"path": str(path), "stat": stat_signature(st), "sha256": digest})
    return digest


def _valid_entry(e: object) -> bool:
    return (
        isinstance(e, dict)
        and isinstance(e.get("entry"), str)
        and bool(_HEX.match(e["entry"]))
        and isinstance(e.get("deps"), dict)
        and all(isinstance(k, str) and os.path.isabs(k) and isinstance(v, str) for k, v in e["deps"].items())
        and isinstance(e.get("outputs"), list)
        and len(e["outputs"]) > 0
        and all(isinstance(o, str) and bool(_SHA.match(o)) for o in e["outputs"])
    )


def _read_manifest(path: Path) -> list[dict[str, Any]]:
    data = _read_json(path)
    if data is None:
        return []
    if not isinstance(data, list):
        _note(f"ignoring {path}: not a list of entries")
        return []
    good = [e for e in data if _valid_entry(e)]
    if len(good) != len(data):
        _note(f"ignoring {len(data) - len(good)} malformed entries in {path}")
    return good


def _clone(src: Path, dst: Path) -> None:
    """Copy `src` to a new file `dst`: a copy-on-write clone where the filesystem can,
    else an in-kernel copy, else a plain one. Never a link: each copy is independent."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        try:
            fcntl.ioctl(fo.fileno(), _FICLONE, fi.fileno())
        except OSError:
            try:
                remaining = os.fstat(fi.fileno()).st_size
                while remaining > 0:
                    n = os.copy_file_range(fi.fileno(), fo.fileno(), remaining)
                    if n == 0:
                        break
                    remaining -= n
            except OSError:
                fi.seek(0)
                fo.seek(0)
                fo.truncate()
                shutil.copyfileobj(fi, fo, 1 << 20)
        os.fchmod(fo.fileno(), stat.S_IMODE(os.fstat(fi.fileno()).st_mode) & 0o777)


class _Damaged(Exception):
    pass


def _publish(entry_dir: Path, hashes: Sequence[str], outputs: Sequence[Path], depfile: _Depfile | None, deps: Sequence[str]) -> bool:
    """Copy an entry's files into place, each verified against its hash, with the depfile of
    `deps` when one is asked for; False if any is bad."""
    text = depfile.text(deps) if depfile is not None else ""  # a path no depfile can name is an error, not damage
    try:
        with files.atomic_outputs(_finals(outputs, depfile)) as tmps:
            if depfile is not None:
                tmps[-1].write_text(text, encoding="utf-8")
            for i, (tmp, want) in enumerate(zip(tmps, hashes)):
                src = entry_dir / str(i)
                if src.is_symlink() or not src.is_file():
                    raise _Damaged
                _clone(src, tmp)
                if hash_file(tmp) != want:
                    raise _Damaged
                readers.note_written_hash(tmp, want)  # the outputs' manifest reads it, not the bytes again
    except (_Damaged, OSError, PyreeError):
        return False
    return True


class _DepHashes:
    """The dependency hashes one lookup takes, each file hashed at most once, and not at all
    where the cache remembers its hash with the stat it had (an inode cache, as ccache keeps):
    a hit re-hashed every header of its last build (133 files for the plugin sample, two
    thirds of a warm hit's time), when one stat each says they are unchanged.

    The memo (`stats/KEY.json`, one per action and key before file contents, so it stays
    small and covers the inputs hashed for the key as well as the lookup's) holds a hash only for a file
    whose ctime was over two seconds old when it was hashed and whose stat did not change
    while it was: any later write sets a ctime no user command can set back, so an equal
    stat means equal bytes (the rule _tool_digest keeps for tools)."""

    def __init__(self, root: Path, key: str) -> None:
        self.path = root / "stats" / f"{key}.json"
        known = _read_json(self.path)
        self.memo: dict[str, list[Any]] = known if isinstance(known, dict) else {}
        self.seen: dict[str, str | None] = {}
        # The stat of each file hashed while settled (its stat stands for its bytes): _verify
        # need not hash it again after the build when that stat is unchanged.
        self.settled: dict[str, list[Any]] = {}
        self.learned = False

    def __call__(self, dep: str) -> str | None:
        if dep in self.seen:
            return self.seen[dep]
        self.seen[dep] = digest = self._hash(dep)
        return digest

    def _hash(self, dep: str) -> str | None:
        try:
            st = os.stat(dep)
        except OSError:
            return None
        sig = stat_signature(st)
        known = self.memo.get(dep)
        if isinstance(known, list) and len(known) == 2 and known[0] == sig and isinstance(known[1], str) and _SHA.match(known[1]):
            self.settled[dep] = sig
            return known[1]
        digest = hash_file(Path(dep))
        if digest is not None and stat.S_ISREG(st.st_mode) and settled(st):
            with contextlib.suppress(OSError):
                if stat_signature(os.stat(dep)) == sig:
                    self.memo[dep] = [sig, digest]
                    self.settled[dep] = sig
                    self.learned = True
        return digest

    def save(self) -> None:
        """Remember what this lookup hashed (kept to the files it looked at: a memo never grows
        past one key's dependencies)."""
        if self.learned:
            with contextlib.suppress(OSError):
                _write_json(self.path, {d: self.memo[d] for d in self.seen if d in self.memo})


def _lookup(
    root: Path, base: str, outputs: Sequence[Path], hashes: _DepHashes, depfile: _Depfile | None = None
) -> tuple[list[str] | None, dict[str, str | None]]:
    """The dependencies of a stored build whose dependencies still hash the same, with its
    outputs copied into place; and every hash taken on the way (a snapshot for the build)."""
    try:
        for entry in reversed(_read_manifest(root / "manifests" / f"{base}.json")):
            if len(entry["outputs"]) != len(outputs):
                _note(f"ignoring entry {entry['entry']}: {len(entry['outputs'])} outputs, expected {len(outputs)}")
                continue
            if any(hashes(dep) != digest for dep, digest in entry["deps"].items()):
                continue
            outputs_mod.check_not_read(outputs, entry["deps"])
            entry_dir = root / "entries" / entry["entry"]
            if _publish(entry_dir, entry["outputs"], outputs, depfile, list(entry["deps"])):
                return list(entry["deps"]), hashes.seen
            _note(f"entry {entry_dir} is missing or damaged; rebuilding")
        return None, hashes.seen
    finally:
        hashes.save()


def _discard(path: Path) -> None:
    """Remove an entry of this cache: renamed aside first, so no reader sees half of it."""
    old = path.parent / f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.old"
    os.rename(path, old)
    if old.is_symlink() or not old.is_dir():
        old.unlink()
    else:
        files.remove_tree(old)


def _entry_intact(entry_dir: Path, hashes: Sequence[str]) -> bool:
    if entry_dir.is_symlink() or not entry_dir.is_dir():
        return False
    return all(not (entry_dir / str(i)).is_symlink() and hash_file(entry_dir / str(i)) == h for i, h in enumerate(hashes))


def _store(root: Path, base: str, private: Sequence[Path], dep_hashes: dict[str, str]) -> None:
    output_hashes = [hash_file(p) for p in private]
    if any(h is None for h in output_hashes):
        return
    for p, digest in zip(private, output_hashes):
        readers.note_written_hash(p, digest)  # type: ignore[arg-type]  # None ruled out above
    entry = _digest(base, *(f"{k}={v}" for k, v in sorted(dep_hashes.items())))
    entries = root / "entries"
    entries.mkdir(parents=True, exist_ok=True)
    final_dir = entries / entry
    if not _entry_intact(final_dir, output_hashes):  # type: ignore[arg-type]
        if final_dir.exists() or final_dir.is_symlink():
            _note(f"replacing damaged entry {final_dir}")
            _discard(final_dir)
        tmp_dir = files._temp_name(final_dir)  # also sweeps what killed writers of this entry left
        try:
            tmp_dir.mkdir()
            for i, src in enumerate(private):
                _clone(src, tmp_dir / str(i))
                # A hit checks each copy against its hash before it is published (_publish), so
                # a copy gone wrong here costs a rebuild there, never wrong bytes; reading 575 MB
                # of weights back here cost VGG-19's import 0.37 s.
                if os.path.getsize(tmp_dir / str(i)) != os.path.getsize(src):
                    return
            with contextlib.suppress(OSError):  # a concurrent identical build stored it first
                os.rename(tmp_dir, final_dir)
        finally:
            files.remove_tree(tmp_dir)
    manifest = root / "manifests" / f"{base}.json"
    with _locked(root / "locks" / f"{base}.lock"):
        known = [e for e in _read_manifest(manifest) if e["entry"] != entry]
        known.append({"entry": entry, "deps": dep_hashes, "outputs": output_hashes})
        _write_json(manifest, known[-_MANIFEST_ENTRIES:])


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fs_now(near: Path) -> int:
    return files.fs_now(near)


def _verify(deps: Sequence[str], before: dict[str, str | None], started: int, settled_stats: Mapping[str, Any] = {}) -> tuple[dict[str, str] | None, str]:  # noqa: B006 (read only)
    """Hash every dependency after the build; None (and which file) if any changed while
    the tool ran: its hash differs from the one taken before, it changed while being
    hashed, or it was written after the build started. A file whose stat was settled when it
    was hashed before (`settled_stats`) and is the same now keeps that hash: a write since
    would have set a ctime no user command can set back (the memo's rule, _DepHashes)."""
    hashes: dict[str, str] = {}
    for dep in deps:
        try:
            st1 = os.stat(dep)
            if not stat.S_ISREG(st1.st_mode):
                continue
            known = before.get(dep)
            if known is not None and settled_stats.get(dep) == stat_signature(st1) and st1.st_ctime_ns < started:
                hashes[dep] = known
                continue
            digest = hash_file(Path(dep))
            st2 = os.stat(dep)
        except OSError:
            return None, f"{dep} was removed during the build"
        if digest is None or stat_signature(st1) != stat_signature(st2) or st2.st_ctime_ns >= started or (dep in before and before[dep] != digest):
            return None, f"{dep} changed during the build"
        hashes[dep] = digest
    return hashes, ""


def _pause_point(name: str) -> None:
    where = os.environ.get(PAUSE_ENV)
    if not where:
        return
    (Path(where) / name).write_text(str(os.getpid()), encoding="utf-8")
    deadline = time.monotonic() + 300
    while not (Path(where) / f"{name}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _path_forms(outputs: Sequence[Path]) -> list[tuple[str, str, str]]:
    """(text in a command, its token, its absolute form) for each output's temporary/scratch
    names and the output itself; a replay uses absolute forms, whatever its directory."""
    forms = []
    for i, out in enumerate(outputs):
        absolute = out.resolve()
        for j, path in enumerate(dict.fromkeys((out, absolute))):
            forms.append((os.fspath(path.parent / f".{path.name}."), f"\x00T{i}.{j}\x00", os.fspath(absolute.parent / f".{absolute.name}.")))
            forms.append((os.fspath(path), f"\x00O{i}.{j}\x00", os.fspath(absolute)))
    return sorted(forms, key=lambda f: -len(f[0]))


def _directory_forms(outputs: Sequence[Path]) -> list[tuple[str, str]]:
    """(a directory as a command names it, its token) for each output's directory, relative
    and absolute: the `mkdir -p DIR` of a build names the directory alone."""
    forms = []
    for i, out in enumerate(outputs):
        # As given, absolute, and relative to this directory (where the steps' `cd` starts).
        named = dict.fromkeys((os.fspath(out.parent), os.fspath(out.resolve().parent), os.path.relpath(out.resolve().parent)))
        forms += [(text, f"\x00D{i}.{min(j, 1)}\x00") for j, text in enumerate(named) if text not in ("", ".") and not text.startswith("..")]
    return sorted(forms, key=lambda f: -len(f[0]))


def _save_commands(root: Path, base: str, outputs: Sequence[Path], lines: list[str]) -> None:
    """The commands of a build, with the outputs' names as tokens: a later hit, under other
    output names, prints them as the commands that would have run."""
    templated = []
    for line in lines:
        for text, token, _ in _path_forms(outputs):
            line = line.replace(text, token)
        for text, token in _directory_forms(outputs):
            # A whole word of the shell line (or its start), never part of another name.
            line = re.sub(rf"(?<![^\s'\"=(]){re.escape(text)}(?![^\s'\"/);])", token, line)
        templated.append(re.sub(r"(\x00T\d+\.\d\x00)\d+-[0-9a-f]{8}", r"\1", line))
    target = root / "commands" / f"{base}.json"
    with contextlib.suppress(OSError):
        target.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(target, json.dumps(templated))


def _replay_commands(root: Path, base: str, outputs: Sequence[Path]) -> None:
    try:
        lines = json.loads((root / "commands" / f"{base}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    unique = f"{os.getpid()}-{os.urandom(4).hex()}"
    for line in lines:
        # Every token, whichever form (relative or absolute) the recording build named its
        # outputs in, becomes this build's absolute path: no token is ever printed.
        for i, out in enumerate(outputs):
            absolute = out.resolve()
            for j in (0, 1):
                line = line.replace(f"\x00T{i}.{j}\x00", os.fspath(absolute.parent / f".{absolute.name}.") + unique)
                line = line.replace(f"\x00O{i}.{j}\x00", os.fspath(absolute))
                line = line.replace(f"\x00D{i}.{j}\x00", os.fspath(absolute.parent))
        echo.echo_command(line, note="(cache hit)")


def cached_action(
    action: str,
    *,
    key: Sequence[str],
    inputs: Sequence[Path],
    outputs: Sequence[Path],
    build: Callable[[list[Path]], Sequence[str]],
    tools_used: Sequence[toolchain.Tool] = (),
    uncacheable: str | None = None,
    headers: Inputs | None = None,
    check: Callable[[Sequence[Path]], None] | None = None,
    depfile: str | os.PathLike[str] | None = None,
    depends_also: Sequence[str | os.PathLike[str]] = (),
) -> list[str]:
    """Produce `outputs` from the cache, or by `build` and then store them.

    `key` holds everything besides file contents that changes the result (flags, output
    names); `inputs` every file known to be read before the build runs (sources, objects
    and specs named by the program or by flags); `tools_used` the tools, keyed by identity
    and content. `build(private)` writes each output to the private temporary path given
    for it (they are renamed into place afterwards, all or none) and returns every file it
    read (a files.Reads whose `unlisted` is set: it may have read others, and nothing is stored). `uncacheable`, when set, says why the inputs cannot be known: then the action
    always builds. `headers` (core.inputs: c_includes, header_lookups) says how a C-family
    step's header names resolved, found or not: that is keyed, its headers hashed, its
    refusal honoured, and the directories searched returned too, for the depfile. `check`
    raises a PyreeError unless the files given are what the step makes (PTX for the sm, an
    ELF of the arch): bytes from the remote tier pass it before they become outputs, and an
    action without one never takes a remote hit. `depfile` is renamed with the outputs, all or
    none (every dependency, then `depends_also`), so no stop leaves outputs beside a missing or
    stale depfile that Make would trust. Returns every dependency."""
    if headers is not None:
        watched = [str(d) for d in watched_directories(headers.directories, outputs)]
        deps = cached_action(
            action, key=[*key, *headers.resolution], inputs=[*inputs, *headers.files], outputs=outputs, build=build,
            tools_used=tools_used, uncacheable=uncacheable or headers.uncacheable, check=check,
            depfile=depfile, depends_also=[*watched, *map(str, depends_also)],
        )  # fmt: skip
        return [*deps, *watched]
    key = list(key)
    if any(_HOST_VALUE.search(k) for k in key):  # code for "this CPU": the CPU is part of the key
        key.append(f"host-cpu={host_cpu()}")
    known = [os.path.abspath(p) for p in inputs]
    tool_paths = [str(t.path) for t in tools_used]
    root = _usable_root(action, uncacheable)
    slot = _Slot(root)
    slot.inputs, slot.check, slot.tools = known, check, tuple(tools_used)
    if depfile is not None:
        slot.depfile = _Depfile(Path(depfile), outputs[0], (*tool_paths, *map(str, depends_also)))
    if root is not None:
        # Each tool's identity, content and the environment it reads (toolchain.ENVIRONMENT_READ).
        tool_ids = [f"{t.identity()}#{_tool_digest(root, t.path)}" for t in tools_used] + [e for t in tools_used for e in toolchain.environment_read(t)]
        hashes = _DepHashes(root, _digest(action, *key, *tool_ids, *(o.suffix for o in outputs), *known))
        before = {p: hashes(p) for p in known}
        slot.base = _digest(action, *key, *tool_ids, *(o.suffix for o in outputs), *(f"{p}={h}" for p, h in before.items()))
        hit = _cached_outputs(action, slot, outputs, before, hashes)
        if hit is not None:
            return [*hit, *tool_paths]
    return _build_and_store(action, slot, outputs, build, known, tool_paths)


class _Slot:
    """Where one action's outputs go in the cache: its root (None: not caching), its key, the
    dependency hashes known before the build, and the remote tier asked on a local miss."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.base = ""
        self.before: dict[str, str | None] = {}
        self.settled: dict[str, Any] = {}  # _DepHashes.settled of the lookup
        self.remote = None
        self.inputs: list[str] = []  # known before the build: every entry's dependencies name them
        self.tools: tuple[toolchain.Tool, ...] = ()
        self.check: Callable[[Sequence[Path]], None] | None = None
        self.depfile: _Depfile | None = None


class _Depfile:
    """The depfile an action writes with its outputs: `target` and, after the dependencies each
    build or hit reports, the `also` paths (tools, directories searched for headers)."""

    def __init__(self, path: Path, target: Path, also: Sequence[str]) -> None:
        self.path, self.target, self.also = path, target, tuple(also)

    def text(self, deps: Sequence[str]) -> str:
        return files.depfile_text(self.target, [*deps, *self.also])


def _finals(outputs: Sequence[Path], depfile: _Depfile | None) -> list[Path]:
    """What one all-or-none rename puts in place: the outputs, then the depfile if any."""
    return [*outputs, *([depfile.path] if depfile is not None else [])]


def _usable_root(action: str, uncacheable: str | None) -> Path | None:
    configured = cache_root()
    root = _open_cache(configured) if configured is not None else None
    if root is not None and uncacheable:
        echo.log_step(f"  {action}: not cached ({uncacheable})")
        return None
    return root


def _cached_outputs(action: str, slot: _Slot, outputs: Sequence[Path], before: dict[str, str | None], hashes: _DepHashes) -> list[str] | None:
    """The dependencies of a local or remote hit (its outputs then in place), or None after
    noting in `slot` what the lookups learned for the build and store that follow."""
    assert slot.root is not None
    try:
        with echo.muted_commands():  # a hit prints the recorded commands instead (below)
            hit, seen = _lookup(slot.root, slot.base, outputs, hashes, slot.depfile)
    except OSError as exc:
        _note(f"lookup failed: {exc}")
        hit, seen = None, {}
    if hit is not None:
        echo.log_step(f"  {action}: cache hit ({', '.join(o.name for o in outputs)})")
        _replay_commands(slot.root, slot.base, outputs)
        return hit
    slot.before = {**seen, **before}
    slot.settled = hashes.settled
    slot.remote = _remote_tier(slot.root)
    if slot.remote is None or slot.check is None:  # bytes no check can vouch for are never taken
        return None
    judge = functools.partial(_deps_unchanged, known=slot.before, required=slot.inputs, outputs=outputs, tools=slot.tools, note=slot.remote.note)
    fetched = slot.remote.fetch(slot.base, len(outputs), judge)
    if fetched is None:
        return None
    try:
        _take_remote(slot, outputs, fetched)
    except PyreeError as exc:
        slot.remote.note("check", f"a record's output is not what {action} makes ({exc.what}); not used")
        return None
    echo.log_step(f"  {action}: remote cache hit ({', '.join(o.name for o in outputs)})")
    return list(fetched.deps)


def _take_remote(slot: _Slot, outputs: Sequence[Path], fetched: remote.Fetched) -> None:
    """Write fetched bytes to private temporaries, check them, store them locally from there
    (never from the final paths, which another process may rewrite), then rename them into
    place, all or none."""
    assert slot.root is not None and slot.check is not None
    text = slot.depfile.text(list(fetched.deps)) if slot.depfile is not None else ""
    with files.atomic_outputs(_finals(outputs, slot.depfile)) as tmps:
        private = tmps[: len(outputs)]
        if slot.depfile is not None:
            tmps[-1].write_text(text, encoding="utf-8")
        for tmp, data, executable in zip(private, fetched.blobs, fetched.executable):
            with open(tmp, "xb") as handle:  # the umask's mode, as a tool's output gets
                handle.write(data)
                if executable:  # +x wherever the umask left +r (never os.umask: other threads build too)
                    mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
                    os.fchmod(handle.fileno(), mode | (mode & 0o444) >> 2)
        slot.check(private)
        with contextlib.suppress(OSError):
            _store(slot.root, slot.base, private, fetched.deps)  # the local tier answers next time


def _build_and_store(action: str, slot: _Slot, outputs: Sequence[Path], build: Callable[[list[Path]], Sequence[str]],
                     known: list[str], tool_paths: list[str]) -> list[str]:  # fmt: skip
    root = slot.root
    stored = False
    # Recorded from the first command to the rename into place, so that a later hit can
    # print the commands that would have made the outputs, pasteable as they are.
    with echo.recording() as commands, files.atomic_outputs(_finals(outputs, slot.depfile)) as tmps:
        private = tmps[: len(outputs)]
        started = _fs_now(private[0]) if root is not None else 0
        read = build(list(private))
        _pause_point("built")
        excluded = set(tool_paths)
        deps = [d for d in dict.fromkeys([*known, *(os.path.abspath(d) for d in read), *map(str, toolchain.package_files())]) if d not in excluded]
        outputs_mod.check_not_read(outputs, deps)  # the tool's own list: a scan before the build can miss one
        if slot.depfile is not None:
            tmps[-1].write_text(slot.depfile.text(deps), encoding="utf-8")
        unlisted = getattr(read, "unlisted", None)  # files.Reads: the tool may have read files its list leaves out
        if root is not None and unlisted:
            echo.log_step(f"  {action}: built, not cached ({unlisted})")
        elif root is not None:
            stored = _store_built(action, slot, private, deps, started)
    if stored and root is not None:
        if slot.depfile is not None:  # pyree_build's own write, under this build's name: not a command a hit replays
            moved = echo.shell_line(["mv", tmps[-1], slot.depfile.path])
            commands = [c for c in commands if c != moved]
        _save_commands(root, slot.base, outputs, commands)
    return [*deps, *tool_paths]


def _store_built(action: str, slot: _Slot, private: Sequence[Path], deps: list[str], started: int) -> bool:
    """Store what was just built, unless an input changed while it ran; whether it was stored."""
    assert slot.root is not None
    hashes, why = _verify(deps, slot.before, started, slot.settled)
    if hashes is None:
        echo.log_step(f"  {action}: built, not cached ({why})")
        return False
    try:
        _store(slot.root, slot.base, private, hashes)
    except OSError as exc:  # a full or read-only cache must not fail the build
        echo.log_step(f"  note: not cached ({exc.strerror or exc})")
        return False
    if slot.remote is not None:
        slot.remote.upload(slot.base, private, hashes)
    return True


# --- The remote tier (remote_cache.py): asked on a local miss, given what was stored ----


def _remote_tier(root: Path):  # type: ignore[no-untyped-def]
    if not os.environ.get("PYREE_BUILD_REMOTE_CACHE"):
        return None  # the common case costs no import
    return remote_cache.from_env(state_dir=root)


def _deps_unchanged(
    deps: Mapping[str, str], known: dict[str, str | None], required: Sequence[str] = (), outputs: Sequence[Path] = (),
    tools: Sequence[toolchain.Tool] = (), note: Callable[[str, str], None] | None = None,
) -> bool:  # fmt: skip
    """Whether every dependency of a remote entry hashes here as it did there, the entry names
    every input known before the build (a build reads at least those), and none is an output
    (the local build then says so). Every dependency must also be one of those inputs or a
    file of pyree_build or of the `tools` (_trusted_dirs), checked before any file is looked
    at: a server that could name any path would learn, from which blobs are fetched, whether
    a local file (`~/secret.txt`) holds what it guessed."""
    if not deps or any(path not in deps for path in required):
        return False
    inputs = set(required)
    others = [dep for dep in deps if dep not in inputs]
    if others and not _all_inside(others, _trusted_dirs(tuple(tools))):
        if note is not None:
            note("foreign", "a record names a dependency that is not an input of this build; it was not looked at")
        return False
    if outputs_mod.outputs_read(outputs, deps):
        return False
    for dep, digest in deps.items():
        if dep not in known:
            known[dep] = hash_file(Path(dep))
        if known[dep] != digest:
            return False
    return True


@functools.lru_cache(maxsize=16)
def _trusted_dirs(tools: tuple[toolchain.Tool, ...]) -> list[str]:
    """Where a step reads besides its inputs: pyree_build's own files, each tool's installation,
    and a C compiler's system header directories (those headers are the tool's)."""
    homes = [PACKAGE_DIR, *(t.path.parent for t in tools), *(d for t in tools for d in toolchain.system_include_dirs(t))]
    return [os.fspath(d) for d in dict.fromkeys([*map(Path.absolute, homes), *map(Path.resolve, homes)])]


def _all_inside(paths: Sequence[str], directories: Sequence[str]) -> bool:
    """Whether each of `paths`, spelled plainly (no `..`, no `//`), names a file under one of `directories`."""
    prefixes = tuple(d.rstrip(os.sep) + os.sep for d in directories)
    return all(os.path.normpath(p) == p and p.startswith(prefixes) for p in paths)


def _entry_dirs(root: Path) -> list[Path]:
    entries = root / "entries"
    if entries.is_symlink() or not entries.is_dir():
        return []
    return [p for p in entries.iterdir() if _HEX.match(p.name) and not p.is_symlink() and p.is_dir()]


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def cache_info() -> dict[str, object]:
    root = cache_root()
    if root is None:
        return {"root": None, "entries": 0, "bytes": 0, "marked": False}
    marked = is_cache_dir(root)
    entries = _entry_dirs(root) if marked else []
    return {"root": str(root), "entries": len(entries), "bytes": sum(_tree_bytes(e) for e in entries), "marked": marked}


# What the cache writes in each of its directories; `cache clear` removes only these.
_OWN_NAMES = {
    "entries": re.compile(r"[0-9a-f]{40}\Z"),
    "manifests": re.compile(r"[0-9a-f]{40}\.json\Z"),
    "locks": re.compile(r"[0-9a-f]{40}\.lock\Z"),
    "tools": re.compile(r"[0-9a-f]{40}\.json\Z"),
    "commands": re.compile(r"[0-9a-f]{40}\.json\Z"),
    "stats": re.compile(r"[0-9a-f]{40}\.json\Z"),  # the dependency hashes a lookup may trust by stat (_DepHashes)
    "inline": re.compile(r"[0-9a-f]{20}\Z"),  # pb.load_inline's build directories (work_dir)
    "libm": re.compile(r"[0-9a-f]{20}\Z"),  # the freestanding math libraries, one folder per zig (work_dir)
    "facts": re.compile(r"[0-9a-f]{40}\.json\Z"),  # what was read from a module or plugin, by content (cache.facts)
}


def cache_clear() -> tuple[int, list[Path]]:
    """Remove what the cache wrote; return how many entries were removed and the paths of
    anything else found in its directories (left alone). Refuses a directory that is not a
    cache: clearing must never delete someone's files."""
    root = cache_root()
    if root is None or not root.exists():
        return 0, []
    if not is_cache_dir(root):
        raise PyreeError(
            f"{CACHE_ENV} names a directory that is not a pyree_build cache (no {_TAG} written by pyree_build); nothing was removed",
            file=root,
            fix=f"check {CACHE_ENV}; a cache directory is created (and marked) by the first cached build",
        )
    removed = 0
    left: list[Path] = []
    for sub, own in _OWN_NAMES.items():
        folder = root / sub
        if folder.is_symlink():
            left.append(folder)
            continue
        if not folder.is_dir():
            continue
        for child in folder.iterdir():
            is_ours = (own.match(child.name) or _OWN_TEMP.match(child.name)) and not child.is_symlink()
            if not is_ours:
                left.append(child)
                continue
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
                removed += sub == "entries" and not child.name.startswith(".") and not child.exists()
            else:
                with contextlib.suppress(FileNotFoundError):
                    child.unlink()
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty
    return removed, left
