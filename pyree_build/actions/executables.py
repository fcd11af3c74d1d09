"""A program's executables: dump them, and substitute edited or hand-written ones back.

IREE's flags do the work (`--iree-hal-dump-executable-*-to`, `--iree-hal-substitute-
executable-*`); this module adds what they lack: an index of what was dumped, names
checked against the program (IREE only warns about a name that matches nothing), and a
clear refusal of object substitution where the backend says it cannot work (llvm-cpu: it
crashes iree-compile 3.13).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyree_build import backends
from pyree_build.actions import parameters
from pyree_build.actions.specs import spec_flags
from pyree_build.core import echo, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import prepare_output_dir, remove_tree, sweep_stale_temps
from pyree_build.core.outputs import check_outputs, replace_directory_files

PathLike = str | os.PathLike[str]

SOURCE_SUFFIXES = (".mlir", ".mlirbc")
_EXECUTABLE_OP = re.compile(r"^\s*hal\.executable\s+(?:public\s+|private\s+)?@([\w$.\-]+)", re.MULTILINE)
_MODULE_NAME = re.compile(r"^\s*module\s+@([\w$.\-]+)", re.MULTILINE)


@dataclass
class Executable:
    name: str
    source: str | None = None
    binaries: list[str] = field(default_factory=list)
    benchmarks: list[str] = field(default_factory=list)


def _target_args(target: str, options: Mapping[str, Any]) -> list[str]:
    return backends.get(target).target_flags(options)


def executable_names(source: PathLike, *, target: str = "llvm-cpu", sm: str | int | None = None, flags: Sequence[str] = ()) -> list[str]:
    """The names of the program's executables, as substitution flags refer to them."""
    src = require_file(source, "MLIR source")
    with tempfile.TemporaryDirectory(prefix="pyree-executables.") as tmp:
        out = Path(tmp) / "sources.mlir"
        processes.spawn(
            toolchain.iree_compile().command(src, *_target_args(target, {"sm": sm}), *flags, "--compile-to=executable-sources", "-o", out),
            what=f"iree-compile ({target}) listing executables",
            file=src,
            fix="fix the MLIR at the location shown",
        )
        return list(dict.fromkeys(_EXECUTABLE_OP.findall(out.read_text(encoding="utf-8", errors="replace"))))


def _check_dumps(target: str) -> None:
    backend = backends.get(target)
    if not backend.dumps:
        dumping = [b.name for b in backends.every() if b.dumps]
        raise PyreeError(f"dump does not support target '{target}'", fix=f"dump for one of: {', '.join(dumping)}")


def _dump_flags(
    src: Path, flags: Sequence[str], transform_spec: PathLike | None, pdl_spec: PathLike | None, object_search_paths: Sequence[PathLike]
) -> tuple[list[str], list[Path]]:
    """The flags compile would add for these specs, search paths and parameters, and the spec files."""
    for directory in object_search_paths:
        if not Path(directory).is_dir():
            raise PyreeError("object search path is not a directory", file=directory, fix="pass an existing directory to --object-search-path")
    specs_flags, spec_files = spec_flags(transform_spec=transform_spec, pdl_spec=pdl_spec)
    # Weights kept in an archive beside the program are imported as compile imports them: they
    # are constants of the executables compile builds (folded, hoisted), so of the dumped ones too.
    params = parameters.import_flags(src, src.read_text(encoding="utf-8", errors="replace"), flags)
    search = [f"--iree-hal-executable-object-search-path={Path(d).resolve()}" for d in object_search_paths]
    return [*search, *specs_flags, *params, *flags], spec_files


def _dump_into(staging: Path, src: Path, target: str, options: Mapping[str, Any], flags: Sequence[str]) -> list[Executable]:
    """Compile with every executable dumped into `staging`, and write its index.json."""
    dump_flags = [f"--iree-hal-dump-executable-{kind}-to={staging}" for kind in ("sources", "binaries", "benchmarks")]
    with echo.Stopwatch(f"iree-compile {src.name}: dump executables ({target})"):
        processes.spawn(
            toolchain.iree_compile().command(src, *_target_args(target, options), *dump_flags, *flags, "-o", staging / ".program.vmfb"),
            what=f"iree-compile ({target}) dumping executables",
            file=src,
            fix="fix the MLIR at the location shown",
        )
    (staging / ".program.vmfb").unlink(missing_ok=True)
    index = _index(staging)
    if not index:
        raise PyreeError("the program has no executables to dump", file=src, fix="dump a program that dispatches work")
    (staging / "index.json").write_text(json.dumps([asdict(e) for e in index], indent=2) + "\n", encoding="utf-8")
    return index


def dump(
    source: PathLike,
    output_dir: PathLike,
    *,
    target: str = "llvm-cpu",
    sm: str | int | None = None,
    flags: Sequence[str] = (),
    transform_spec: PathLike | None = None,
    pdl_spec: PathLike | None = None,
    object_search_paths: Sequence[PathLike] = (),
    force: bool = False,
    target_options: Mapping[str, Any] | None = None,
) -> list[Executable]:
    """Write the program's executable sources, binaries and benchmarks to `output_dir`,
    with `index.json`; return the index.

    Only the dump's own files are written, and only files an earlier dump wrote there and
    that are unchanged since are replaced or removed (a hidden manifest records their
    hashes); anything else in the directory is left alone. A file in the way, such as a
    dumped source edited in place, is refused by name unless `force`. Specs and object
    search paths mean what they mean to `compile`, so a dump shows the executables that
    compile would build. `target_options` are the target's other options by dest, as for
    compile (`cpu` of llvm-cpu).
    """
    src = require_file(source, "MLIR source")
    _check_dumps(target)
    options = {"sm": sm, **(target_options or {})}
    backends.with_options(target, {k: v for k, v in options.items() if v is not None})
    flags, spec_files = _dump_flags(src, flags, transform_spec, pdl_spec, object_search_paths)
    out = Path(os.path.abspath(output_dir))
    check_outputs([], [src, *spec_files], output_dirs=[out])
    created = not os.path.lexists(out)
    prepare_output_dir(out)
    sweep_stale_temps(out / "pyree-dump")
    # Staged inside the directory, so each file is renamed into place on one file system.
    staging = out / f".pyree-dump.{os.getpid()}-{os.urandom(4).hex()}.build"
    try:
        staging.mkdir()
        index = _dump_into(staging, src, target, options, flags)
        staged = {p.name: p for p in sorted(staging.iterdir()) if p.is_file() and not p.name.startswith(".")}
        replace_directory_files(out, staged, inputs=[src], force=force, verb="dump")
    except BaseException:
        remove_tree(staging)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if still empty: a failed first dump leaves no directory
        raise
    remove_tree(staging)
    return index


def _index(directory: Path) -> list[Executable]:
    files = sorted(p.name for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    executables: dict[str, Executable] = {}
    prefixes: dict[str, str] = {}
    for name in files:
        if not name.endswith(".mlir") or name.endswith("_benchmark.mlir"):
            continue
        found = _EXECUTABLE_OP.findall((directory / name).read_text(encoding="utf-8", errors="replace"))
        stem = name[: -len(".mlir")]
        if len(found) == 1 and stem.endswith(found[0]):
            executables[found[0]] = Executable(found[0], source=name)
            prefixes[found[0]] = stem[: -len(found[0])]
    linked = []
    for name in files:
        if name == "index.json" or any(e.source == name for e in executables.values()):
            continue
        owner = next(
            (e for e in sorted(executables.values(), key=lambda x: -len(x.name)) if name.startswith(f"{prefixes[e.name]}{e.name}_")),
            None,
        )
        if owner is None:
            linked.append(name)
        elif name.endswith("_benchmark.mlir"):
            owner.benchmarks.append(name)
        else:
            owner.binaries.append(name)
    for e in executables.values():  # a binary holding every executable (llvm-cpu links them into one)
        e.binaries.extend(linked)
    return list(executables.values())


def describe(index: Sequence[Executable], directory: PathLike) -> str:
    lines = []
    for e in index:
        lines.append(e.name)
        lines.append(f"  source     {Path(directory) / e.source}" if e.source else "  source     -")
        for b in e.binaries:
            lines.append(f"  binary     {Path(directory) / b}")
        for b in e.benchmarks:
            lines.append(f"  benchmark  {Path(directory) / b}")
    return "\n".join(lines)


def _refuse_objects(src: Path, target: str, pairs: Sequence[tuple[str, Path]]) -> None:
    """Object substitution where the backend says it cannot work (it crashes iree-compile 3.13 on llvm-cpu)."""
    if backends.get(target).substitutes_objects:
        return
    others = ", ".join(f"--target {b.name}" for b in backends.builtin() if b.substitutes_objects and b.dumps)
    for name, path in pairs:
        if path.suffix not in SOURCE_SUFFIXES:
            raise PyreeError(
                f"object substitution ({path.name} for {name}) is not supported on {target}: iree-compile 3.13 crashes on it",
                file=path,
                fix=f"substitute an edited source instead (`pyree-build dump` writes {_module_prefix(src)}{name}.mlir), "
                f"or substitute an object on {others}, where it works",
            )


def _module_prefix(source: Path) -> str:
    m = _MODULE_NAME.search(source.read_text(encoding="utf-8", errors="replace"))
    return f"{m.group(1) if m else 'module'}_"


def _named_pairs(substitutions: Sequence[str]) -> list[tuple[str, Path]]:
    pairs: list[tuple[str, Path]] = []
    for item in substitutions:
        name, sep, file = item.partition("=")
        if not sep or not name.strip() or not file:
            raise PyreeError(f"'{item}' is not NAME=FILE", fix="write --substitute main_dispatch_0=edited.mlir")
        pairs.append((name.strip(), require_file(file, f"substitute for {name}").resolve()))
    return pairs


def _pairs_from(directory: Path, src: Path, names: Sequence[str]) -> list[tuple[str, Path]]:
    """The files of a --substitute-from directory named after an executable of the program."""
    if not directory.is_dir():
        raise PyreeError("substitution directory not found", file=directory, fix="pass a directory holding <module>_<name>.mlir files")
    prefix = _module_prefix(src)
    matched = []
    for path in sorted(directory.iterdir()):
        stem = path.stem.removeprefix(prefix)
        if path.is_file() and stem in names:
            matched.append((stem, path.resolve()))
    if not matched:
        raise PyreeError(
            f"no file in it names an executable of {src.name}",
            file=directory,
            details="executables: " + ", ".join(names),
            fix=f"name the files {prefix}<executable>.mlir (as `pyree-build dump` writes them) or <executable>.<ext>",
        )
    echo.log_step(f"  substituting from {directory}: {', '.join(n for n, _ in matched)}")
    return matched


def _one_each(src: Path, pairs: Sequence[tuple[str, Path]], names: Sequence[str]) -> list[tuple[str, Path]]:
    """The pairs, each naming an executable of the program and none substituted twice."""
    unknown = [n for n, _ in pairs if n not in names]
    if unknown:
        raise PyreeError(
            f"no executable named {', '.join(repr(n) for n in unknown)} in {src.name}",
            file=src,
            details="its executables are: " + ", ".join(names),
            fix="use one of those names (`pyree-build dump` shows each with its files)",
        )
    seen: dict[str, Path] = {}
    for name, path in pairs:
        if name in seen and seen[name] != path:
            raise PyreeError(
                f"executable '{name}' is substituted twice",
                details=f"by {seen[name]}\nand by {path}",
                fix="give each executable one replacement (a --substitute-from directory counts too)",
            )
        seen[name] = path
    return list(seen.items())


def substitution_flags(
    source: PathLike,
    *,
    target: str,
    substitutions: Sequence[str] = (),
    substitute_from: PathLike | None = None,
    sm: str | int | None = None,
    flags: Sequence[str] = (),
) -> tuple[list[str], list[Path]]:
    """IREE flags for the requested substitutions, and the files they read.

    A `.mlir`/`.mlirbc` file replaces the executable's source, any other file its object.
    """
    src = require_file(source, "MLIR source")
    pairs = _named_pairs(substitutions)
    _refuse_objects(src, target, pairs)  # before any compile: it is known to crash
    names = executable_names(src, target=target, sm=sm, flags=flags)
    if substitute_from is not None:
        matched = _pairs_from(Path(substitute_from), src, names)
        _refuse_objects(src, target, matched)
        pairs.extend(matched)
    pairs = _one_each(src, pairs, names)
    out_flags = []
    for name, path in pairs:
        kind = "source" if path.suffix in SOURCE_SUFFIXES else "object"
        out_flags.append(f"--iree-hal-substitute-executable-{kind}={name}={path}")
    return out_flags, [p for _, p in pairs]
