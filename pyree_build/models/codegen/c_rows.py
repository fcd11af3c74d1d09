"""The C emitter of a row-wise nest (loopnest.RowNest: a softmax, a LayerNorm) under its schedule.

The kernel computes the rows of its workgroup (`workgroup_id` of `workgroup_count`), one at a
time. For a row it runs one pass over the contiguous loop per reduction, in the IR's order,
then one pass that stores the result's row. A value that depends on the row alone (a
reduction's initial value, a mean, a reciprocal square root) is computed once per row, before
the pass that first reads it; every other value is computed where it is read (a stage is
never stored), except one: a stage with a math function in it (softmax's exp) that a
reduction and the result both read is stored into the result's row by the first pass that
computes it, and read back by the later ones, so it is computed once.

A reduction whose body combines its input with its accumulator by one associative operation
(add, multiply, max, min) runs in PYREE_LANES partial results, a vector's lanes, combined in
lane order at the row's end (PYREE_LANES=1: the IR's order, bit for bit); any other body runs
in the IR's order. The passes' column loops are marked for the vectorizer; math functions on
f32 are the branch-free float forms of pyree_build/math_inline.h, so they vectorize too.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from pyree_build.core import escape
from pyree_build.models.codegen import c_reference, c_tiled, emitter, loopnest
from pyree_build.models.ir import program

# Combining two partial results by the body's own operation is exact reassociation only for
# these (max and min exactly; sums and products within rounding).
_ASSOCIATIVE = {"arith.addf", "arith.mulf", "arith.maximumf", "arith.minimumf", "arith.maxnumf", "arith.minnumf",
                "arith.addi", "arith.muli", "arith.andi", "arith.ori", "arith.xori", "arith.maxsi", "arith.minsi"}  # fmt: skip
_COLUMN = re.compile(r"\bc\b")


def _strip(coordinate: str) -> str:
    while coordinate.startswith("(") and coordinate.endswith(")") and coordinate.count("(") == 1:
        coordinate = coordinate[1:-1]
    return coordinate


class _RowEmitter:
    def __init__(self, k: c_reference.Kernel, nest: loopnest.RowNest, plan: loopnest.RowSchedule, out: c_reference.Buffer) -> None:
        self.k, self.nest, self.plan, self.out = k, nest, plan, out
        self.rank = len(nest.sizes)
        self.at = [f"at{n}" for n in range(self.rank - 1)]
        self.point = [*self.at, "c"]
        self.done: dict[Any, str] = {}  # each reduction's live result computed so far: its C name
        self.row_memo: dict[Any, str] = {}
        self.row_lines: list[str] = []
        self.row_indent = "    "
        self.stored: Any = None  # the stage stored into the result's row
        self.stored_in: int | None = None  # the pass that stores it
        self.pass_index = 0
        self.pass_lines: list[str] = []  # the pass being emitted (row-level values go before it)
        self.ind = self.row_indent
        # A value a tiled nest before this one stored in the result's buffer (emit_after_tiles): read
        # there, at the row's own point only, and not after the pass that stores a stage over it.
        self.in_place: Any = None
        self.store_in_place = True  # whether a stage may be stored over it (choose_stored)
        self.tile_rows: str | None = None  # that nest's tile-rows knob: its share of rows is this one's

    # --- what is read where -------------------------------------------------------------
    def _source(self, value: Any) -> Any:
        while value in self.nest.reshapes:
            value = self.nest.reshapes[value]
        return value

    def cone(self, value: Any) -> set[Any]:
        """The stages computing `value` (not crossing a reduction's result); a walk with its own
        stack, so a long chain of elementwise ops is no recursion of Python's."""
        seen: set[Any] = set()
        pending = [value]
        while pending:
            value = self._source(pending.pop())
            stage = self.nest.stages.get(value)
            if stage is None or value in seen:
                continue
            seen.add(value)
            pending.extend(stage.op.operands[: stage.n_ins])
        return seen

    def _has_math(self, values: set[Any]) -> bool:
        return any(inner.operation.name.startswith("math.") for v in values for inner in self.nest.stages[v].body.operations)

    def choose_stored(self) -> None:
        """The one stage worth storing in the result's row: read by a reduction's pass and by a
        later pass, the result's shape and type, with a math function in its computation."""
        passes = [set().union(*(self.cone(o) for o in stage.op.operands[: stage.n_ins])) for stage, _ in self.nest.reductions]
        passes.append(self.cone(self.nest.result))
        shape = program.shape(self.nest.result.type)
        candidates = set()
        for n, here in enumerate(passes[:-1]):
            for value in here:
                later = any(value in p for p in passes[n + 1 :])
                if later and program.shape(value.type) == shape and c_reference.c_type(value.type) == self.out.ctype and self._has_math(self.cone(value)):
                    candidates.add(value)
        maximal = [v for v in candidates if not any(v != w and v in self.cone(w) for w in candidates)]
        if len(maximal) == 1:
            self.stored = maximal[0]
            self.stored_in = next(n for n, here in enumerate(passes) if self.stored in here)

    # --- values -------------------------------------------------------------------------
    def value(self, value: Any, coords: list[str], memo: dict[Any, str]) -> str:
        """A C name holding `value` at `coords`; a value of the row alone goes before the pass."""
        if value in self.k.scalars:
            return self.k.scalars[value]
        if not any(_COLUMN.search(c) for c in coords) and memo is not self.row_memo:
            lines, self.k.lines = self.k.lines, self.row_lines
            try:
                return self.value(value, coords, self.row_memo)
            finally:
                self.k.lines = lines
        key = (value, tuple(_strip(c) for c in coords))
        if key in memo:
            return memo[key]
        indent = self.row_indent
        if value in self.nest.reshapes:
            name = self.value(self.nest.reshapes[value], self._reshaped(value, coords), memo)
        elif value in self.done:
            if not self._at_row(value, coords):
                raise emitter.Unfused("a reduction's result is read at another row than the one being computed")
            name = self.done[value]
        elif self.stored is not None and value == self.stored and self.pass_index > (self.stored_in or 0) and [_strip(c) for c in coords] == self.point:
            name = self.k.fresh("s")
            self.k.lines.append(f"{indent}const {self.out.ctype} {name} = {self._out_at()};")
        elif value in self.nest.stages:
            self._read_first(self.nest.stages[value], coords, memo)
            name = self.stage(self.nest.stages[value], coords, memo, indent)
        elif self.in_place is not None and value == self.in_place:
            if [_strip(c) for c in coords] != self.point:
                raise emitter.Unfused("the value computed into the result is read at another point than the one being computed")
            if self.stored is not None and self.pass_index > (self.stored_in or 0):
                raise emitter.Unfused("the value computed into the result is read after a stage was stored over it")
            name = self.k.fresh("s")
            self.k.lines.append(f"{indent}const {self.out.ctype} {name} = {self._out_at()};")
        else:
            buffer = self.k.buffers.get(value)
            if buffer is None or buffer.pointer is None or buffer.pointer.startswith(("out", "tmp")):
                raise emitter.Unfused("a value that is neither an input, a constant nor computed by the nest, where it is read")
            name = self.k.fresh("a")
            self.k.lines.append(f"{indent}const {buffer.ctype} {name} = {buffer.pointer}[{loopnest.linear_index(coords, buffer.dims)}];")
        memo[key] = name
        return name

    def _reads(self, stage: loopnest.Stage, coords: list[str]) -> list[tuple[Any, list[str]]]:
        """What `stage()` reads: each used input operand at its map's point."""
        block = stage.body
        return [
            (operand, [emitter.coordinate(e, coords) for e in stage.maps[n]])
            for n, (operand, arg) in enumerate(zip(stage.op.operands, block.arguments))
            if n < stage.n_ins and list(arg.uses)
        ]

    def _evaluates(self, value: Any, coords: list[str], memo: dict[Any, str]) -> bool:
        """Whether `value()` would evaluate a stage for `value` at `coords` (not yet known)."""
        key = (value, tuple(_strip(c) for c in coords))
        stored = self.stored is not None and value == self.stored
        return value in self.nest.stages and value not in self.done and not stored and key not in memo and key not in self.row_memo

    def _read_first(self, top: loopnest.Stage, coords: list[str], memo: dict[Any, str]) -> None:
        """Every value `top` reads through stages at any depth, known before it, deepest first
        and in reading order."""

        def pending(value: Any, at: list[str]) -> list[loopnest.Read] | None:
            return self._reads(self.nest.stages[value], at) if self._evaluates(value, at, memo) else None

        loopnest.deepest_first(self._reads(top, coords), pending, lambda value, at: self.value(value, at, memo))

    def _reshaped(self, value: Any, coords: list[str]) -> list[str]:
        """A unit-dimension reshape's coordinates in its source: the non-unit ones, in order."""
        kept = [c for c, d in zip(coords, program.shape(value.type)) if d != 1]
        source = program.shape(self.nest.reshapes[value].type)
        out = []
        for d in source:
            out.append("0" if d == 1 else kept.pop(0))
        return out

    def _at_row(self, value: Any, coords: list[str]) -> bool:
        shape = program.shape(value.type)
        stage, live = next((s, j) for s, j in self.nest.reductions if s.op.results[j] == value)
        expected = [emitter.coordinate(e, self.point) for e in stage.maps[stage.n_ins + live]]
        return [_strip(c) for c, d in zip(coords, shape) if d != 1] == [_strip(c) for c, d in zip(expected, shape) if d != 1]

    def _out_at(self) -> str:
        return f"{self.out.pointer}[{loopnest.linear_index(self.point, self.out.dims)}]"

    def body(self, op: Any, arguments: dict[Any, str], yielded: int, coords: list[str], indent: str) -> str:
        """The ops of `op`'s body that yield result `yielded` (its others are not needed), with
        block arguments `arguments` (C names), emitted; the yielded value's C name."""
        block = op.regions[0].blocks[0]
        terminator = list(block.operations)[-1].operation
        producers = {r: n for n, inner in enumerate(block.operations) for r in inner.operation.results}
        needed: set[int] = set()
        pending = [terminator.operands[yielded]]
        while pending:
            v = pending.pop()
            n = producers.get(v)
            if n is not None and n not in needed:
                needed.add(n)
                pending.extend(list(block.operations)[n].operation.operands)
        values: dict[Any, str] = {}
        for arg in block.arguments:
            if arg in arguments:
                values[arg] = arguments[arg]
        for n, inner in enumerate(block.operations):
            body_op = inner.operation
            if n not in needed:
                continue
            used_args = [v for v in body_op.operands if v in list(block.arguments) and v not in values]
            if used_args:
                raise emitter.Unfused("a reduction's body reads an accumulator of a result nothing needs")
            self._body_op(body_op, values, indent, coords)
        return c_reference.operand(self.k, values, terminator.operands[yielded], op.name)

    def _body_op(self, op: Any, values: dict[Any, str], indent: str, coords: list[str]) -> None:
        c_reference.emit_body_op(self.k, op, values, indent, coords, [])

    def stage(self, stage: loopnest.Stage, coords: list[str], memo: dict[Any, str], indent: str) -> str:
        block = stage.body
        arguments = {}
        for n, (operand, arg) in enumerate(zip(stage.op.operands, block.arguments)):
            if n < stage.n_ins and list(arg.uses):
                arguments[arg] = self.value(operand, [emitter.coordinate(e, coords) for e in stage.maps[n]], memo)
        return self.body(stage.op, arguments, 0, coords, indent)

    # --- passes -------------------------------------------------------------------------
    def column_loop(self, header: str, statement: Any, *, vectorize: bool = True) -> None:
        """A loop over columns (`header`: its `for (...)`), its body `statement(memo)`'s lines.
        A loop carrying one accumulator is not marked: clang's vectorize(enable) would reorder it."""
        lines, self.k.lines = self.k.lines, []
        memo: dict[Any, str] = {}
        text = statement(memo)
        if self.stored is not None and self.pass_index == self.stored_in:
            name = memo.get((self.stored, tuple(self.point)))
            if name is not None:
                self.k.lines.append(f"{self.ind}  {self._out_at()} = {name};")
        body, self.k.lines = self.k.lines, lines
        self.pass_lines += [f"{self.ind}PYREE_VECTORIZE"] if vectorize else []
        self.pass_lines += [f"{self.ind}{header} {{", *[f"{self.ind}  {b.strip()}" for b in body]]
        self.pass_lines += [f"{self.ind}  {text}", f"{self.ind}}}"]

    def reduction(self, stage: loopnest.Stage, live: int) -> None:
        block = stage.body
        n_ins = stage.n_ins
        ctype = c_reference.c_type(stage.op.results[live].type, stage.op.name)
        init = self.value(stage.op.operands[n_ins + live], [emitter.coordinate(e, self.point) for e in stage.maps[n_ins + live]], self.row_memo)
        acc = self.k.fresh("red")
        out_arg = block.arguments[n_ins + live]

        def step(target: str, out: str) -> Any:
            def statement(memo: dict[Any, str]) -> str:
                arguments = {out_arg: out}
                for n in range(n_ins):
                    if list(block.arguments[n].uses):
                        coords = [emitter.coordinate(e, self.point) for e in stage.maps[n]]
                        arguments[block.arguments[n]] = self.value(stage.op.operands[n], coords, memo)
                return f"{target} = {self.body(stage.op, arguments, live, self.point, '')};"

            return statement

        names = ", ".join(program.location_names(stage.op.location)) or "?"
        r = self.ind = self.row_indent
        self.pass_lines.append(f"{r}{escape.c_comment(f'reduction {self.pass_index + 1} ({names}): one value for the row')}")
        self.pass_lines.append(f"{r}{ctype} {acc} = {init};")
        cols = self.nest.sizes[-1]
        if self._combinable(stage, live):
            self.pass_lines += [f"{r}if (PYREE_LANES > 1 && {cols} >= PYREE_LANES) {{", f"{r}  {ctype} lane[PYREE_LANES];"]
            self.ind = r + "  "
            self.column_loop("for (int64_t c = 0; c < PYREE_LANES; ++c)", self._first(stage))
            self.pass_lines.append(f"{r}  int64_t cb = PYREE_LANES;")
            self.pass_lines.append(f"{r}  for (; cb + PYREE_LANES <= {cols}; cb += PYREE_LANES) {{")
            self.ind = r + "    "
            self.column_loop("for (int64_t c = cb; c < cb + PYREE_LANES; ++c)", step("lane[c - cb]", "lane[c - cb]"))
            self.pass_lines.append(f"{r}  }}")
            lines, self.k.lines = self.k.lines, []
            combined = self.body(stage.op, {block.arguments[0]: "lane[l]", out_arg: acc}, live, self.point, "")
            body, self.k.lines = self.k.lines, lines
            self.pass_lines.append(f"{r}  for (int64_t l = 0; l < PYREE_LANES; ++l) {{")
            self.pass_lines += [f"{r}    {b.strip()}" for b in body] + [f"{r}    {acc} = {combined};", f"{r}  }}"]
            self.ind = r + "  "
            self.column_loop(f"for (int64_t c = cb; c < {cols}; ++c)", step(acc, acc), vectorize=False)
            self.pass_lines.append(f"{r}}} else {{")
            self.column_loop(f"for (int64_t c = 0; c < {cols}; ++c)", step(acc, acc), vectorize=False)
            self.pass_lines.append(f"{r}}}")
        else:
            self.column_loop(f"for (int64_t c = 0; c < {cols}; ++c)", step(acc, acc), vectorize=False)
        self.row_lines += self.pass_lines
        self.pass_lines = []
        self.done[stage.op.results[live]] = acc
        self.pass_index += 1

    def _first(self, stage: loopnest.Stage) -> Any:
        """Each lane starts at the first element it takes (no identity value needed)."""

        def statement(memo: dict[Any, str]) -> str:
            coords = [emitter.coordinate(e, self.point) for e in stage.maps[0]]
            return f"lane[c] = {self.value(stage.op.operands[0], coords, memo)};"

        return statement

    def _combinable(self, stage: loopnest.Stage, live: int) -> bool:
        """The body is `accumulator = op(input, accumulator)` for one associative op."""
        if stage.n_ins != 1 or len(stage.op.results) < 1:
            return False
        block = stage.body
        terminator = list(block.operations)[-1].operation
        owner = program.defining_op(terminator.operands[live])
        if owner is None or owner.operation.name not in _ASSOCIATIVE:
            return False
        operands = list(owner.operation.operands)
        return sorted(map(str, operands)) == sorted(map(str, [block.arguments[0], block.arguments[stage.n_ins + live]]))

    def emit(self, constants: list[Any]) -> None:
        nest = self.nest
        if self.in_place is None or self.store_in_place:
            self.choose_stored()
        for op in constants:
            c_reference.emit_constant(self.k, op)
        rows = " * ".join(f"(int64_t){s}" for s in nest.sizes[:-1]) or "1"
        r = self.row_indent
        head = [
            f"  // One row at a time: a pass over the row per reduction ({len(nest.reductions)}), then the row's result.",
            f"  const int64_t rows = {rows};",
            *(
                [
                    "  const int64_t first_row = rows * workgroup_id / workgroup_count;",
                    "  const int64_t end_row = rows * (workgroup_id + 1) / workgroup_count;",
                ]
                if self.tile_rows is None
                else [
                    "  // The rows of this workgroup's tiles above, which it has computed: another workgroup's may not be yet.",
                    f"  const int64_t first_row = (rows + {self.tile_rows} - 1) / {self.tile_rows} * workgroup_id / workgroup_count * {self.tile_rows};",
                    f"  const int64_t tiles_end = (rows + {self.tile_rows} - 1) / {self.tile_rows} * (workgroup_id + 1) / workgroup_count * {self.tile_rows};",
                    "  const int64_t end_row = tiles_end < rows ? tiles_end : rows;",
                ]
            ),
            "  for (int64_t row = first_row; row < end_row; ++row) {",
        ]
        if self.at:
            head.append(f"{r}int64_t q = row;")
            for n in reversed(range(len(self.at))):
                size = nest.sizes[n]
                head.append(f"{r}const int64_t at{n} = q % {size};" if n else f"{r}const int64_t at{n} = q;")
                if n:
                    head.append(f"{r}q /= {size};")
        for stage, live in nest.reductions:
            self.reduction(stage, live)
        out = self.out
        self.ind = r
        self.pass_lines.append(f"{r}// the row's result")
        self.column_loop(
            f"for (int64_t c = 0; c < {nest.sizes[-1]}; ++c)", lambda memo: f"{self._out_at()} = ({out.ctype}){self.value(nest.result, self.point, memo)};"
        )
        self.row_lines += self.pass_lines
        body = [*head, *self.row_lines, "  }"]
        # after a tiled nest, in a block of its own: both declare `rows`
        self.k.lines += body if self.tile_rows is None else ["  {", *body, "  }"]


def emit(k: c_reference.Kernel, nest: loopnest.RowNest, plan: loopnest.RowSchedule, *, name: str, constants: list[Any]) -> None:
    """The row-wise nest as C: the knobs into `k.preamble`, the loop over the workgroup's rows
    into `k.lines`. `k` holds the buffers; `constants` are the group's scalar constant ops;
    `name` (the import's) is taken as c_tiled.emit takes it, the kernel being one function here."""
    out = k.buffers[nest.result]
    k.preamble = c_tiled.knob_lines(plan.knobs, out.ctype, None, pack=False)
    k.attributes = "PYREE_WIDE_VECTORS "
    _RowEmitter(k, nest, plan, out).emit(constants)


def emit_after_tiles(
    k: c_reference.Kernel, nest: loopnest.RowNest, plan: loopnest.RowSchedule, *, computed: Any, tile_rows: str, constants: list[Any], store: bool
) -> None:
    """The row-wise nest after a tiled nest (c_tiled.emit, already in `k`) that stored `computed`,
    the value the rows read, into the result's buffer: each workgroup's row passes run over the
    rows its tiles computed (of `tile_rows` rows each), reading `computed` in place and writing
    the result over it, one element where it was read. `store`: a stage may be stored over it
    (softmax's exp, once computed), where no later pass reads `computed` (else emitter.Unfused).
    The knobs this nest adds (PYREE_LANES) go after the tiled nest's in `k.preamble`."""
    out = k.buffers[nest.result]
    # swept after the tile's knobs, at their winner: a sum of variants, not a product
    k.preamble += c_tiled.own_knob_lines([replace(knob, later=True) for knob in plan.knobs])
    row = _RowEmitter(k, nest, plan, out)
    row.in_place, row.tile_rows, row.store_in_place = computed, tile_rows, store
    row.emit(constants)
