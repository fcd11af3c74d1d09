"""The language-neutral GPU emitter of a loop nest (loopnest.Nest, loopnest.RowNest), which the
GLSL (glsl.py) and CUDA/HIP C (cuda_c.py) forms complete, and what both languages' files share:
the kernel's buffers (`Binding`), the parts of a file (`Parts`), the workgroup-size knob and
its `pyree-tune:` lines, and the refusal naming the target.

One invocation per result element: the element's index is split into the result's loops,
the reduction (if any) runs over its loops in the IR's order with the accumulator in a
register, then the epilogue's stages are applied and the element stored; an elementwise
producer is inlined where it is read, as in c_tiled. The invocations stride over the result
(`i += invocations`), so any workgroup size and any workgroup count compute every element
once: the workgroup size is a knob (`PYREE_WG_SIZE`, a `pyree-tune:` line) and the spec's
count is only how the work is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyree_build.core import escape
from pyree_build.core.errors import PyreeError
from pyree_build.models.codegen import c_reference, c_tiled, loopnest
from pyree_build.models.codegen.emitter import NestEmitter, Unfused, coordinate
from pyree_build.models.ir import program

WORKGROUP_SIZE = loopnest.Knob("PYREE_WG_SIZE", 64, (32, 64, 128, 256), "invocations per workgroup, one result element each")


def refuse(target: str, what: str, op_name: str = "") -> PyreeError:
    return PyreeError(
        f"the group cannot be generated for {target}: {what}",
        details=f"op: {op_name}" if op_name else None,
        fix=f"choose another group (pyree-build ops --target {target} lists which can be generated), or another --target",
    )


@dataclass
class Binding:
    """A buffer of the kernel: its name, element type (as the language spells it) and sizes."""

    name: str
    ctype: str
    dims: list[str]
    about: str


class GpuEmitter(NestEmitter):
    """Statements of one result element's computation, one invocation each. The language's forms
    (types, declarations, loads, stores, scalar ops) come from GlslForms or CudaForms, mixed in
    by the concrete emitters in gpu_source."""

    def __init__(self, target: str, k: c_reference.Kernel, nest: loopnest.Nest, out: Binding) -> None:
        super().__init__(k, nest)
        self.target, self.out = target, out
        self.glsl_helpers: set[str] = set()

    def scalar_type(self, type_: Any, op_name: str = "") -> str:
        raise NotImplementedError

    def declare(self, ctype: str, name: str, expression: str) -> str:
        raise NotImplementedError

    def literal(self, attr: Any, ctype: str) -> str:
        raise NotImplementedError

    def element_load(self, buffer: c_reference.Buffer, index: str, value: Any, name: str) -> str:
        """The statement declaring `name` as `buffer`'s element at `index`."""
        raise NotImplementedError

    def element_store(self, result: str, index: str) -> str:
        """The statement storing `result` as the result's element at `index`."""
        raise NotImplementedError

    def load(self, value: Any, coords: list[str], indent: str) -> str:
        buffer = self.k.buffers.get(value)
        if buffer is None or buffer.pointer is None or not buffer.pointer.startswith("in"):
            raise Unfused("a value that is neither an input, a constant nor computed by the nest")
        name = self.k.fresh("a")
        self.line(indent, self.element_load(buffer, loopnest.linear_index(coords, buffer.dims), value, name))
        return name

    def element(self, index_type: str, indent: str) -> None:
        """The statements computing result element `i` (already declared) into out0."""
        nest = self.nest
        self.split_index(index_type, indent)
        loops = ["0"] * len(nest.sizes)
        for d in nest.result_loops:
            loops[d] = f"l{d}"
        for d in nest.reduction_loops:
            loops[d] = f"k{d}"
        at = [loops[d] for d in nest.result_loops]
        acc = None
        reduction = nest.reduction
        if reduction is not None:
            acc = "acc"
            self.reduce(reduction, acc, at, loops, index_type, indent, lambda inner: self.stage(reduction, loops, inner, {}, None, at, out_arg=acc))
        self.store(self.value(nest.result, at, indent, {}, acc, at), at, indent)

    def split_index(self, index_type: str, indent: str) -> None:
        """The result loops' variables (l<d>) from the element's index `i`."""
        nest = self.nest
        self.line(indent, f"{index_type} q = i;")
        for position, d in reversed(list(enumerate(nest.result_loops))):
            if position:
                self.line(indent, f"{index_type} l{d} = q % {as_index(nest.sizes[d], index_type)};")
                self.line(indent, f"q /= {as_index(nest.sizes[d], index_type)};")
            else:
                self.line(indent, f"{index_type} l{d} = q;")

    def reduce(self, stage: loopnest.Stage, acc: str, init_at: list[str], loops: list[str], index_type: str, indent: str, step: Any) -> None:
        """A reduction into the register `acc`: its initial value at `init_at`, then its loops (the
        `loops` named k<d>) in the IR's order, each step's value `step(indent)`."""
        live = self.live(stage)
        init = stage.op.operands[stage.n_ins + live]
        rtype = self.scalar_type(stage.op.results[live].type, stage.op.name)
        self.line(indent, f"{rtype} {acc} = {self.value(init, init_at, indent, {}, None, init_at)};")
        inner = indent
        reduced = [d for d, loop in enumerate(loops) if loop == f"k{d}"]
        for d in reduced:
            self.line(inner, f"for ({index_type} k{d} = 0; k{d} < {as_index(self.nest.sizes[d], index_type)}; ++k{d}) {{")
            inner += "  "
        self.line(inner, f"{acc} = {step(inner)};")
        for _ in reduced:
            inner = inner[:-2]
            self.line(inner, "}")

    def live(self, stage: loopnest.Stage) -> int:
        """The result of a reduction the nest reads (its only one, in a per-element nest)."""
        return 0

    def store(self, result: str, at: list[str], indent: str) -> None:
        self.line(indent, self.element_store(result, loopnest.linear_index(at, self.out.dims)))


class RowElements(GpuEmitter):
    """Statements of one result element of a row-wise nest (loopnest.RowNest: a softmax, a
    LayerNorm): the element's row's reductions first, in program order, each in its own loop
    over the last (contiguous) loop with its own register, reading the earlier ones' results
    by name; then the element from the stages and those per-row values. Every element of a
    row recomputes its row's reductions (O(n^2) per row of n): naive and correct.

    The element itself is an elementwise nest over the result's loops (`self.nest`) whose
    reads of a reduction's result, at the element's row, are the registers computed first."""

    def __init__(self, target: str, k: c_reference.Kernel, rows: loopnest.RowNest, out: Binding) -> None:
        rank = len(rows.sizes)
        super().__init__(target, k, loopnest.Nest(list(rows.sizes), ["parallel"] * rank, list(range(rank)), None, rows.stages, rows.result), out)
        self.rows = rows
        self.point = [f"l{d}" for d in range(rank)]
        self.per_row: dict[Any, str] = {}  # each reduction's live result computed so far: its register

    def live(self, stage: loopnest.Stage) -> int:
        return next(j for s, j in self.rows.reductions if s.op == stage.op)

    def value(self, value: Any, coords: list[str], indent: str, memo: dict[Any, str], acc: str | None, at: list[str]) -> str:
        while value in self.rows.reshapes:  # a unit-dimension reshape: its source, at the same element
            source = self.rows.reshapes[value]
            kept = [c for c, d in zip(coords, program.shape(value.type)) if d != 1]
            coords = ["0" if d == 1 else kept.pop(0) for d in program.shape(source.type)]
            value = source
        if value in self.per_row:
            if not self._at_row(value, coords):
                raise Unfused("a reduction's result is read at another row than the element's")
            return self.per_row[value]
        return super().value(value, coords, indent, memo, acc, at)

    def settled(self, value: Any) -> bool:
        return value in self.rows.reshapes or value in self.per_row

    def _at_row(self, value: Any, coords: list[str]) -> bool:
        stage, live = next((s, j) for s, j in self.rows.reductions if s.op.results[j] == value)
        expected = [coordinate(e, self.point) for e in stage.maps[stage.n_ins + live]]
        shape = program.shape(value.type)
        return [c for c, d in zip(coords, shape) if d != 1] == [c for c, d in zip(expected, shape) if d != 1]

    def element(self, index_type: str, indent: str) -> None:
        """The statements computing result element `i` (already declared) into out0."""
        self.split_index(index_type, indent)
        last = len(self.point) - 1
        loops = [*self.point[:-1], f"k{last}"]
        for n, (stage, live) in enumerate(self.rows.reductions):
            names = ", ".join(program.location_names(stage.op.location)) or "?"
            self.line(indent, escape.c_comment(f"reduction {n + 1} ({names}): one value for the element's row"))
            acc = f"row{n}"
            init_at = [coordinate(e, self.point) for e in stage.maps[stage.n_ins + live]]
            self.reduce(stage, acc, init_at, loops, index_type, indent, lambda inner: self._step(stage, live, loops, inner, acc))  # noqa: B023
            self.per_row[stage.op.results[live]] = acc
        self.store(self.value(self.rows.result, self.point, indent, {}, None, self.point), self.point, indent)

    def _step(self, stage: loopnest.Stage, live: int, coords: list[str], indent: str, acc: str) -> str:
        """A reduction step: the body's ops its live result needs (a max's, not its index's),
        the live accumulator read from `acc`; the yielded value's name."""
        block = stage.body
        ops = [inner.operation for inner in block.operations]
        arguments = list(block.arguments)
        producers = {r: n for n, op in enumerate(ops) for r in op.results}
        needed: set[int] = set()
        pending = [ops[-1].operands[live]]
        while pending:
            n = producers.get(pending.pop())
            if n is not None and n not in needed:
                needed.add(n)
                pending.extend(ops[n].operands)
        memo: dict[Any, str] = {}
        values = {arguments[stage.n_ins + live]: acc}
        for n, (operand, arg) in enumerate(zip(stage.op.operands[: stage.n_ins], arguments)):
            if list(arg.uses):
                values[arg] = self.value(operand, [coordinate(e, coords) for e in stage.maps[n]], indent, memo, None, coords)
        for n in sorted(needed):
            if any(v in arguments and v not in values for v in ops[n].operands):
                raise Unfused("a reduction's step reads the accumulator of a result nothing needs")
            self.body_op(ops[n], values, indent, coords)
        return c_reference.operand(self.k, values, ops[-1].operands[live], stage.op.name)


def as_index(size: str, index_type: str) -> str:
    """A size as the index type: a C cast where it is a name and the type is not GLSL's int."""
    return size if size.isdigit() or index_type == "int" else f"({index_type}){size}"


@dataclass
class Parts:
    """What both languages' files are made of: the header comment, the statements before the
    element loop (constants), the loop's body, the element count and the loop's comment."""

    head: list[str]
    prologue: list[str]
    body: list[str]
    total: str
    comment: list[str]


def knob_lines(knob: loopnest.Knob) -> list[str]:
    """A knob as every language declares it: the `pyree-tune:` line tune reads, the default first as
    the C's (c_tiled.declared_order: among variants noise cannot tell apart, tune keeps the untuned
    kernel), and the default."""
    values = ",".join(map(str, c_tiled.declared_order(knob)))
    return [f"// pyree-tune: {knob.name}={values}  ({knob.about})", f"#ifndef {knob.name}", f"#define {knob.name} {knob.default}", "#endif"]
