"""`replace`: turn op groups of a real program into calls of your own C, generated from the
program's IR: the transform spec (its matcher cloned from the group's ops), one C file per
import with a correct naive body, and a CMakeLists.txt that builds the plugin (or embedded
objects), compiles the program with the spec and `EXPECT_IMPORTS`, and adds the verify test.

Files are written as `dump` writes its own: all of them or none, and never over a file the
user edited since pyree_build wrote it (unless `force`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyree_build.core import escape, processes
from pyree_build.core.args import import_name as check_import_name
from pyree_build.core.errors import PyreeError, as_path
from pyree_build.core.outputs import replace_directory_files
from pyree_build.models import spec
from pyree_build.models.codegen import c_reference, c_rows, c_tiled, emitter, gpu_source, loopnest
from pyree_build.models.ir import analysis, captures, groups, limits, merge, program

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


def source_names(group: groups.Group) -> list[str]:
    """Where the group's ops came from: ONNX node names where the import recorded them, else
    the source op on the line the location names (`onnx.MatMul (model.mlir:7)`)."""
    names: list[str] = []
    for op in group.members:
        found = program.location_names(op.location) or [_line_source(f, line) for f, line in program.location_lines(op.location)[:1]]
        names += [n for n in found if n and n not in names]
    return names


def _line_source(file: str, line: int) -> str:
    with contextlib.suppress(OSError, IndexError):
        text = Path(file).read_text(encoding="utf-8").splitlines()[line - 1]
        match = re.search(r'torch\.operator "([\w.]+)"|=\s*([\w.]+)', text)
        if match:
            return f"{match.group(1) or match.group(2)} ({Path(file).name}:{line})"
    return f"{Path(file).name}:{line}"


def describe_ops(group: groups.Group) -> list[str]:
    """Op names, each generic with the ops of its body (`linalg.generic(arith.cmpf, arith.select)`)."""
    out = []
    for op in group.members:
        if op.name == "linalg.generic":
            inner = [n for n in program.nested_op_names(op) if n not in ("linalg.yield", "arith.constant")]  # constants: captures.sink
            out.append(f"linalg.generic({', '.join(dict.fromkeys(inner))})")
        else:
            out.append(op.name)
    return out


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
            return Generated(rep, _gpu_source(found, rep, target, dynamic=dynamic), gpu_source.SUFFIXES[gpu_source.TARGETS[target]])
        c_text = _c_source(found, rep, dynamic=dynamic)
    except PyreeError as e:
        e.what = f"op group {index}: {e.what}"
        raise
    return Generated(rep, c_text)


def _gpu_source(found: analysis.Analysis, rep: spec.Replacement, target: str, *, dynamic: bool) -> str:
    """The group's kernel for a GPU target, one invocation per result element, from the loop-nest
    model (gpu_source's emitters: the per-element nest, else the row-wise one); a PyreeError where the model does not cover the group or the
    target's language cannot hold its types or ops."""
    group = rep.group
    if dynamic:
        raise gpu_source.refuse(target, "--dynamic (sizes known only at run time) is generated for the CPU only", group.root.name)
    if len(group.root.results) != 1:
        raise gpu_source.refuse(target, f"the group has {len(group.root.results)} results; a generated GPU kernel writes one", group.root.name)
    function = found.generalized_function(group.function)
    ops = program.body_ops(function)
    members = [ops[program.op_index(op, group.function)] for op in group.members]
    constants = [ops[program.op_index(op, group.function)] for op in group.constants]
    result = group.root.results[0]
    ins, out, sizes = gpu_source.bindings(target, list(group.inputs), result, [_value_name(v) for v in group.inputs])
    k = c_reference.Kernel()
    for value, binding in zip(group.inputs, ins):
        k.buffers[program.value_at(program.position(value, group.function), function)] = c_reference.Buffer(binding.name, binding.dims, binding.ctype)
    generalized_result = program.value_at(program.position(result, group.function), function)
    k.buffers[generalized_result] = c_reference.Buffer(out.name, out.dims, out.ctype)
    # Intermediates are computed where they are read, never stored: their buffers only give the
    # loop-nest model the sizes of a loop that no input or result dimension names alone.
    for j, value in enumerate(rep.scratch):
        shape = program.shape(value.type)
        if None not in shape:
            k.buffers[program.value_at(program.position(value, group.function), function)] = c_reference.Buffer(f"tmp{j}", [str(d) for d in shape], "")
    # The per-element nest (at most one reduction); else the row-wise one (a softmax, a LayerNorm).
    nest: loopnest.Nest | loopnest.RowNest | None = loopnest.build(members, generalized_result, k.buffers)
    if nest is None:
        nest = loopnest.build_rows(members, generalized_result, k.buffers)
    if nest is None:
        raise gpu_source.refuse(
            target,
            "the loop-nest model does not cover this group (a reshape that moves data, a reduction not over the last loop or "
            "with two results read, a stage with two results, or a value read at another point): only the CPU's per-op "
            "reference body is generated for it",
            group.root.name,
        )
    header = [
        f"{rep.name}: generated by `pyree-build replace --target {target}` for op group {group.index} ({group.root.name}) of "
        f"{program.symbol_name(group.function)}.",
        f"ops: {', '.join(describe_ops(group))}",
        f"from: {', '.join(source_names(group)) or 'unknown'}",
        "",
        "A correct, naive kernel: one invocation per result element"
        + (", which recomputes its row's reductions (O(n^2) per row)." if isinstance(nest, loopnest.RowNest) else ".")
        + " Make it fast; then",
        f"`pyree-build verify` (on --device {target}, the module's own) checks the numbers against the framework's own.",
    ]
    try:
        source = gpu_source.emit(target, k, nest, name=rep.name, inputs=ins, out=out, sizes=sizes, constants=constants, header=header)
    except emitter.Unfused as e:
        raise gpu_source.refuse(target, f"{e}: the per-element kernel cannot compute it", group.root.name) from None
    rep.target, rep.scratch = target, []
    return source


def _roles(rep: spec.Replacement) -> dict[tuple[int, int], c_reference.Buffer]:
    """The buffers of the group's inputs, results and scratch, by position: sizes from the
    argument block for inputs; from the types, or in the general form from the inputs' sizes."""
    group = rep.group
    roles: dict[tuple[int, int], c_reference.Buffer] = {}
    for i, value in enumerate(group.inputs):
        roles[program.position(value, group.function)] = c_reference.Buffer(
            f"in{i}", [f"in{i}_d{d}" for d in range(len(program.shape(value.type)))], c_reference.c_type(value.type)
        )
    for stem, values in (("out", list(group.root.results)), ("tmp", rep.scratch)):
        for j, value in enumerate(values):
            if rep.dynamic:
                sizes = [c_reference.dim_c(d) for d in rep.sizes_of(value)]
            elif None in program.shape(value.type):
                # Without --dynamic the C takes only the inputs' sizes; a size the IR leaves
                # open in a result or an intermediate has no value to read.
                owner = program.defining_op(value)
                raise c_reference.refuse(
                    f"a result or intermediate has a size only known at run time ({value.type}); `replace --dynamic` takes every size from the inputs",
                    owner.operation.name if owner else "?",
                )
            else:
                sizes = [str(d) for d in program.shape(value.type)]
            roles[program.position(value, group.function)] = c_reference.Buffer(f"{stem}{j}", sizes, c_reference.c_type(value.type))
    return roles


def _c_source(found: analysis.Analysis, rep: spec.Replacement, *, dynamic: bool) -> str:
    group = rep.group
    function = found.generalized_function(group.function)
    members = [program.op_index(op, group.function) for op in group.members]
    if dynamic:
        inputs = [program.position(v, group.function) for v in group.inputs]
        spec.generalize(rep, c_reference.derive_dims(function, members, inputs))
    constants = [program.op_index(op, group.function) for op in group.constants]
    empties = [program.op_index(op, group.function) for op in group.empties]
    kernel = _fused_kernel(function, rep, members, constants)
    if kernel is None:
        kernel = c_reference.kernel_body(function, [(m, 0) for m in members], constants, empties, _roles(rep))
    fields = c_reference.parameters(group.inputs, list(group.root.results), rep.scratch, [_value_name(v) for v in group.inputs])
    header = [
        f"{rep.name}: generated by `pyree-build replace` for op group {group.index} ({group.root.name}) of {program.symbol_name(group.function)}.",
        f"ops: {', '.join(describe_ops(group))}",
        f"from: {', '.join(source_names(group)) or 'unknown'}",
        "",
        f"{kernel.form} Make it faster; then",
        "`pyree-build verify` checks the numbers against the framework's own.",
        "",
        "Argument block: the operands of the func.call in the spec, in order. Under llvm.bareptr",
        "each tensor is a base pointer plus an offset in elements; buffers are row-major and",
        "contiguous. Sizes of the inputs follow as int32_t"
        + (" and give every size: the spec matches these ops at any sizes (--dynamic)." if dynamic else "."),
    ]
    return c_reference.c_file(rep.name, fields, kernel, header)


def _fused_kernel(function: Any, rep: spec.Replacement, members: list[int], constants: list[int]) -> c_reference.Kernel | None:
    """The group as one loop nest (loopnest's model, c_tiled's C) with no scratch buffer, and the
    dispatch's workgroups set by its schedule; None where the model does not cover the group
    (the per-op reference body is generated instead)."""
    ops = program.body_ops(function)
    group = rep.group
    k = c_reference.Kernel()
    for where, buffer in _roles(rep).items():
        k.buffers[program.value_at(where, function)] = buffer
    member_ops = [ops[m] for m in members]
    result = program.value_at(program.position(group.root.results[0], group.function), function)
    nest = loopnest.build(member_ops, result, k.buffers)
    if len(group.root.results) != 1:
        return None
    if nest is None:
        return None if rep.dynamic else _row_kernel(k, rep, member_ops, result, [ops[i] for i in constants])
    plan = loopnest.schedule(nest)
    fields = c_reference.parameters(group.inputs, list(group.root.results), [], [_value_name(v) for v in group.inputs])
    try:
        c_tiled.emit(k, nest, plan, name=rep.name, fields=fields, constants=[ops[i] for i in constants])
    except emitter.Unfused:
        return None
    rep.scratch = []
    rep.workgroups = plan.workgroups
    k.form = "The group's ops fused into one loop nest, tiled into register blocks (the schedule's knobs below)."
    if rep.dynamic:  # the rows are only known at run time: the spec counts the workgroups from them
        rep.row_workgroups = (loopnest.ROWS_PER_WORKGROUP, loopnest.MAX_WORKGROUPS)
    return k


def _row_kernel(k: c_reference.Kernel, rep: spec.Replacement, member_ops: list[Any], result: Any, constants: list[Any]) -> c_reference.Kernel | None:
    """A row-wise group (a softmax, a LayerNorm) as one nest per row (loopnest.build_rows, c_rows's C);
    None where that model does not cover it either."""
    rows = loopnest.build_rows(member_ops, result, k.buffers)
    if rows is None:
        return None
    plan = loopnest.schedule_rows(rows)
    try:
        c_rows.emit(k, rows, plan, name=rep.name, constants=constants)
    except emitter.Unfused:
        return None
    rep.scratch = []
    rep.workgroups = plan.workgroups
    k.form = "The group's ops fused row by row: each row's passes in one loop nest (the schedule's knobs below)."
    return k


def _value_name(value: Any) -> str:
    owner = program.defining_op(value)
    if owner is None:
        return f"argument {value.arg_number} of the function"
    if owner.operation.name == "arith.constant":
        return f"a constant {value.type} (weights)"
    names = program.location_names(owner.operation.location)
    return f"the result of {owner.operation.name}" + (f" ({names[0]})" if names else "")


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
    files["CMakeLists.txt"] = cmake_text(src, out.resolve(), imports, kind=kind, onnx=onnx, function=function, tunable=tunable, target=target)
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
    calls = {g.replacement.name: len(re.findall(rf"util\.call @{re.escape(g.replacement.name)}_call\(", placed)) for g in made}
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


def cmake_text(
    src: Path, out: Path, imports: list[str], *, kind: str, onnx: PathLike | None, function: str | None, tunable: Sequence[str] = (), target: str = "llvm-cpu"
) -> str:
    """A CMakeLists.txt for the output directory: imports the model (or takes the program) from
    a path set at configure time, builds the import(s), compiles the program with the spec,
    checks that every import is called, and verifies against the framework. It names no path
    relative to where it was written, so the directory can be copied or add_subdirectory()'d
    anywhere."""
    stem = re.sub(r"\W", "_", src.stem, flags=re.ASCII)  # a CMake target name: ASCII
    model = Path(onnx).resolve() if onnx is not None else None
    variable = f"{stem}_ONNX" if model is not None else f"{stem}_MLIR"
    lines = [
        "# Generated by `pyree-build replace`: builds the generated import(s), compiles the program with",
        "# spec.mlir and checks the module calls them (EXPECT_IMPORTS). Standalone:",
        '#   cmake -G Ninja -S . -B build -Dpyree_build_DIR="$(pyree-build --cmake-dir)" && cmake --build build && ctest --test-dir build',
        f"# or add_subdirectory() it from a project that did find_package(pyree_build). -D{variable}=PATH names",
        f"# the {'ONNX model' if model is not None else 'program'} where it lives on another machine.",
        "cmake_minimum_required(VERSION 3.21)",
        f"project({stem}_replaced LANGUAGES NONE)",
        "if(NOT COMMAND pyree_iree_module)",
        "  find_package(pyree_build CONFIG REQUIRED)",
        "  enable_testing()",
        "endif()",
        "",
    ]
    if model is not None:
        lines += [
            "# The model, imported here (pyree-build import) as replace's program was: the spec matches its IR.",
            f'set({variable} "{_cmake_path(model, out)}" CACHE FILEPATH "the ONNX model whose ops spec.mlir replaces")',
            f'pyree_onnx_import(NAME {stem}_mlir SRC "${{{variable}}}")',
        ]
        program = f"{stem}_mlir"
    else:
        lines += [f'set({variable} "{_cmake_path(src, out)}" CACHE FILEPATH "the program whose ops spec.mlir replaces")']
        program = f'"${{{variable}}}"'
    if target != "llvm-cpu":
        tune = _gpu_tune_lines(stem, variable if model is not None else None, list(tunable), function, program, target)
        lines += _gpu_lines(stem, program, imports, target, tune=tune, tunable=tunable)
        lines += _verify_lines(stem, variable if model is not None else None, imports, kind=kind, function=function, target=target)
        return "\n".join(lines) + "\n"
    lines += _cpu_build_lines(
        stem,
        program,
        imports,
        kind=kind,
        tune=_tune_lines(stem, variable if model is not None else None, list(tunable), function) if kind == "plugin" else [],
        tunable=tunable,
    )
    lines += _verify_lines(stem, variable if model is not None else None, imports, kind=kind, function=function)
    return "\n".join(lines) + "\n"


def _cpu_build_lines(stem: str, program: str, imports: list[str], *, kind: str, tune: list[str], tunable: Sequence[str]) -> list[str]:
    """The CPU's: the kernels as plugins (tuned where asked) or embedded objects, and the module."""
    cpu = f"{stem}_CPU"
    lines = _cpu_lines(stem)
    plugins: list[str] = []
    if not any(line.lstrip().startswith("pyree_tune(") for line in tune):
        tunable = ()  # nothing to tune against: the plugins are built as generated
    if kind == "plugin":
        plugins = [f"pyree_cpu_plugin(NAME {name}_plugin SYSTEM SRCS {name}.c CPU ${{{stem}_PLUGIN_CPU}}{_tuned_argument(name, tunable)})" for name in imports]
        # A plugin's import is resolved at run time: the module must call it (and need not be built first).
        depends = f"\n  EXPECT_IMPORTS {' '.join(imports)}"
    else:
        lines += [f"pyree_cpu_objects(NAME {name}_objects SRCS {name}.c ARCHS x86_64 aarch64)" for name in imports]
        # Linked in statically (hal.import.static): no import to expect; verify proves the numbers.
        depends = f"\n  DEPENDS {' '.join(f'{n}_objects' for n in imports)}"
    lines += [
        "",
        "pyree_iree_module(",
        f"  NAME {stem}_replaced",
        f"  SRC {program}",
        "  TARGET llvm-cpu",
        f"  CPU ${{{cpu}}}",
        f'  TRANSFORM_SPEC "${{CMAKE_CURRENT_SOURCE_DIR}}/spec.mlir"{depends}',
        ")",
    ]
    if plugins:
        lines += [*tune, "", *plugins]
    return lines


def _tuned_argument(name: str, tunable: Sequence[str]) -> str:
    return f" ${{{name}_TUNED}}" if name in tunable else ""


def _tune_needs(variable: str | None, function: str | None, knob: str) -> list[str]:
    """The comment in place of the tune option where a tune cannot run (no reference model, or
    no one function to call); nothing where it can."""
    if variable is not None and function is not None:
        return []
    why = "no --onnx model was given to `replace`" if variable is None else "the program has several public functions"
    return ["", f"# Tuning the kernels' {knob} needs a reference and a function ({why}): see pyree_tune in docs/tuning.md."]


def _tune_lines(stem: str, variable: str | None, tunable: list[str], function: str | None) -> list[str]:
    """An option that sweeps the knobs each generated kernel declares (`// pyree-tune:` lines)
    against onnxruntime and builds the variant tune chose: off by default, as a tune builds
    and times every variant (minutes); the choice is keyed by content, so it runs again only
    when the C, the module or the model changes."""
    if not tunable:
        return []
    missing = _tune_needs(variable, function, "knobs")
    if missing:
        return missing
    lines = [
        "",
        f"# -D{stem}_TUNE=ON: sweep the knobs the kernels declare (their `// pyree-tune:` lines) against onnxruntime",
        "# and build the variant each tune chose (the first declared among those noise cannot tell apart).",
        f'option({stem}_TUNE "tune the knobs of the generated kernels and build the chosen variants" OFF)',
    ]
    for name in tunable:
        lines += [
            f"set({name}_TUNED)",
            f"if({stem}_TUNE)",
            f'  pyree_tune(NAME {name}_tune SYSTEM SRCS {name}.c CPU ${{{stem}_PLUGIN_CPU}} MODULE {stem}_replaced FUNCTION {function} ONNX "${{{variable}}}")',
            f"  set({name}_TUNED TUNED {name}_tune)",
            "endif()",
        ]
    return lines


def _cpu_lines(stem: str) -> list[str]:
    """One cache variable sets the CPU of both the module and its plugin, so they never differ."""
    return [
        "",
        "# The CPU the module's code and the kernels are built for, alike: generic (any CPU of the arch;",
        "# the plugin for the arch's baseline) or host (this machine's CPU and all its vector extensions).",
        f'set({stem}_CPU "generic" CACHE STRING "generic or host: the CPU the module and its kernels are built for")',
        f'if({stem}_CPU STREQUAL "host")',
        f"  set({stem}_PLUGIN_CPU host)",
        "else()",
        f"  set({stem}_PLUGIN_CPU baseline)",
        "endif()",
        "",
    ]


def _cmake_path(path: Path, out: Path) -> str:
    """`path` for a CMakeLists.txt in `out`: inside it, relative to the list's own directory
    (so it moves with it); elsewhere, absolute (a -D option overrides it on another machine)."""
    try:
        inside = path.resolve().relative_to(out.resolve()).as_posix()
    except ValueError:
        return _cmake_quoted(path.resolve().as_posix(), path)
    return "${CMAKE_CURRENT_SOURCE_DIR}/" + _cmake_quoted(inside, path)


def _cmake_quoted(text: str, path: Path) -> str:
    try:
        return escape.cmake_quoted(text)
    except ValueError as e:
        raise PyreeError(
            f"the path cannot be written into a CMakeLists.txt: {e}", file=path, fix="rename it (or the directory) without control characters"
        ) from None


# Per GPU target: the CMake function building the kernels, its target's name and sources'
# suffix, the module arguments choosing the GPU, and the device verify runs on.
_GPU_CMAKE = {
    "vulkan": ("pyree_vulkan_spirv", "spirv", ".glsl", "", "vulkan"),
    "cuda": ("pyree_cuda_ptx", "ptx", ".cu", " SMS 80", "cuda"),
    "hip": ("pyree_hip_hsaco", "hsaco", ".hip", " GFX ${{{stem}_GFX}}", "hip"),
}


def _gpu_module_args(stem: str, target: str) -> str:
    return {"vulkan": f" VULKAN_TARGET ${{{stem}_VULKAN_TARGET}}", "cuda": " SM 80", "hip": f" GFX ${{{stem}_GFX}}"}[target]


def _gpu_tune_lines(stem: str, variable: str | None, tunable: list[str], function: str | None, program: str, target: str) -> list[str]:
    """The CPU's tune option for a GPU kernel: each kernel's workgroup size swept on the target's
    device against onnxruntime, the chosen variant's object built. Vulkan only: a CUDA or HIP
    kernel's block size is the spec's (each variant's spec differs), and no machine here has
    their GPU to time it on; the comment says how to tune one where the GPU is."""
    if not tunable:
        return []
    ext = _GPU_CMAKE[target][2]
    if target != "vulkan":
        return ["", f"# Tune the kernels' block size on a machine with the GPU: pyree-build tune NAME{ext} --target {target} --program PROGRAM",
                "# --spec spec.mlir --function F --onnx MODEL -o best.json (docs/tuning.md), then use the spec.mlir its --apply writes."]  # fmt: skip
    missing = _tune_needs(variable, function, "workgroup size")
    if missing:
        return missing
    lines = [
        "",
        f"# -D{stem}_TUNE=ON: sweep each kernel's workgroup size (its `// pyree-tune:` line) against onnxruntime on the",
        "# Vulkan device, each variant compiled with the spec, and build the SPIR-V of the variant each tune chose; the",
        f"# module is compiled with {stem}_SPEC, the spec with each chosen workgroup count (each tuned kernel's in turn).",
        f'option({stem}_TUNE "tune the workgroup size of the generated kernels and build the chosen variants" OFF)',
        f'set({stem}_SPEC "${{CMAKE_CURRENT_SOURCE_DIR}}/spec.mlir")',
    ]
    for name in tunable:
        lines += [
            f"set({name}_TUNED)",
            f"if({stem}_TUNE)",
            f"  pyree_tune(NAME {name}_tune TARGET vulkan SRCS {name}{ext} PROGRAM {program}",
            f'             SPEC "${{CMAKE_CURRENT_SOURCE_DIR}}/spec.mlir" FUNCTION {function} ONNX "${{{variable}}}"{_gpu_module_args(stem, target)})',
            f'  set({name}_TUNED TUNED {name}_tune SPEC "${{{stem}_SPEC}}")',
            f'  set({stem}_SPEC "${{CMAKE_CURRENT_BINARY_DIR}}/{name}_spirv/spec.mlir")',
            "endif()",
        ]
    return lines


def _gpu_lines(stem: str, program: str, imports: list[str], target: str, *, tune: Sequence[str] = (), tunable: Sequence[str] = ()) -> list[str]:
    function, suffix, ext, arguments, _ = _GPU_CMAKE[target]
    if not any(line.lstrip().startswith("pyree_tune(") for line in tune):
        tunable = ()  # nothing tuned: the kernels are built as generated
    lines = [""]
    if target == "vulkan":
        lines += [
            "# auto: the module is compiled for the Vulkan device found at build time (llvmpipe on lavapipe), as a",
            "# module built for another device's target can compute wrong numbers there without any error;",
            "# or any iree-compile Vulkan target name (vp_android_baseline_2022: the portable one).",
            f'set({stem}_VULKAN_TARGET "auto" CACHE STRING "the Vulkan target the module is compiled for: auto, or an iree-compile target name")',
        ]
    elif target == "cuda":
        lines += ["# sm_80: what IREE 3.13 compiles cuda modules for; newer GPUs (H100) JIT-compile its PTX."]
    else:
        lines += [f'set({stem}_GFX "1100" CACHE STRING "the AMD GPU (gfx number) the kernels and the module are built for")']
    lines += [*tune, ""] if tune else []
    lines += [f"{function}(NAME {name}_{suffix} SRCS {name}{ext}{arguments.format(stem=stem)}{_tuned_argument(name, tunable)})" for name in imports]
    spec_path = f"${{{stem}_SPEC}}" if tunable else "${CMAKE_CURRENT_SOURCE_DIR}/spec.mlir"
    lines += [
        "",
        "pyree_iree_module(",
        f"  NAME {stem}_replaced",
        f"  SRC {program}",
        f"  TARGET {target}{_gpu_module_args(stem, target)}",
        f'  TRANSFORM_SPEC "{spec_path}"',
        f"  EXPECT_IMPORTS {' '.join(imports)}",
        f"  DEPENDS {' '.join(f'{n}_{suffix}' for n in imports)}",
        ")",
    ]
    return lines


def _verify_lines(stem: str, variable: str | None, imports: list[str], *, kind: str, function: str | None, target: str = "llvm-cpu") -> list[str]:
    if variable is None:
        return ["", "# No --onnx model was given to `replace`: add pyree_add_verify_test(... ONNX model.onnx) to check the numbers."]
    gpu = target != "llvm-cpu"
    plugins = f"\n  PLUGINS {' '.join(f'{n}_plugin' for n in imports)}" if kind == "plugin" and not gpu else ""
    function_line = f"\n  FUNCTION {function}" if function else ""
    device_line = f"\n  DEVICE {_GPU_CMAKE[target][4]}" if gpu else ""
    module_target = f"{target}{_gpu_module_args(stem, target)}" if gpu else f"llvm-cpu CPU ${{{stem}_CPU}}"
    return [
        "",
        "# The model without the replacement: verify's baseline, so an output IREE itself computes",
        "# differently from onnxruntime is reported as IREE's, not the kernel's.",
        f"pyree_iree_module(NAME {stem}_unreplaced SRC {stem}_mlir TARGET {module_target})",
        "",
        "# The replaced model against the framework (onnxruntime), on verify's seeded draws.",
        "pyree_add_verify_test(",
        f"  NAME {stem}_replaced.verify",
        f"  MODULE {stem}_replaced",
        f'  ONNX "${{{variable}}}"',
        f"  BASELINE {stem}_unreplaced{function_line}{plugins}{device_line}",
        ")",
    ]


def _write(out: Path, files: dict[str, str], *, inputs: list[Path], force: bool) -> list[Path]:
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".pyree-replace.{os.getpid()}-{os.urandom(4).hex()}.build"
    staging.mkdir()
    try:
        staged = {}
        for name, content in files.items():
            (staging / name).write_text(content, encoding="utf-8")
            staged[name] = staging / name
        replace_directory_files(out, staged, inputs=inputs, force=force, verb="replace", prune=False)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return [out / name for name in files]
