"""`replace`: turn op groups of a real program into calls of your own C, generated from the
program's IR: the transform spec (its matcher cloned from the group's ops), one C file per
import with a correct naive body, and a CMakeLists.txt that builds the plugin (or embedded
objects), compiles the program with the spec and `EXPECT_IMPORTS`, and adds the verify test.

This module selects the groups and checks the request (targets, names, matchers that would
take each other's ops); the kernels' text is kernel_source's, the CMakeLists.txt cmake_project's.

Files are written as `dump` writes its own: all of them or none, and never over a file the
user edited since pyree_build wrote it (unless `force`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyree_build.core import processes
from pyree_build.core.args import import_name as check_import_name
from pyree_build.core.errors import PyreeError, as_path
from pyree_build.core.files import remove_tree
from pyree_build.core.outputs import replace_directory_files
from pyree_build.models import cmake_project, kernel_source, spec
from pyree_build.models.codegen import gpu_source
from pyree_build.models.ir import analysis, captures, limits, merge, program

PathLike = str | os.PathLike[str]
KINDS = ("plugin", "embedded")
# Where the replacing kernel runs: a CPU import (C), or a GPU target's precompiled kernel.
TARGETS = ("llvm-cpu", *gpu_source.TARGETS)


@dataclass
class Generated:
    """One replaced group: its spec pieces and its kernel's source (C, or the GPU target's language)."""

    replacement: spec.Replacement
    c_source: str
    suffix: str = ".c"


def generate(found: analysis.Analysis, index: merge.Request, name: str, *, dynamic: bool = False, target: str = "llvm-cpu") -> Generated:
    """Both generated pieces for group `index` (from 1; a tuple: those groups merged into one
    kernel) of the program `found` reads, or a PyreeError saying why that group cannot be replaced.
    `dynamic`: the form that matches any sizes. `target`: llvm-cpu (a C import) or a GPU
    target (vulkan, cuda, hip: a kernel in its language). `ops` calls this too, so it never
    promises what replace refuses."""
    group = merge.select(found.groups, index)
    index = merge.label(index)  # type: ignore[assignment]  # as the messages name it: 3 or 1+2+3
    if group.refusal:
        raise PyreeError(
            f"op group {index} ({(group.root or group.members[-1]).name}) cannot be replaced: {group.refusal}",
            fix="choose another group (pyree-build ops lists which can be replaced)",
        )
    rep = spec.replacement(name, group)
    if not dynamic:  # the general form matches its ops wherever they are (spec.walking_passes)
        rep.anchor = found.anchor(group.root)
        rep.sinks = [(found.anchor(op), values) for op in group.members if (values := captures.constant_values(op))]
    try:
        if target != "llvm-cpu":
            return Generated(rep, kernel_source.for_gpu(found, rep, target, dynamic=dynamic), gpu_source.SUFFIXES[gpu_source.TARGETS[target]])
        c_text = kernel_source.for_cpu(found, rep, dynamic=dynamic)
    except PyreeError as e:
        e.what = f"op group {index}: {e.what}"
        raise
    return Generated(rep, c_text)


def replace(
    source: PathLike,
    output_dir: PathLike,
    *,
    ops: Sequence[merge.Request],
    imports: Sequence[str],
    kind: str = "plugin",
    onnx: PathLike | None = None,
    function: str | None = None,
    dynamic: bool = False,
    force: bool = False,
    target: str = "llvm-cpu",
    timeout: float | None = None,
) -> list[Path]:
    """Replace op groups `ops` (numbers from `pyree-build ops`; a tuple of numbers: those
    connected groups merged into one kernel) of the program `source` with calls of the imports
    `imports` (one name per group or merged groups). Writes into `output_dir`:
    spec.mlir, NAME.c for each import, CMakeLists.txt. Returns the written paths. `dynamic`:
    the matcher takes the group's ops at any sizes, and the C reads every size from its arguments.
    `target`: llvm-cpu (C imports), or vulkan / cuda / hip: NAME.glsl / NAME.cu / NAME.hip, a
    kernel dispatched in place of the group, built and compiled for that target by the CMakeLists.txt.
    `timeout`: the seconds its iree-compile runs may take in all (default: limits.time_limit's).

    Example: pb.replace("mlp.mlir", "kernels", ops=[1], imports=["fc1_relu"], onnx="mlp.onnx")
    """
    ops, imports = list(ops), list(imports)
    _check_target(target, kind)
    _check_names(ops, imports, kind, target)
    src = Path(source).resolve()
    # One bound for the iree-compile runs below: a program IREE loops on must not hang replace.
    with processes.time_limit(limits.time_limit(timeout, [src])), analysis.Analysis.of(program.spec_view_text(src)) as found:
        made = [generate(found, index, name, dynamic=dynamic, target=target) for index, name in zip(ops, imports)]
        _check_distinct(made)
        on = f" --target {target}" if target != "llvm-cpu" else ""
        header = [
            f"Generated by `pyree-build replace {src.name} --ops {','.join(map(merge.label, ops))} --import {','.join(imports)}{on}`.",
            "Each import replaces its own group (its matcher is tried on that group's last op alone) with a",
            "dispatch whose only work is a call of the import; `pyree-build compile --expect-import NAME` proves it.",
        ]
        if target != "llvm-cpu":
            header[1:] = [
                "Each NAME replaces its own group (its matcher is tried on that group's last op alone) with a",
                "dispatch of the precompiled kernel NAME_executable; `pyree-build compile --expect-import NAME` proves it.",
            ]
        files = {"spec.mlir": spec.spec_text([g.replacement for g in made], header=header, embedded=kind == "embedded")}
        if sum(g.replacement.anchor is None for g in made) > 1:
            # Only matchers that walk the program (--dynamic) can take each other's ops; an
            # anchored one is tried on its own group alone, and `compile --expect-import` (the
            # generated CMakeLists.txt's EXPECT_IMPORTS) proves each call is there. Counting
            # the calls here cost a compile of its own (DenseNet-121: as long as iree-compile's).
            _check_all_placed(src, files["spec.mlir"], made)
    for g in made:
        files[f"{g.replacement.name}{g.suffix}"] = g.c_source
    out = as_path(output_dir, "output directory")
    tunable = [g.replacement.name for g in made if "// pyree-tune:" in g.c_source]
    function = function or _public_function(src.read_text(encoding="utf-8", errors="replace"))
    files["CMakeLists.txt"] = cmake_project.cmake_text(src, out.resolve(), imports, kind=kind, onnx=onnx, function=function, tunable=tunable, target=target)
    return _write(out, files, inputs=[src], force=force)


def matcher_key(generated: Generated) -> tuple[tuple[str, ...], ...]:
    """What a group's matcher accepts: two groups with equal keys are matched by the same ops."""
    rep = generated.replacement
    return tuple(rep.aliases), tuple(rep.arg_types), tuple(rep.matcher)


def _check_distinct(made: list[Generated]) -> None:
    """In the general form (--dynamic) each matcher walks the whole program: a group whose
    matcher equals an earlier one's is found by that one's first, so its own import never
    would be called. (The static form tries each matcher on its own group alone.)"""
    first: dict[tuple[tuple[str, ...], ...], Generated] = {}
    for g in made:
        if g.replacement.anchor is not None:
            continue
        earlier = first.setdefault(matcher_key(g), g)
        if earlier is not g:
            a, b = earlier.replacement, g.replacement
            raise PyreeError(
                f"op groups {a.group.index} and {b.group.index} are the same ops on the same types and --dynamic matches them "
                f"wherever they are, so import '{a.name}' would replace both and '{b.name}' would never be called",
                fix="list only one of them with --dynamic (it replaces every match), or leave out --dynamic: each import then replaces its own group",
            )


def _check_all_placed(src: Path, spec_text: str, made: list[Generated]) -> None:
    """Every import of a spec whose matchers walk the program (--dynamic) is called: one
    group's matcher can also match ops of another listed group (there made of parts of two
    groups), and whichever runs first takes them. The program is compiled to the spec's phase
    and each import's calls counted, before anything is written."""
    placed = program.after_spec(src, spec_text)
    calls = {g.replacement.name: spec.dispatches_of(placed, g.replacement.name) for g in made}
    never = [g for g in made if calls[g.replacement.name] == 0]
    if never:
        counts = ", ".join(f"'{name}' x{n}" for name, n in calls.items())
        raise PyreeError(
            f"import '{never[0].replacement.name}' would never be called: with --dynamic another listed group's matcher also matches its group's ops, and takes them first",
            details=f"calls the spec places: {counts}",
            fix="leave out --dynamic (each import then replaces its own group), or replace that group in a spec of its own",
        )


def _check_target(target: str, kind: str) -> None:
    if target not in TARGETS:
        raise PyreeError(f"unknown target '{target}' for replace", fix=f"use one of: {', '.join(TARGETS)}")
    if target != "llvm-cpu" and kind != "plugin":
        raise PyreeError(f"--kind {kind} is a CPU form; a {target} kernel is a precompiled GPU executable", fix="leave out --kind with --target")


# The language each target's kernel is written in: what its import names must be valid in.
_LANGUAGE = {"llvm-cpu": "c", "cuda": "c++", "hip": "c++", "vulkan": "glsl"}


def _check_names(ops: list[merge.Request], imports: list[str], kind: str, target: str) -> None:
    if kind not in KINDS:
        raise PyreeError(f"unknown kind '{kind}'", fix=f"use one of: {', '.join(KINDS)}")
    if not ops or len(ops) != len(imports):
        raise PyreeError(f"{len(ops)} op group(s) and {len(imports)} import name(s)", fix="give one import name per group: --ops 1,3 --import a,b")
    for name in imports:
        check_import_name(name, _LANGUAGE[target])
    named = [n for request in ops for n in merge.numbers(request)]
    if len(set(imports)) != len(imports) or len(set(named)) != len(named):
        raise PyreeError("each group and each import name may appear once", fix="give distinct groups and names")


def _public_function(text: str) -> str | None:
    """The program's one public function (an imported model's graph), or None."""
    # ASCII only, as MLIR's bare symbol names are: a model's graph name that MLIR quotes (`@"..."`) is no CMake word.
    names = re.findall(r"^\s*(?:util|func)\.func\s+(?:public\s+)?@([\w$.-]+)\(", text, re.MULTILINE | re.ASCII)
    return names[0] if len(names) == 1 else None


def _write(out: Path, files: dict[str, str], *, inputs: list[Path], force: bool) -> list[Path]:
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".pyree-replace.{os.getpid()}-{os.urandom(4).hex()}.build"
    try:
        staging.mkdir()
        staged = {}
        for name, content in files.items():
            (staging / name).write_text(content, encoding="utf-8")
            staged[name] = staging / name
        replace_directory_files(out, staged, inputs=inputs, force=force, verb="replace", prune=False)
    except BaseException:
        remove_tree(staging)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    remove_tree(staging)
    return [out / name for name in files]
