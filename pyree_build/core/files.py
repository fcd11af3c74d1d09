"""Writing outputs safely: atomic renames, private scratch directories, depfiles."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pyree_build.core import echo, processes
from pyree_build.core.errors import PyreeError

# Directories made for outputs by the command under way (None: no command scope, nothing is
# recorded): a command that fails removes those still empty, so it leaves no trace.
_CREATED: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("pyree_build_created_dirs", default=None)
# What a full or read-only file system raises while an output is written.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


@contextlib.contextmanager
def command_scope() -> Iterator[None]:
    """One command: when it fails (any exception, a stop included), every directory it made
    for its outputs that is still empty is removed, deepest first. The CLI and the Python
    API run each verb in one."""
    if _CREATED.get() is not None:  # nested (a verb calling another): the outer scope decides
        yield
        return
    created: list[Path] = []
    token = _CREATED.set(created)
    try:
        yield
    except BaseException:
        with processes.shielded():
            for directory in reversed(created):
                with contextlib.suppress(OSError):
                    directory.rmdir()  # only an empty one: a file the command or the user put there keeps it
        raise
    finally:
        _CREATED.reset(token)


_NEARLY_FULL = 1 << 20
_DISK_FULL_TEXT = "no space left on device"  # as a message already says it


def _free_bytes(directory: Path) -> int | None:
    try:
        st = os.statvfs(directory)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def disk_error(exc: OSError, what: Path) -> PyreeError:
    """A write that a full (or read-only) file system refused, as the error a user reads."""
    return PyreeError(
        f"cannot write this output: {exc.strerror or exc}; nothing was replaced",
        file=what,
        fix="free space on that file system (or make it writable), or choose an output path on another one",
    )


def prepare_output_dir(path: Path) -> None:
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    created = _CREATED.get()
    try:
        echo.make_dir(path)
        if created is not None:
            created.extend(reversed(missing))  # outermost first
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
    except (ProcessLookupError, OverflowError, ValueError):  # a pid no process can have
        return False
    except PermissionError:
        return True
    return True


# Any temporary pyree_build names beside an output (`.NAME.PID-RANDOM` + one of its suffixes:
# a scratch directory, a temporary output, a compiler's depfile or its own `-<random>.tmp`),
# whichever output it was for: a build killed while writing one output is swept by the next
# build into that directory, not only by the next build of the same output.
_OUR_TEMP = re.compile(r"\..+\.(\d+)-[0-9a-f]{8}(?:\.(?:build|tmp|d|stamp|remote)|-[^/]*\.tmp)")


def sweep_stale_temps(final: Path) -> None:
    """Remove temporaries in `final`'s directory left by writers that no longer run (a killed
    build): `final`'s own, and any other of the form pyree_build gives them (_OUR_TEMP).

    A running writer's temporaries are left alone, so concurrent builds never race here.
    """

    # Also matches what a killed tool derived from our name (clang writes `<output>-<random>.tmp`).
    pattern = re.compile(re.escape(f".{final.name}.") + r"(\d+)-[0-9a-f]{8}[.-]")
    try:
        siblings = list(final.parent.iterdir())
    except OSError:
        return
    for path in siblings:
        m = pattern.match(path.name) or _OUR_TEMP.fullmatch(path.name)
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
        with processes.shielded():  # a stop renames all of them or none
            for tmp, final in pairs:
                echo.echo_command(echo.shell_line(["mv", tmp, final]))
                os.replace(tmp, final)
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        written = next((final for tmp, final in pairs if exc.filename in (str(tmp), str(final))), pairs[0][1])
        raise disk_error(exc, written) from None
    except PyreeError as err:
        free = _free_bytes(pairs[0][1].parent)
        if free is None or free >= _NEARLY_FULL or _DISK_FULL_TEXT in err.what:
            raise
        # A tool that met a full disk may say so, say nothing, or abort (lld): the free space tells.
        raise PyreeError(
            f"{err.what.partition(': the tool itself crashed')[0]}, and the file system it writes to is full ({free // 1024} KiB free)",
            file=err.file,
            details=err.details,
            command=err.command,
            fix="free space on that file system, or write the outputs to another one",
        ) from None
    finally:
        with processes.shielded():
            for tmp, _ in pairs:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            _remove_derived(pairs)


def _remove_derived(pairs: Sequence[tuple[Path, Path]]) -> None:
    """Files a tool derived from a temporary's name and leaves when it fails: clang writes
    `<name>-<random>.tmp` first, lld `<name>.tmp<random>`. The temporary's `.NAME.PID-RANDOM`
    is this write's alone."""
    for directory in {tmp.parent for tmp, _ in pairs}:
        ours = [tmp.name for tmp, _ in pairs if tmp.parent == directory]
        prefixes = tuple(p for name in ours for p in (name.removesuffix(".tmp") + "-", name + "."))
        with contextlib.suppress(OSError):
            for entry in os.scandir(directory):
                if entry.name.startswith(prefixes) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


@contextlib.contextmanager
def atomic_output(final: str | os.PathLike[str]) -> Iterator[Path]:
    """`atomic_outputs` for one file."""
    with atomic_outputs([final]) as (tmp,):
        yield tmp


def fs_now(near: Path) -> int:
    """The file system's clock now (where `near` is), as it will stamp a file changed from here on."""
    probe = _temp_name(near, ".stamp")
    try:
        probe.touch()
        return probe.stat().st_mtime_ns
    except OSError:
        return time.time_ns() - 1_000_000_000  # cannot tell: count the last second as "now"
    finally:
        with processes.shielded(), contextlib.suppress(OSError):
            probe.unlink()


def settle(written: Sequence[Path], limit_s: float = 2.0) -> None:
    """Return once the file system's clock has moved past the change times of `written`: a
    build that starts then sees them as older than itself (the cache does not keep what was
    built from an input changed during the build, which a same-tick write looks like)."""
    if not written:
        return
    newest = max(p.stat().st_ctime_ns for p in written)
    deadline = time.monotonic() + limit_s
    while fs_now(written[0]) <= newest and time.monotonic() < deadline:
        time.sleep(0.002)


def text_or_empty(path: Path) -> str:
    """A file's text for an error message or a check that explains one: "" when it cannot be
    read (the error being explained may be just that), undecodable bytes replaced."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o666) -> None:
    """Write `path` all or nothing: the bytes (text as UTF-8) go to a hidden sibling named for its
    writer (`.NAME.PID-RANDOM.tmp`, what sweep_stale_temps recognises), renamed over `path` once
    complete; on any failure the sibling is removed and `path` is as it was. The one atomic write
    of pyree_build's own files (a tool's outputs: atomic_outputs). `mode` before the umask.
    Lists no directory, so a command whose reads are recorded (core/reads.py) stays recordable."""
    final = Path(path)
    tmp = final.parent / f".{final.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, final)
    except BaseException:
        with processes.shielded(), contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` atomically, unless the file already holds exactly it (its time
    then stays, so what was built from it is still up to date); True if it wrote."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text() == text:
            return False
    prepare_output_dir(path.parent)
    sweep_stale_temps(path)
    write_atomic(path, text)
    return True


def remove_tree(path: Path) -> None:
    """Remove a scratch or staging tree whole, or leave it whole if it cannot: a stop that
    comes meanwhile is raised once it is gone (processes.shielded), never halfway."""
    with processes.shielded():
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def scratch_dir(near: Path, label: str) -> Iterator[Path]:
    """A private build directory for intermediates, removed afterwards; never beside the sources.

    Under -v it is kept (until the next build of the same output sweeps it), so the printed
    commands that read and write it can be pasted.
    """

    prepare_output_dir(near)
    tmp = _temp_name(near / label, ".build")
    try:
        echo.make_dir(tmp)  # in the try: a stop that comes once it exists removes it
        yield tmp
    finally:
        if echo.VERBOSITY >= 2:
            echo.log_step(f"kept the scratch directory {tmp} (-v)")
        else:
            remove_tree(tmp)


# A depfile is read by Ninja (and Make): `$$` is a `$`; a run of backslashes is literal
# unless a space follows it, where 2N+1 backslashes mean N and an escaped space, or a `#`,
# where one backslash escapes it (as clang writes it and Ninja reads it). Writer and reader
# are each other's inverse, and the reader also takes what clang, gcc and nvcc write, so a
# parsed path is the file's real name, never its escaped form. Some names have no escape:
# a newline or tab, a trailing backslash or colon, `\\:` (Ninja releases read backslashes
# before a colon differently) and `\\$` (Ninja 1.11 takes `\\$` as one character).
_UNNAMEABLE = re.compile(r"[\n\r\0\t\v\f]|\\\Z|\\[:$]|:\Z")


def _escape_dep(path: str) -> str:
    if _UNNAMEABLE.search(path):
        raise PyreeError(
            "a depfile cannot name this path (a newline, a tab, a backslash before a colon or a dollar, or a trailing backslash or colon, has no escape Ninja and Make read)",
            file=path,
            fix="rename the file or directory, or build without --depfile",
        )
    return re.sub(r"(\\*) ", lambda m: "\\" * (2 * len(m[1]) + 1) + " ", path).replace("#", "\\#").replace("$", "$$")


def depfile_text(target: str | os.PathLike[str], deps: Iterable[str | os.PathLike[str]]) -> str:
    """A Make/Ninja depfile's text: `target: dep dep ...`, deduplicated, absolute paths. Raises a
    PyreeError naming a path no escape can spell (_UNNAMEABLE)."""
    seen: dict[str, None] = {}
    for dep in deps:
        seen.setdefault(os.path.abspath(os.fspath(dep)), None)
    return _escape_dep(os.path.abspath(os.fspath(target))) + ": " + " \\\n  ".join(_escape_dep(d) for d in seen) + "\n"


def write_depfile(
    depfile: str | os.PathLike[str],
    target: str | os.PathLike[str],
    deps: Iterable[str | os.PathLike[str]],
    step_outputs: Sequence[str | os.PathLike[str]] | None = None,
) -> None:
    """Write a Make/Ninja depfile (depfile_text) after the step's other outputs are in place.

    A step whose outputs come from cached_action passes it the depfile instead, which renames
    it with the outputs, all or none. Here, when it cannot be written, the step's other
    outputs (`step_outputs`, default `target`) are removed, so a failed write leaves none."""
    text = depfile_text(target, deps)
    try:
        with atomic_output(depfile) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except BaseException:
        # A stop raised once the depfile is in place (processes.shielded) finds the step whole.
        if text_or_empty(Path(depfile)) != text:
            with processes.shielded():
                for output in [target] if step_outputs is None else step_outputs:
                    with contextlib.suppress(OSError):
                        os.unlink(output)
        raise


# One token of a depfile: backslashes before a space or `#`, `$$`, a line continuation, a
# separator, or any other character.
_DEP_TOKEN = re.compile(r"(\\*)\\#|(\\+)( )|\$\$|\\\r?\n|([ \t\r\n]+)|(.)", re.DOTALL)


class Reads(list[str]):
    """The files a build step read, as its tools listed them, and `unlisted`: why it may have
    read files that no list names (the cache then keeps none of its outputs, see
    cache.local.cached_action). Joined with `Reads.of`, the reason carries over."""

    unlisted: str | None = None

    @classmethod
    def of(cls, parts: Iterable[Sequence[str]]) -> Reads:
        """Every part's files, in order, and the first reason a part gives."""
        joined = cls()
        for part in parts:
            joined += part
            joined.unlisted = joined.unlisted or getattr(part, "unlisted", None)
        return joined


def parse_depfile(path: str | os.PathLike[str], *, named: Sequence[str | os.PathLike[str]] = ()) -> list[str]:
    """Dependencies listed in a depfile (a compiler's `-MD -MF`, or write_depfile's), in order,
    unescaped: each is a file's real name. zig's clang writes each `\\` of a path as `/`:
    a listed file that does not exist under a directory in `named` (the paths the compiler
    was given) spelled that way is that directory's file."""
    text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    names: list[str] = []
    current: list[str] = []
    in_target = True
    for m in _DEP_TOKEN.finditer(text):
        token = m.group(0)
        if m[1] is not None:  # `\\#` is a `#`, the backslashes before it themselves
            current.append(m[1] + "#")
        elif m[3] is not None and len(m[2]) % 2:  # 2N+1 backslashes and a space: N of them and a space
            current.append("\\" * (len(m[2]) // 2) + " ")
        elif m[3] is not None:  # 2N backslashes are themselves, and the space after them separates
            names.append("".join(current) + m[2])
            current = []
        elif token == "$$":
            current.append("$")
        elif m[4] is not None or m[5] is None:  # a separator (or a line continuation) ends the name
            if current:
                names.append("".join(current))
                current = []
        else:
            current.append(token)
        if in_target and names and names[-1].endswith(":"):  # `target:` ends the rule's head
            names.clear()
            in_target = False
    if current:
        names.append("".join(current))
    return [_as_named(n, named) for n in names]


def _as_named(dep: str, named: Sequence[str | os.PathLike[str]]) -> str:
    if os.path.lexists(dep):
        return dep
    for given in (os.fspath(n) for n in named):
        slashed = given.replace("\\", "/")
        if "\\" in given and (dep == slashed or dep.startswith(slashed.rstrip("/") + "/")):
            candidate = given + dep[len(slashed) :]
            if os.path.lexists(candidate):
                return candidate
    return dep


# --- Content-addressed action cache -------------------------------------------------
#
# Layout under the cache root, which the cache marks as its own with CACHEDIR.TAG (it
# writes into, and clears, only a directory that holds that mark, or a new empty one):
#   manifests/<base>.json  for one action on one set of known inputs: the dependency sets
#                          seen so far, each with the content hashes it had, its entry and
#                          the hash of each output
#   entries/<entry>/       the outputs of one build, named 0, 1, ... in output order
#   locks/<base>.lock      serialises read-modify-write of one manifest
#   tools/<hash>.json      a tool's content hash, remembered with its stat (see cache._tool_digest)
# <base> hashes the action, its flags, the tools, the host CPU where the flags say "host"
# and the bytes of every input known before the build; <entry> also hashes every
# dependency the build reported (included headers). Every name read from the cache is
# checked to be a hex digest, so nothing in it can point a lookup or a store elsewhere.
#
# Soundness: inputs are hashed before the tool runs and again after; a dependency that
# changed (or whose ctime is newer than the build's start) means the output is published
# for this build but not stored. Outputs are stored from the build's private temporary
# files, and published as copies (copy-on-write clones where the filesystem has them),
# each checked against its recorded hash on every hit.


# A file's content may be taken as unchanged while its stat is unchanged only once it has not
# changed for this long: a write within one time tick of the file system leaves the stat as it
# was (the rule of git's "racily clean" entries). The cache, facts and the client's plans use it.
SETTLED_NS = 2_000_000_000


def stat_signature(st: os.stat_result) -> list[int]:
    """What says a file is unchanged: device, inode, size, modification and change time (ns)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def settled(st: os.stat_result) -> bool:
    """Unchanged for SETTLED_NS: its stat can stand for its content from now on."""
    now = time.time_ns()
    return now - st.st_ctime_ns > SETTLED_NS and now - st.st_mtime_ns > SETTLED_NS
