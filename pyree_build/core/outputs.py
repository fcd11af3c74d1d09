"""Which files a verb may write or remove, decided before anything is touched.

The rule: a verb replaces only the outputs the user named, and only when each is a regular
file or absent; an output that is also an input (the same path, a symlink to it or a hard
link of it) or the depfile, or that exists as a directory, FIFO or device node, is refused.
A directory output (`dump`) records what it wrote, with hashes, in a hidden manifest, and
later removes or replaces only files it wrote that are unchanged since; a file output that
must never replace the user's work (`import`'s MLIR and parameters) is recorded the same way,
in its directory's manifest (check_ours before the step, record_ours after it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pyree_build.core import args, inputs, processes, readers
from pyree_build.core import files as files_mod
from pyree_build.core.errors import PyreeError

PathLike = str | os.PathLike[str]

# Temporaries live beside an output under a longer name (".NAME.PID-RANDOM.build", and
# a compiler may add its own suffix to that): names are refused that leave less room.
TEMP_NAME_ROOM = 40
_PATH_MAX = 4096
_FIX_OTHER_NAME = "choose another output path"


def _stat(p: Path) -> os.stat_result | None:
    try:
        return p.stat()
    except (OSError, ValueError):
        return None


def _existing_ancestor(p: Path) -> Path:
    for parent in Path(os.path.abspath(p)).parents:
        if os.path.lexists(parent):
            return parent
    return Path("/")


def _check_parents(p: Path, role: str) -> None:
    """Every existing ancestor must be a directory (`-o some_file/x.so` is refused here)."""
    for parent in Path(os.path.abspath(p)).parents:
        if not os.path.lexists(parent):
            continue
        st = _stat(parent)
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise PyreeError(
                f"the {role}'s parent {parent} is {'a broken link' if st is None else readers.kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, not a directory",
                file=p,
                fix=f"choose an {role} path whose parent directories are directories",
            )
        return


def _check_name(p: Path, role: str) -> None:
    name_bytes = len(os.fsencode(p.name))
    try:
        name_max = os.pathconf(_existing_ancestor(p), "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    longest = max(1, name_max - TEMP_NAME_ROOM)
    if name_bytes > longest:
        raise PyreeError(
            f"the {role}'s file name is {name_bytes} bytes long; this file system allows {name_max}, and pyree_build needs "
            f"{TEMP_NAME_ROOM} of those for the temporary files it writes beside it",
            file=p.name[:60] + "...",
            fix=f"choose an {role} name of at most {longest} bytes",
        )
    full = len(os.fsencode(os.path.abspath(p)))
    if full + TEMP_NAME_ROOM > _PATH_MAX:
        raise PyreeError(
            f"the {role}'s path is {full} bytes long; paths are limited to {_PATH_MAX} bytes, temporary names included",
            file=p.name,
            fix=f"choose an {role} path of at most {_PATH_MAX - TEMP_NAME_ROOM} bytes",
        )


def _identity(p: Path) -> tuple[str, tuple[int, int] | None]:
    st = _stat(p)
    return os.path.realpath(p), ((st.st_dev, st.st_ino) if st is not None else None)


def _same(a: tuple[str, tuple[int, int] | None], b: tuple[str, tuple[int, int] | None]) -> bool:
    return a[0] == b[0] or (a[1] is not None and a[1] == b[1])


def check_output_file(p: Path, role: str = "output") -> None:
    """`p` may be written: its name fits, its parents are directories, and it is absent or
    a regular file (a symlink counts as what it points to)."""
    _check_name(p, role)
    _check_parents(p, role)
    if not os.path.lexists(p):
        return
    st = _stat(p)
    if st is None:  # a dangling symlink: replacing it loses nothing
        return
    if stat.S_ISDIR(st.st_mode):
        raise PyreeError(
            f"the {role} is an existing directory",
            file=p,
            fix=f"name a file for the {role}, e.g. {p}/<name>",
        )
    if not stat.S_ISREG(st.st_mode):
        raise PyreeError(
            f"the {role} exists and is {readers.kind(st.st_mode)}; pyree_build replaces only regular files",
            file=p,
            fix=_FIX_OTHER_NAME,
        )


def check_output_dir(p: Path, role: str = "output directory") -> None:
    """`p` may hold outputs: absent (it is created) or a directory."""
    _check_parents(p, role)
    st = _stat(p) if os.path.lexists(p) else None
    if os.path.lexists(p) and (st is None or not stat.S_ISDIR(st.st_mode)):
        what = "a broken link" if st is None else "a file" if stat.S_ISREG(st.st_mode) else readers.kind(st.st_mode)
        raise PyreeError(f"the {role} exists and is {what}, not a directory", file=p, fix=f"choose a directory for the {role} (a new one is created)")


def check_outputs(
    outputs: Iterable[object],
    inputs: Iterable[object] = (),
    *,
    depfile: object = None,
    output_dirs: Iterable[object] = (),
) -> list[Path]:
    """Refuse, before anything is touched, any output that would replace something other
    than an earlier output: see the module docstring. Returns the outputs as Paths."""
    dirs = [args.path(d, "output directory") for d in output_dirs]
    outs = [args.path(o, "output") for o in outputs]
    dep = args.optional_path(depfile, "depfile")
    ins = [args.path(i, "input") for i in inputs]
    for d in dirs:
        check_output_dir(d)
    named = [(o, "output") for o in outs] + ([(dep, "depfile")] if dep is not None else [])
    for p, role in named:
        check_output_file(p, role)
    input_ids = [(i, _identity(i)) for i in ins]
    seen: list[tuple[Path, str, tuple[str, tuple[int, int] | None]]] = []
    for p, role in named:
        ident = _identity(p)
        for i, i_ident in input_ids:
            if _same(ident, i_ident):
                raise PyreeError(
                    f"the {role} is also an input ({i}): writing it would destroy the input",
                    file=p,
                    fix=f"choose another {role} path; pyree_build never writes over its inputs",
                )
        for q, q_role, q_ident in seen:
            if _same(ident, q_ident):
                raise PyreeError(
                    f"the {role} and the {q_role} {q} are the same file",
                    file=p,
                    fix=f"give the {role} its own path",
                )
        seen.append((p, role, ident))
    return outs


def outputs_read(outputs: Sequence[Path], read: Iterable[str | os.PathLike[str]]) -> list[tuple[Path, str]]:
    """Each existing output that is also a file a build read (the same file by inode, so a
    link or another spelling of it counts), with the name it was read under.

    The check that holds whatever a scan before the build missed (`#include CONFIG`, a
    flag naming a search path): the tool's own list of what it read, checked before any
    output replaces anything."""
    ids: dict[tuple[int, int], Path] = {}
    for o in outputs:
        st = _stat(Path(o))
        if st is not None:
            ids[(st.st_dev, st.st_ino)] = Path(o)
    if not ids:
        return []
    found = []
    for dep in read:
        st = _stat(Path(dep))
        if st is not None and (st.st_dev, st.st_ino) in ids:
            found.append((ids.pop((st.st_dev, st.st_ino)), os.fspath(dep)))
    return found


def check_not_read(outputs: Sequence[Path], read: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse to replace an output that the build read (see outputs_read): the new bytes are
    complete, but putting them there would destroy an input."""
    clash = outputs_read(outputs, read)
    if clash:
        out, dep = clash[0]
        raise PyreeError(
            f"the output is a file the build read ({dep}): replacing it would destroy that input; nothing was written",
            file=out,
            fix="choose another output path; pyree_build never writes over its inputs",
        )


_MAX_SCANNED = 500


def included_files(sources: Iterable[Path], include_dirs: Iterable[PathLike] = ()) -> list[Path]:
    """Files the sources may `#include` (transitively), found by a textual scan: before a
    compile the compiler's own list is unknown, and an output must not be one of them
    (`plugin p.c -o helper.h`). It errs towards finding too many: conditional includes count."""
    dirs = [Path(d) for d in include_dirs]
    found: dict[str, Path] = {}
    todo = [Path(s) for s in sources]
    while todo and len(found) < _MAX_SCANNED:
        current = todo.pop()
        try:
            text = current.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            continue
        for name in (d.name for d in inputs.include_directives(text) if d.kind in ("include", "embed") and d.name):
            for base in (current.parent, *dirs):
                candidate = base / name
                if candidate.is_file():
                    key = os.path.realpath(candidate)
                    if key not in found:
                        found[key] = candidate
                        todo.append(candidate)
                    break
    return list(found.values())


# --- Directory outputs: a manifest of what pyree_build wrote ------------------------

MANIFEST = ".pyree_build-written.json"


def file_hash(p: Path) -> str | None:
    """sha256 of a regular file's bytes; None for anything else (absent, a directory, a FIFO)."""
    if os.path.islink(p):
        return None
    return readers.sha256_of_written(p)  # a FIFO swapped in after a check would block a plain open


def _relative_name(name: str) -> bool:
    """A name below the directory (`src/pkg/__init__.py`): never absolute, `.` or `..`."""
    return bool(name) and not name.startswith("/") and all(part not in ("", ".", "..") for part in name.split("/"))


def read_manifest(directory: Path) -> dict[str, list[str]]:
    """name -> the hashes pyree_build wrote under that name (more than one only while a
    write is under way, so a killed write leaves every file recognisable)."""
    try:
        data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        files = data["files"]
        return {str(k): [str(h) for h in v] for k, v in files.items() if isinstance(v, list) and _relative_name(str(k))}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def write_manifest(directory: Path, files: Mapping[str, Sequence[str]]) -> None:
    try:
        files_mod.write_atomic(directory / MANIFEST, json.dumps({"files": {k: list(v) for k, v in sorted(files.items())}}, indent=1) + "\n")
    except OSError as exc:
        if exc.errno in files_mod.DISK_ERRORS:
            raise files_mod.disk_error(exc, directory / MANIFEST) from None
        raise


def _in_the_way(directory: Path, in_the_way: list[str], old: Mapping[str, object], verb: str, fix: str | None) -> PyreeError:
    """The refusal that names each file in the way: edited since, or never written by pyree_build."""
    edited = [n for n in in_the_way if n in old]
    foreign = [n for n in in_the_way if n not in old]
    lines = []
    if edited:
        lines.append("edited since pyree_build wrote them: " + ", ".join(edited))
    if foreign:
        lines.append("not written by pyree_build: " + ", ".join(foreign))
    return PyreeError(
        f"{len(in_the_way)} file(s) in the way would be overwritten; nothing was changed",
        file=directory,
        details="\n".join(lines),
        fix=fix
        or f"copy your edits elsewhere (e.g. a directory for --substitute-from) and remove them here, choose another directory, or pass --force to overwrite them ({verb} --force)",
    )


def replace_directory_files(
    directory: Path,
    staged: Mapping[str, Path],
    *,
    inputs: Sequence[Path] = (),
    force: bool = False,
    verb: str = "dump",
    prune: bool = True,
    fix: str | None = None,
) -> None:
    """Move the `staged` files (name -> a file on the same file system) into `directory`,
    and remove the files an earlier run wrote there that this one does not write.

    Only files recorded in the manifest with their current bytes are replaced or removed;
    any other file in the way (edited since, or never written by pyree_build) is refused
    by name, before anything moves, unless `force` (which replaces edited or foreign
    regular files, and leaves edited files an earlier run wrote alone rather than removing them);
    without `prune` the files of an earlier run that this one does not write stay, still known.
    Names may hold `/` (a file in a subdirectory, made as needed). `fix` replaces the advice
    given when files are in the way."""
    old = read_manifest(directory)
    input_ids = [_identity(i) for i in inputs]
    new_hashes = {name: file_hash(src) for name, src in staged.items()}
    check_outputs([directory / name for name in staged], inputs)
    in_the_way: list[str] = []
    stale_ours: list[str] = []
    kept_ours: dict[str, list[str]] = {}
    for name in sorted(set(staged) | set(old)):
        final = directory / name
        if not os.path.lexists(final):
            continue
        current = file_hash(final)
        ours = current is not None and current in old.get(name, [])
        if name in staged:
            if not ours and current != new_hashes[name]:  # the same bytes: replacing loses nothing
                in_the_way.append(name)
        elif ours and prune and not any(_same(_identity(final), i) for i in input_ids):
            stale_ours.append(name)
        elif ours and not prune:
            kept_ours[name] = old[name]
        # else: an edited leftover of an earlier run stays, unrecorded: it is the user's now
    if in_the_way and not force:
        raise _in_the_way(directory, in_the_way, old, verb, fix)
    # Record old and new hashes first: a write killed half-way leaves every file known.
    during = {name: list(dict.fromkeys([*old.get(name, []), h])) for name, h in new_hashes.items() if h is not None}
    for name in [*stale_ours, *kept_ours]:
        during.setdefault(name, old[name])
    with processes.shielded():  # a stop moves every file or none (a kill: the manifest written first knows each)
        write_manifest(directory, during)
        for name, src in staged.items():
            if "/" in name:
                (directory / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, directory / name)
        for name in stale_ours:
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()
        # The manifest written before the moves already knows every file now here; this one only
        # forgets the replaced bytes, so a full disk here is no failure (the step is complete).
        with contextlib.suppress(PyreeError):
            write_manifest(directory, {**kept_ours, **{name: [h] for name, h in new_hashes.items() if h is not None}})


# --- File outputs recorded like a directory's --------------------------------------


def check_ours(outputs: Sequence[Path], *, force: bool, verb: str) -> None:
    """Refuse, by name, each output that exists and is not what pyree_build last wrote
    there (its directory's manifest has no entry with its current bytes): a file the user
    wrote or edited is replaced only with `force`."""
    in_the_way: list[tuple[Path, str]] = []
    for p in outputs:
        if not os.path.lexists(p):
            continue
        current = file_hash(p)
        known = read_manifest(p.parent).get(p.name)
        if current is None or known is None or current not in known:
            in_the_way.append((p, "edited since pyree_build wrote it" if known else "not written by pyree_build"))
    if in_the_way and not force:
        raise PyreeError(
            f"{len(in_the_way)} output(s) in the way would be overwritten; nothing was changed",
            file=in_the_way[0][0],
            details="\n".join(f"{p}: {why}" for p, why in in_the_way),
            fix=f"move your file elsewhere, choose another output path, or pass --force to overwrite it ({verb} --force)",
        )


def record_ours(outputs: Sequence[Path]) -> None:
    """Record each output's bytes in its directory's manifest, under a lock on the directory
    (parallel builds write outputs into one directory: no entry may be lost)."""
    by_directory: dict[Path, list[Path]] = {}
    for p in outputs:
        by_directory.setdefault(p.parent, []).append(p)
    for directory, written in by_directory.items():
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            files = read_manifest(directory)
            for p in written:
                current = file_hash(p)
                if current is not None:
                    files[p.name] = [current]
            write_manifest(directory, files)
        finally:
            os.close(fd)  # and with it the lock
