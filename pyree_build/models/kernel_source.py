"""The kernel `replace` writes for one op group, from the program's IR: for the CPU, C (the group
fused into one loop nest, tiled, or row by row; else one loop nest per op, correct and naive);
for a GPU target, its language's kernel from the same loop-nest model. Each file opens with a
header naming the group, its ops and where they came from (`describe_ops`, `source_names`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from pyree_build.models import spec
from pyree_build.models.codegen import c_reference, c_rows, c_tiled, emitter, gpu_source, loopnest
from pyree_build.models.ir import analysis, groups, program


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


def for_gpu(found: analysis.Analysis, rep: spec.Replacement, target: str, *, dynamic: bool) -> str:
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
    if isinstance(nest, loopnest.RowNest):  # its result may be the stage a unit-dimension reshape of the group's result reads
        out = dataclasses.replace(out, dims=list(nest.sizes))
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
        # The static form's matcher takes only these types, so a size the type fixes is a
        # constant in the C (loops of known trip count unroll, strides fold); a size the type
        # leaves open, or any size in the general form, is read from the argument block.
        shape = program.shape(value.type)
        sizes = [f"in{i}_d{d}" if rep.dynamic or size is None else str(size) for d, size in enumerate(shape)]
        roles[program.position(value, group.function)] = c_reference.Buffer(f"in{i}", sizes, c_reference.c_type(value.type))
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


def for_cpu(found: analysis.Analysis, rep: spec.Replacement, *, dynamic: bool) -> str:
    """The group's C import: fused into one loop nest where the model covers it (`_fused_kernel`),
    else one loop nest per op; `dynamic`: every size read from the arguments."""
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
    if len(group.root.results) != 1:
        return None
    k, member_ops, result = _kernel_of(function, rep, members)
    nest = loopnest.build(member_ops, result, k.buffers)
    relayout = gather = None
    if nest is None and not rep.dynamic:  # a matmul or a bias add whose result is then reshaped and transposed (attention's heads)
        peeled = loopnest.peel_layout(member_ops, result)
        if peeled is not None:
            nest = loopnest.build(peeled[0], peeled[1], k.buffers)
            if nest is not None and nest.reduction is None:
                nest, gather = loopnest.in_result_space(nest, result, k.buffers[result].dims), peeled[2].backward
            else:
                relayout = peeled[2].forward
    if nest is None:
        if rep.dynamic:
            return None
        rows = _row_kernel(k, rep, member_ops, result, [ops[i] for i in constants])
        if rows is None:
            rows = _tiles_then_rows(function, rep, members, [ops[i] for i in constants])
        return rows if rows is not None else _tiles_rows_tiles(function, rep, members, [ops[i] for i in constants])
    # A result stored moved is not stored in rows; a spec for any sizes has no fixed row to fold.
    plan = loopnest.schedule(nest, fold=relayout is None and gather is None and not rep.dynamic)
    fields = c_reference.parameters(group.inputs, list(group.root.results), [], [_value_name(v) for v in group.inputs])
    try:
        c_tiled.emit(
            k, nest, plan, name=rep.name, fields=fields, constants=[ops[i] for i in constants], out=k.buffers[result], relayout=relayout, gather=gather
        )
    except emitter.Unfused:
        return None
    rep.scratch = []
    rep.workgroups = plan.workgroups
    k.form = "The group's ops fused into one loop nest, tiled into register blocks (the schedule's knobs below)."
    if rep.dynamic:  # the rows are only known at run time: the spec counts the workgroups from them
        rep.row_workgroups = (loopnest.ROWS_PER_WORKGROUP, loopnest.MAX_WORKGROUPS)
    return k


def _kernel_of(function: Any, rep: spec.Replacement, members: list[int]) -> tuple[c_reference.Kernel, list[Any], Any]:
    """A kernel holding the group's buffers, the member ops a nest is built from, the group's result."""
    group = rep.group
    k = c_reference.Kernel()
    for where, buffer in _roles(rep).items():
        k.buffers[program.value_at(where, function)] = buffer
    inputs = {program.value_at(program.position(v, group.function), function) for v in group.inputs}
    member_ops = _read_through_reshapes([program.body_ops(function)[m] for m in members], inputs, k.buffers, rep.dynamic)
    return k, member_ops, program.value_at(program.position(group.root.results[0], group.function), function)


def _reduces(op: Any) -> bool:
    """Whether a generalised member op has a reduction loop (each nest of a split needs one)."""
    return bool(op.name == "linalg.generic" and "reduction" in str(op.attributes["iterator_types"]))


MAX_CUTS = 8  # values `_tiles_then_rows` tries as the one the tiled nest computes


def _tiles_then_rows(function: Any, rep: spec.Replacement, members: list[int], constants: list[Any]) -> c_reference.Kernel | None:
    """A reduction nest whose result only a row-wise nest reads, both of the result's shape (a
    matmul and the Softmax of its rows, attention's scores; a Linear and the LayerNorm after it,
    groups merged with --ops 5+6): the tiled nest computes its value into the result's buffer,
    then each workgroup runs the row passes over the rows its own tiles computed, in place. None
    where the group does not split so. As the per-op reference, the encoder's scores + Softmax
    took 3.3 ms, against 75 + 23 us for the two kernels apart."""
    _, member_ops, result = _kernel_of(function, rep, members)
    shape = program.shape(result.type)
    reduces = [n for n, op in enumerate(member_ops) if _reduces(op)]
    if len(reduces) < 2:
        return None  # one reduction at least in each nest
    # Values of the result's shape between the first reduction and the last, the last first: the
    # longest head, whose elementwise epilogue is computed once, not per pass. A few only: each is
    # a nest built and emitted, and a model is data (a chain of thousands of ops between them).
    cuts = [n for n in range(reduces[0], reduces[-1]) if len(member_ops[n].results) == 1 and program.shape(member_ops[n].results[0].type) == shape]
    for n in reversed(cuts[-MAX_CUTS:]):
        for store in (True, False):  # softmax's exp stored over the computed value, where nothing reads that later
            k = _tiles_then_rows_at(function, rep, members, constants, n, store=store)
            if k is not None:
                return k
    return None


def _tiles_then_rows_at(function: Any, rep: spec.Replacement, members: list[int], constants: list[Any], n: int, *, store: bool) -> c_reference.Kernel | None:
    """`_tiles_then_rows` with the tiled nest computing member op `n`'s result."""
    k, member_ops, result = _kernel_of(function, rep, members)
    plan = _emit_tiles_then_rows(k, rep, member_ops, member_ops[n].results[0], result, constants, store=store, scratch=[])
    if plan is None:
        return None
    rep.scratch = []
    rep.workgroups = plan.workgroups
    k.form = (
        "The group's ops in two fused loop nests: the first, tiled into register blocks, computes its rows into the result;"
        " the second's passes then run over each of those rows in place (the schedule's knobs below)."
    )
    return k


def _split(member_ops: list[Any], value: Any) -> tuple[list[Any], list[Any]]:
    """The member ops `value` depends on (its own included) and the others, each in program order."""
    producer = {r: op for op in member_ops for r in op.results}
    needed, pending = set(), [producer[value]]
    while pending:
        op = pending.pop()
        if op not in needed:
            needed.add(op)
            pending += [producer[v] for v in op.operands if v in producer]
    return [op for op in member_ops if op in needed], [op for op in member_ops if op not in needed]


def _emit_tiles_then_rows(
    k: c_reference.Kernel, rep: spec.Replacement, member_ops: list[Any], computed: Any, result: Any, constants: list[Any], *, store: bool, scratch: list[Any]
) -> loopnest.Schedule | None:
    """The tiled nest computing `computed` from the ops of `member_ops` it depends on (in
    program order: the ops a reduction of the rows starts from may come before it) into
    `result`'s buffer, then the row-wise nest of the others computing `result` there in place,
    emitted into `k`; the tiled nest's schedule, or None where the ops do not split so.
    `scratch`: the group's values the kernel keeps in buffers of their own (arguments)."""
    head, tail = _split(member_ops, computed)
    produced = {r for op in head for r in op.results}
    if not tail or result in produced or {v for op in tail for v in op.operands if v in produced} != {computed}:
        return None
    if c_reference.c_type(computed.type) != k.buffers[result].ctype:
        return None
    nest = loopnest.build(head, computed, k.buffers)
    if nest is None or nest.reduction is None:
        return None
    rows = loopnest.build_rows(tail, result, k.buffers)
    if rows is None or rows.result is not result:
        return None
    plan = loopnest.schedule(nest, fold=False)
    if plan.row_loops != nest.result_loops[:-1] or plan.vector_loop != nest.result_loops[-1]:
        return None  # a tile's rows must be the result's rows, in order, for the row passes to find them
    plan.reuse_order = None
    k.buffers[computed] = k.buffers[result]
    fields = c_reference.parameters(rep.group.inputs, list(rep.group.root.results), scratch, [_value_name(v) for v in rep.group.inputs])
    try:
        c_tiled.emit(k, nest, plan, name=rep.name, fields=fields, constants=constants, out=k.buffers[result])
        c_rows.emit_after_tiles(k, rows, loopnest.schedule_rows(rows), computed=computed, tile_rows=plan.knobs[0].name, constants=constants, store=store)
    except emitter.Unfused:
        return None
    return plan


def _row_count(nest: loopnest.Nest, plan: loopnest.Schedule) -> int | None:
    extents = [nest.extents[d] for d in plan.row_loops]
    return None if None in extents else math.prod(e or 0 for e in extents)


def _tiles_rows_tiles(function: Any, rep: spec.Replacement, members: list[int], constants: list[Any]) -> c_reference.Kernel | None:
    """A tiled nest and the row-wise nest reading it (as `_tiles_then_rows`), then a reduction
    nest reading their value row by row (attention's scores, Softmax and product with V merged,
    --ops 5+6+7): the first two compute that value into a scratch buffer, then each workgroup
    runs the last nest over the rows its own tiles computed. None where the group does not split
    so (the per-op reference is generated)."""
    _, member_ops, result = _kernel_of(function, rep, members)
    reduces = [op for op in member_ops if _reduces(op)]
    if len(reduces) < 3:
        return None  # a reduction in the first nest, one in the rows' and the last nest's
    produced = {r for op in member_ops for r in op.results}
    # what the last reduction reads of the other nests' work (not an input broadcast for it)
    read = [
        v
        for v in reduces[-1].operands[: len(reduces[-1].operands) - len(reduces[-1].results)]
        if v in produced and any(op in reduces for op in _split(member_ops, v)[0])
    ]
    if len(read) != 1 or read[0] == result:
        return None
    everything = rep.scratch
    rep.scratch = [program.value_at(program.position(read[0], function), rep.group.function)]  # the one buffer the kernel keeps
    k = _tiles_rows_tiles_through(function, rep, members, constants, read[0])
    if k is None:
        rep.scratch = everything
    return k


def _tiles_rows_tiles_through(function: Any, rep: spec.Replacement, members: list[int], constants: list[Any], rows_value: Any) -> c_reference.Kernel | None:
    """`_tiles_rows_tiles` with `rows_value` the value the first two nests compute into the
    scratch buffer (rep.scratch) and the last reads."""
    k, member_ops, result = _kernel_of(function, rep, members)
    first, rest = _split(member_ops, rows_value)
    producer = {r: op for op in first for r in op.results}
    # An op of the first nests that reads nothing the group computes (a zero fill, which the IR
    # shares between two products of one shape: a head as wide as the sequence) is computed
    # again in the last; anything else of theirs it reads is another row's work.
    shared = {producer[v] for op in rest for v in op.operands if v in producer and v != rows_value}
    computed = {r for op in member_ops for r in op.results}
    if any(v in computed for op in shared for v in op.operands) or rows_value not in {v for op in rest for v in op.operands}:
        return None
    rest = [op for op in member_ops if op in rest or op in shared]
    nest, relayout = _last_nest(rest, result, k.buffers)
    if nest is None or nest.reduction is None or not _reads_its_own_rows(nest, rows_value):
        return None
    plan = loopnest.schedule(nest, fold=False)
    if plan.row_loops != nest.result_loops[:-1] or plan.vector_loop != nest.result_loops[-1]:
        return None  # its rows in the result's order, as the first nest's are
    if _row_count(nest, plan) != math.prod(d or 0 for d in program.shape(rows_value.type)[:-1]):
        return None
    reduces = [n for n, op in enumerate(first) if _reduces(op)]
    shape = program.shape(rows_value.type)
    cuts = [n for n in range(reduces[0], reduces[-1]) if len(first[n].results) == 1 and program.shape(first[n].results[0].type) == shape]
    fields = c_reference.parameters(rep.group.inputs, list(rep.group.root.results), rep.scratch, [_value_name(v) for v in rep.group.inputs])
    for n in reversed(cuts[-MAX_CUTS:]):
        for store in (True, False):
            attempt = _kernel_of(function, rep, members)[0]
            head = _emit_tiles_then_rows(attempt, rep, first, first[n].results[0], rows_value, constants, store=store, scratch=rep.scratch)
            if head is None:
                continue
            try:
                c_tiled.emit_last(
                    attempt, nest, plan, name=rep.name, fields=fields, constants=constants, out=attempt.buffers[result],
                    rows_of=head.knobs[0].name, reads=rows_value, relayout=relayout,
                )  # fmt: skip
            except emitter.Unfused:
                continue
            rep.workgroups = head.workgroups
            attempt.form = (
                "The group's ops in three fused loop nests: the first, tiled into register blocks, computes its rows into a scratch"
                " buffer; the second's passes run over each of those rows in place; the third, tiled, computes the result from the"
                " rows this workgroup computed (the schedule's knobs below)."
            )
            return attempt
    return None


def _last_nest(ops: list[Any], result: Any, buffers: dict[Any, c_reference.Buffer]) -> tuple[loopnest.Nest | None, loopnest.Relayout | None]:
    """The nest of `ops` computing `result`, or of the ops before a layout change stored moved
    (a product whose heads are then transposed and merged), with that move."""
    nest = loopnest.build(ops, result, buffers)
    if nest is not None:
        return nest, None
    peeled = loopnest.peel_layout(ops, result)
    if peeled is None:
        return None, None
    return loopnest.build(peeled[0], peeled[1], buffers), peeled[2].forward


def _reads_its_own_rows(nest: loopnest.Nest, value: Any) -> bool:
    """Whether the nest reads `value` only in its reduction, at its own row and the reduction
    step: element (rows..., k) for a result row (rows...). Another workgroup's rows, or a row
    read at any other point, may not be computed yet when this workgroup reads it."""
    stage = nest.reduction
    if stage is None or any(value in s.op.operands for s in nest.stages.values()):
        return False
    inputs = list(stage.op.operands[: stage.n_ins])
    if value not in inputs:
        return False
    rows, reduction = nest.result_loops[:-1], set(nest.reduction_loops)
    for n, operand in enumerate(inputs):
        if operand == value:
            loops = [loopnest.loop_of(e) for e in stage.maps[n]]
            if loops[:-1] != rows or loops[-1] not in reduction:
                return False
    return True


def _read_through_reshapes(member_ops: list[Any], inputs: set[Any], buffers: dict[Any, c_reference.Buffer], dynamic: bool) -> list[Any]:
    """The member ops less each reshape of one of the group's `inputs` (a BatchNorm's 1-D
    parameters given unit dimensions), whose result is then read from that
    buffer at its own sizes: a reshape keeps the row-major order of the elements, so it moves
    nothing. The loop-nest model takes only linalg.generic ops; without this the whole group
    fell back to the per-op reference body (ResNet-50's shortcut convolution and BatchNorm:
    4.3x IREE's time). Static sizes only: in the general form the reshape's sizes are the
    inputs' too, but not as names the buffers carry."""
    if dynamic:
        return member_ops
    kept = []
    for op in member_ops:
        source = op.operands[0] if op.name in groups.RESHAPES else None
        shape = program.shape(op.results[0].type) if source is not None else []
        if source is not None and source in inputs and None not in shape:
            buffers[op.results[0]] = c_reference.Buffer(buffers[source].pointer, [str(d) for d in shape], buffers[source].ctype)
            continue
        kept.append(op)
    return kept


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
