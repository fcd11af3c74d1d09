"""The C emitter of a loop nest (loopnest.Nest) under its schedule.

The kernel computes the row tiles of its workgroup (`workgroup_id` of `workgroup_count`).
A tile is PYREE_TILE_ROWS rows by PYREE_TILE_COLS columns of the result: its accumulator is
a local array (registers, once the compiler unrolls the constant-sized full tile), set from
the reduction's initial value (a fill's body, inlined), updated at every reduction step in
the IR's order, then passed through the epilogue's stages and stored. Full tiles are
emitted with constant extents so they unroll and vectorize; edge tiles (sizes the tile does
not divide) take the same code with their own extents. The column loop is innermost and
contiguous in the result, marked for the vectorizer; pointers are `restrict`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from pyree_build.models.codegen import c_reference, loopnest
from pyree_build.models.codegen.emitter import NestEmitter, Unfused

# No interleave on the column loop: a full tile is one vector of AVX-512 at 16 columns, and an
# interleaved loop of two vectors would never run (measured: 28 ms against 0.9 ms). The row loop
# is never vectorized: vectorized, it became scatters into the accumulator (clang, -mcpu=native).
# (unroll(full) on it gained nothing and warns for the edge tiles.)
_VECTORIZE = [
    "// Loops marked PYREE_VECTORIZE may be vectorized: their iterations are independent. The rows",
    "// of a tile (PYREE_ROWS) are not: the compiler unrolls them, keeping the accumulator in registers.",
    "#define PYREE_PRAGMA(text) _Pragma(#text)",
    "#if defined(__clang__)",
    "#define PYREE_WIDTH_HINT(n) PYREE_PRAGMA(clang loop vectorize_width(n))",
    "#define PYREE_INTERLEAVE_HINT(n) PYREE_PRAGMA(clang loop interleave_count(n))",
    "#if PYREE_VECTOR_WIDTH > 0",
    "#define PYREE_WIDTH PYREE_WIDTH_HINT(PYREE_VECTOR_WIDTH)",
    "#else",
    "#define PYREE_WIDTH",
    "#endif",
    "#if PYREE_INTERLEAVE > 0",
    "#define PYREE_INTERLEAVING PYREE_INTERLEAVE_HINT(PYREE_INTERLEAVE)",
    "#else",
    "#define PYREE_INTERLEAVING",
    "#endif",
    '#define PYREE_VECTORIZE _Pragma("clang loop vectorize(enable)") PYREE_WIDTH PYREE_INTERLEAVING',
    '#define PYREE_ROWS _Pragma("clang loop vectorize(disable)")',
    "#elif defined(__GNUC__)",
    '#define PYREE_VECTORIZE _Pragma("GCC ivdep")',
    "#define PYREE_ROWS",
    "#else",
    "#define PYREE_VECTORIZE",
    "#define PYREE_ROWS",
    "#endif",
    "// Under AVX-512 the tile's defaults count on 512-bit vectors (32 registers). On some such CPUs (Intel's",
    "// server cores) clang and gcc prefer 256-bit vectors unless a function asks for wider ones, and a tile",
    "// sized for 512 bits then spills its accumulators: the kernel's functions ask (PYREE_WIDE_VECTORS), and",
    "// PYREE_VECTOR_WIDTH's default there names a width. -DPYREE_WIDE_VECTORS= -DPYREE_VECTOR_WIDTH=0",
    "// -DPYREE_INTERLEAVE=0 leave the vectors to the compiler's preference.",
    "#ifndef PYREE_WIDE_VECTORS",
    "#if defined(__AVX512F__) && defined(__clang__)",
    "#define PYREE_WIDE_VECTORS __attribute__((min_vector_width(512)))",
    "#elif defined(__AVX512F__) && defined(__GNUC__)",
    '#define PYREE_WIDE_VECTORS __attribute__((target("prefer-vector-width=512")))',
    "#else",
    "#define PYREE_WIDE_VECTORS",
    "#endif",
    "#endif",
]
# The bytes of every C element type the generator computes in; a 512-bit vector holds 64 of
# them (PYREE_VECTOR_WIDTH's AVX-512 default).
_ELEMENT_BYTES = {"float": 4, "double": 8, **{f"{sign}int{bits}_t": bits // 8 for sign in ("", "u") for bits in (8, 16, 32, 64)}}


def declared_order(knob: loopnest.Knob) -> list[int]:
    """A knob's values as its `pyree-tune:` line lists them: the defaults first. Among variants
    whose times noise cannot tell apart, tune keeps the kernel as written (the variant whose
    plugin is the untuned one, byte for byte: the wide or narrow default where the CPU picks
    it), else the first declared, so a tuned kernel is the untuned one unless another variant is
    clearly faster (declared smallest first, a sweep on a loaded machine chose the smallest
    tiles, up to 1.2x slower than the defaults)."""
    first = [knob.default, *(d for d in (knob.wide_default, knob.narrow_default) if d is not None)]
    return list(dict.fromkeys([*first, *knob.candidates]))


def _default_lines(knob: loopnest.Knob, wide: str | None = None) -> list[str]:
    """The knob's default as the target's vectors decide it: AVX-512, x86-64 without AVX, else.
    `wide`: the AVX-512 default as a C constant expression instead of knob.wide_default."""
    conditions = (("defined(__AVX512F__)", wide or knob.wide_default), ("defined(__x86_64__) && !defined(__AVX__)", knob.narrow_default))
    cases = [(c, v) for c, v in conditions if v is not None]
    if not cases:
        return [f"#define {knob.name} {knob.default}"]
    lines = []
    for k, (condition, value) in enumerate(cases):
        lines += [f"#{'if' if k == 0 else 'elif'} {condition}", f"#define {knob.name} {value}"]
    return [*lines, "#else", f"#define {knob.name} {knob.default}", "#endif"]


def knob_lines(knobs: list[loopnest.Knob], element: str, columns: str | None, *, pack: bool = True, reorder: bool = False) -> list[str]:
    """Each knob as a macro with its default, and the values `pyree-build tune` sweeps when
    given no --param (the `pyree-tune:` line, read by tune.declared_params). `element`: the C
    type the vectorized loops compute in; `columns`: their trip count in a full tile, a C
    constant expression (macros defined by the time the loops are compiled), or None where unknown."""
    lines = [
        "// Schedule knobs: -DNAME=VALUE overrides one; `pyree-build tune` with no --param tries each listed value:",
        "// every combination of the `pyree-tune:` knobs, then each `pyree-tune after:` knob alone at the winner.",
    ]
    lanes = 64 // _ELEMENT_BYTES[element]
    width, interleave = replace(loopnest.VECTOR_WIDTH, wide_default=lanes), loopnest.INTERLEAVE
    wide, steps = None, []
    if columns:
        # Under AVX-512 a full tile's columns are covered by one vector per step (no interleave:
        # 3 x 8 lanes a step over-ran 56 columns), of 512, 256 or 128 bits, whichever takes the
        # fewest steps, a remainder counted as scalar steps: 16 lanes over ResNet-50's 56-column
        # rows left 8 scalar multiply-adds at every reduction step, where 8 lanes leave none.
        by = [f"PYREE_STEPS({columns}, {n})" for n in (lanes, lanes // 2, lanes // 4)]
        wide = f"({by[0]} <= {by[1]} && {by[0]} <= {by[2]} ? {lanes} : {by[1]} <= {by[2]} ? {lanes // 2} : {lanes // 4})"
        steps = ["#define PYREE_STEPS(n, lanes) ((n) / (lanes) + (n) % (lanes))"]
        interleave = replace(loopnest.INTERLEAVE, wide_default=1)
    later = [*([loopnest.ROW_ORDER] if reorder else []), *([loopnest.PACK_K] if pack else []), width, interleave]
    for knob in [*knobs, *later]:
        lines += _declaration(knob, [*(steps if knob is width else []), *_default_lines(knob, wide if knob is width else None)])
    return lines + _VECTORIZE


def _declaration(knob: loopnest.Knob, default: list[str]) -> list[str]:
    """A knob's `pyree-tune:` line (what tune sweeps) and its macro, `default` unless -D sets it."""
    values = ",".join(map(str, declared_order(knob)))
    return [f"// pyree-tune{' after' if knob.later else ''}: {knob.name}={values}  ({knob.about})", f"#ifndef {knob.name}", *default, "#endif"]


def own_knob_lines(knobs: list[loopnest.Knob]) -> list[str]:
    """Knobs a nest emitted after another adds to that one's (which declared the shared ones)."""
    return [line for knob in knobs for line in _declaration(knob, _default_lines(knob))]


_COLUMN = "(col0 + c)"
# Whether a load stepping over the columns by more than one element (a strided convolution's or
# pooling's input row) is packed. Packed, the copy's strided reads are made once for all the
# tile's rows, and the multiply-adds read whole vectors: ResNet-50's 7x7 stride-2 stem alone took
# 0.3x the time read in place (112 columns). Where a row is narrow the loads in place are a few
# scalars the compiler keeps in registers for every row, and the copy only adds: stride-2 3x3
# convolutions of 7 and 14 columns took 1.3x-2.1x as long packed; so does a row whole vectors
# do not cover, whose last columns the copy takes one by one again (SqueezeNet's 3x3 stride-2
# max pool over rows of 55: 1.34x; of 56 in ResNet-50: 0.76x). So the default packs a row of
# 32 columns or more in whole vectors of 8 (measured on an AVX-512 host; tune tries both).
PACK_STRIDED = "PYREE_PACK_STRIDED"


def pack_strided_lines(columns: str) -> list[str]:
    """The knob's declaration: `columns` is a full tile's column count, a C constant expression."""
    return [
        f"// pyree-tune after: {PACK_STRIDED}=1,0  (1: a load stepping over the columns by more than one element is copied into a contiguous panel once for the tile's rows; 0: read in place)",
        f"#ifndef {PACK_STRIDED}",
        f"#define {PACK_STRIDED} ({columns} >= 32 && {columns} % 8 == 0)",
        "#endif",
    ]


@dataclass
class Pack:
    """A load strided along the columns, copied into a contiguous panel once per block of
    reduction steps. `shared`: "" where the load does not move with the tile's rows, else a C
    constant expression, true where every row of the tile reads the same (one panel serves
    all rows; otherwise each row has its own). `contiguous_steps`: the load's address moves by
    one element with the reduction step (a transposed weight), so the copy steps it innermost."""

    ctype: str
    load: str
    panel: str
    shared: str
    contiguous_steps: bool

    def row(self) -> str:
        if not self.shared:
            return ""
        return "[r]" if self.shared == "0" else f"[({self.shared}) ? 0 : r]"

    def rows(self) -> str:
        """How many panels the copy fills: one per row of the tile, or one for all."""
        return "nr" if self.shared == "0" else f"(({self.shared}) ? 1 : nr)"

    def read(self, var: str) -> str:
        panel = f"{self.panel}{self.row()}[{var} - kb][c]"
        # A transposed load is always packed; a stepped one as PYREE_PACK_STRIDED says.
        return panel if self.contiguous_steps else f"({PACK_STRIDED} ? {panel} : {self.load})"


class TiledEmitter(NestEmitter):
    """The nest as C tiles of PYREE_TILE_ROWS x PYREE_TILE_COLS result elements."""

    def __init__(self, k: c_reference.Kernel, nest: loopnest.Nest, plan: loopnest.Schedule, out: c_reference.Buffer) -> None:
        super().__init__(k, nest)
        self.plan, self.out = plan, out
        self.ctype = out.ctype if nest.reduction is None else c_reference.c_type(nest.reduction.result.type, nest.reduction.op.name)
        # While the innermost reduction loop's step is emitted: loads strided along the columns,
        # read from a packed panel instead (see Pack).
        self.packing: str | None = None  # the reduction loop's variable, when packing
        self.packs: list[Pack] = []
        # Whether loads stepping over the columns are packed too: only over a loop of a few
        # steps, whose panels (one per row where the rows differ) stay a few KB of stack.
        self.pack_stepped = False
        # Where an element of the nest's value lands in `out` (a layout epilogue), or None: in place.
        self.relayout: loopnest.Relayout | None = None
        # Where an element of `out` comes from in the nest's value (a nest over the result's
        # space: loopnest.in_result_space), or None: the same point.
        self.gather: loopnest.Relayout | None = None
        # The row coordinates every row of a tile shares, as macros (_shared_row).
        self.shared_rows: list[str] = []
        # A full tile's columns: the column knob, or PYREE_FULL_COLS where a row is narrower (emit).
        self.full_columns = ""
        # A nest emitted after another tiled nest and its row passes, in one kernel (emit_last):
        # its macros and tile function take this suffix, its rows are those of the
        # first nest's tiles that this workgroup computed (`rows_of`: that nest's tile-rows
        # knob), and it reads `stored_before`, the value those passes left in a scratch buffer.
        self.suffix = ""
        self.rows_of: str | None = None
        self.stored_before: Any = None

    def load(self, value: Any, coords: list[str], indent: str) -> str:
        buffer = self.k.buffers.get(value)
        if buffer is None or buffer.pointer is None or (buffer.pointer.startswith(("out", "tmp")) and value != self.stored_before):
            raise Unfused("a value that is neither an input, a constant nor computed by the nest")
        name = self.k.fresh("a")
        self.line(indent, f"const {buffer.ctype} {name} = {self._load(buffer, coords)};")
        return name

    def body_op(self, op: Any, values: dict[Any, str], indent: str, coords: list[str]) -> None:
        c_reference.emit_body_op(self.k, op, values, indent, coords, [])

    def column_parts(self) -> list[str]:
        """Each column loop's coordinate (plan.columns) from the column index: the index itself,
        or where loops are folded into it, its quotient and remainder by the loops inside."""
        flat = "(col0 + c)"
        columns = self.plan.columns or [self.plan.vector_loop]
        if len(columns) == 1:
            return [flat]
        extents = [self.nest.extents[d] or 0 for d in columns]
        parts = []
        for n in range(len(columns)):
            inside = math.prod(extents[n + 1 :])
            quotient = f"{flat} / {inside}" if inside > 1 else flat
            parts.append(f"({quotient} % {extents[n]})" if n > 0 else f"({quotient})")
        return parts

    def index(self, coords: list[str], dims: list[str]) -> str:
        """The row-major offset of an element (loopnest.linear_index), where the folded column
        loops' coordinates are consecutive in `coords` over dimensions of their own extents
        taken as one: the column index itself, contiguous, not its quotients and remainders."""
        parts = self.column_parts()
        extents = [str(self.nest.extents[d]) for d in self.plan.columns]
        m = len(parts)
        for i in range(len(coords) - m + 1) if m > 1 else ():
            if coords[i : i + m] == parts and dims[i + 1 : i + m] == extents[1:]:
                folded = " * ".join([dims[i], *dims[i + 1 : i + m]])
                return loopnest.linear_index([*coords[:i], "(col0 + c)", *coords[i + m :]], [*dims[:i], f"({folded})", *dims[i + m :]])
        return loopnest.linear_index(coords, dims)

    def _load(self, buffer: c_reference.Buffer, coords: list[str]) -> str:
        """A load's expression. In the reduction step, a load whose address moves by more than one
        element from column to column (a transposed weight: B[col][k]; a strided convolution's
        input row: x[..][2 * col + kw]) with the innermost reduction loop reads a panel packed
        before the step, so the column loop stays contiguous and vectorizes."""
        load = f"{buffer.pointer}[{self.index(coords, buffer.dims)}]"
        transposed = any(_COLUMN in coord for coord in coords[:-1])
        stepped = self.pack_stepped and bool(coords) and bool(re.search(rf"{re.escape(_COLUMN)} \* \d", coords[-1]))
        rows = re.findall(r"\bat(\d+)\[([^\]]*)\]", " ".join(coords))
        # A transposed load that moves with the tile's rows stays in place, as before: its panel
        # would be a whole block of steps per row (up to 256 KB of stack at tune's largest knobs).
        transposed = transposed and not rows
        if self.packing is None or not (transposed or stepped) or not re.search(rf"\b{self.packing}\b", " ".join(coords)):
            return load
        # A stepped load that also moves with the tile's rows gets a panel per row, or one for all
        # where the rows share the coordinates it reads (PYREE_SHARED_AT macros, constant per build).
        shared = " && ".join(self._shared_name(n) for n, index in rows if index == f"{self._shared_name(n)} ? 0 : r")
        if rows and (not shared or any(index == "r" for _, index in rows)):
            shared = "0"  # some coordinate always differs from row to row
        for pack in self.packs:
            if pack.load == load:
                return pack.read(self.packing)
        pack = Pack(buffer.ctype, load, f"panel{len(self.packs)}", shared, contiguous_steps=transposed)
        self.packs.append(pack)
        return pack.read(self.packing)

    def emit(self, name: str, fields: list[c_reference.Parameter], constants: list[Any]) -> None:
        """The tile function (into the preamble, after the knobs) and the kernel's loop over its
        workgroup's tiles (into the kernel's body), which calls it with constant sizes for a full
        tile (so it unrolls and vectorizes) and with the edge's sizes otherwise: one body to edit."""
        plan = self.plan
        rows_knob, cols_knob = (knob.name for knob in plan.knobs)
        narrow = self._full_columns(cols_knob)
        cols_knob = f"PYREE_FULL_COLS{self.suffix}" if narrow else cols_knob
        self.full_columns = cols_knob
        passed = [f for f in fields if not f.name.endswith("_offset") and not f.name.startswith("workgroup_")]
        params = ", ".join(f"{f.ctype} restrict {f.name}" if f.ctype.endswith("*") else f"{f.ctype} {f.name}" for f in passed)
        kernel_lines, self.k.lines = self.k.lines, []
        for op in constants:
            c_reference.emit_constant(self.k, op)
        self.tile(rows_knob, cols_knob, "  ")
        tile_lines, self.k.lines = self.k.lines, kernel_lines
        self.k.preamble += [
            "",
            *narrow,
            *(
                ["// Row coordinates a tile's rows all share (the tile never crosses them): read once, not per row.", *self.shared_rows]
                if self.shared_rows
                else []
            ),
            f"// One tile of the result: rows row0 .. row0 + nr - 1 (at most {rows_knob}), columns col0 .. col0 + nc - 1",
            f"// (at most {cols_knob}). A full tile is computed with the knobs' constant sizes (inlined), so it is",
            "// unrolled and vectorized; the result's edge takes the same code with its own sizes.",
            f"static inline __attribute__((always_inline)) PYREE_WIDE_VECTORS void {name}_tile{self.suffix}(\n    {params},\n    int64_t row0, int64_t col0, int64_t nr, int64_t nc) {{",
            *tile_lines,
            "}",
        ]
        call = f"{name}_tile{self.suffix}({', '.join(f.name for f in passed)}, row0, col0"
        self.k.lines += self._workgroup_loop(call, rows_knob, cols_knob)

    def _workgroup_loop(self, call: str, rows_knob: str, cols_knob: str) -> list[str]:
        """The kernel's loop over its workgroup's tiles: its share of the row tiles, or after
        another tiled nest (`rows_of`), the rows of its share of that nest's tiles. `call`: the
        tile function's call up to its last two arguments (the tile's sizes)."""
        nest, plan = self.nest, self.plan
        rows = " * ".join(f"(int64_t){nest.sizes[d]}" for d in plan.row_loops) or "1"
        columns = [
            f"    for (int64_t next = 0; next < cols; next += {cols_knob}) {{",
            "      // Where the row holds a full tile, its last tile ends at the row's edge, overlapping the tile before",
            "      // (whose columns it computes again, alike): a full tile, not an edge tile of variable width.",
            f"      const int64_t col0 = cols - next < {cols_knob} && cols >= {cols_knob} ? cols - {cols_knob} : next;",
            f"      const int64_t nc = cols - col0 < {cols_knob} ? cols - col0 : {cols_knob};",
            f"      if (nr == {rows_knob} && nc == {cols_knob}) {{",
            f"        {call}, {rows_knob}, {cols_knob});",
            "      } else {",
            f"        {call}, nr, nc);",
            "      }",
            "    }",
        ]
        if self.rows_of is None:
            return [
                f"  // One nest ({', '.join(nest.kinds)} loops), in tiles; this workgroup computes its share of the row tiles.",
                f"  const int64_t rows = {rows}, cols = {self._columns()[0]};",
                f"  const int64_t row_tiles = (rows + {rows_knob} - 1) / {rows_knob};",
                "  const int64_t first_tile = row_tiles * workgroup_id / workgroup_count;",
                "  const int64_t end_tile = row_tiles * (workgroup_id + 1) / workgroup_count;",
                "  for (int64_t tile = first_tile; tile < end_tile; ++tile) {",
                f"    const int64_t row0 = tile * {rows_knob};",
                f"    const int64_t nr = rows - row0 < {rows_knob} ? rows - row0 : {rows_knob};",
                *columns,
                "  }",
            ]
        first = self.rows_of
        return [
            "  {",
            f"  // The last nest ({', '.join(nest.kinds)} loops), in tiles, over the rows of this workgroup's tiles of the first,",
            "  // whose row passes it has run: another workgroup's rows may not be computed yet.",
            f"  const int64_t rows = {rows}, cols = {self._columns()[0]};",
            f"  const int64_t first_row = (rows + {first} - 1) / {first} * workgroup_id / workgroup_count * {first};",
            f"  const int64_t tiles_end = (rows + {first} - 1) / {first} * (workgroup_id + 1) / workgroup_count * {first};",
            "  const int64_t end_row = tiles_end < rows ? tiles_end : rows;",
            f"  for (int64_t row0 = first_row; row0 < end_row; row0 += {rows_knob}) {{",
            f"    const int64_t nr = end_row - row0 < {rows_knob} ? end_row - row0 : {rows_knob};",
            *columns,
            "  }",
            "  }",
        ]

    def _row_coordinates(self, fastest_first: list[int], inner: str) -> None:
        """Row r's coordinates at<n>[r] from its flat index q, the row loops `fastest_first` (by
        their place among the row loops) taken off q in that order."""
        for step, n in enumerate(fastest_first):
            size = self.nest.sizes[self.plan.row_loops[n]]
            if step == len(fastest_first) - 1:
                self.line(inner, f"  at{n}[r] = q;")
            else:
                self.line(inner, f"  at{n}[r] = q % {size};")
                self.line(inner, f"  q /= {size};")

    def _full_columns(self, cols_knob: str) -> list[str]:
        """Where the row's width is a number: PYREE_FULL_COLS, the knob or the whole row where it
        is narrower. Such a row is one full tile of its own width, not an edge tile of variable
        width whose accumulator leaves the registers (ResNet-50's 56 columns at AVX-512's 64: its
        3x3 convolution alone took 2.7x IREE's time, 1.0x as one full tile)."""
        _, width, folded = self._columns()
        if width is None:
            return []
        columns = str(width)
        return [
            *folded,
            f"// A full tile's columns: PYREE_TILE_COLS, or the whole row where it is narrower ({columns}).",
            f"#define PYREE_FULL_COLS{self.suffix} ({columns} < {cols_knob} ? {columns} : {cols_knob})",
        ]

    def _columns(self) -> tuple[str, int | None, list[str]]:
        """A row's columns: as the kernel counts them (a C expression: the size its arguments give,
        which a spec matching any sizes passes), as the IR fixes them (None where it does not),
        and, where the result's last loops are folded into them (loopnest._folded_columns: fixed
        sizes only), the comment that says so."""
        nest, plan = self.nest, self.plan
        if len(plan.columns) < 2:
            extent = nest.extents[plan.vector_loop] if nest.extents else None
            return nest.sizes[plan.vector_loop], extent, []
        extents = [nest.extents[d] or 0 for d in plan.columns]
        width = math.prod(extents)
        return (
            str(width),
            width,
            [
                f"// A row is the result's last {len(extents)} dimensions ({' x '.join(map(str, extents))}) as one contiguous loop of",
                f"// {width} columns: every operand reads them contiguously, so a tile's loads and stores are whole vectors.",
            ],
        )

    def _shared_row(self, n: int, rows_knob: str) -> str:
        """A C constant expression, true when every row of a tile has row loop n's coordinate of
        its first row (or "" where that never holds): n is not the tile's fastest row loop and the
        tile's rows divide that loop's extent, so a tile (starting at a multiple of its rows) never
        crosses it. Its loads are then the same for every row of the tile, and the compiler
        loads once what it reloaded per row (a batched matmul's right-hand side, a convolution's
        input row for every output channel of the tile)."""
        plan, nest = self.plan, self.nest
        orders: list[tuple[str | None, int]] = [(None, len(plan.row_loops) - 1)]
        if plan.reuse_order is not None:
            orders = [(f"{loopnest.ROW_ORDER.name}", plan.row_loops.index(plan.reuse_order[0])), (f"!{loopnest.ROW_ORDER.name}", orders[0][1])]
        cases = []
        for condition, fastest in orders:
            extent = nest.extents[plan.row_loops[fastest]] if nest.extents else None
            if fastest == n or extent is None:
                continue
            divides = f"{extent} % {rows_knob} == 0"
            cases.append(f"({condition} && {divides})" if condition else divides)
        return f"({' || '.join(cases)})" if cases else ""

    def _shared_name(self, n: int | str) -> str:
        return f"PYREE_SHARED_AT{n}{self.suffix}"

    def tile(self, rows_knob: str, cols_knob: str, indent: str) -> None:
        nest, plan = self.nest, self.plan
        loops = ["0"] * len(nest.sizes)
        for n, d in enumerate(plan.row_loops):
            shared = self._shared_row(n, rows_knob)
            if shared:
                self.shared_rows.append(f"#define {self._shared_name(n)} {shared}")
            loops[d] = f"at{n}[{self._shared_name(n)} ? 0 : r]" if shared else f"at{n}[r]"
        for d, part in zip(plan.columns or [plan.vector_loop], self.column_parts()):
            loops[d] = part
        for d in plan.reduction_loops:
            loops[d] = f"k{d}"
        at = [loops[d] for d in nest.result_loops]
        inner = indent
        if plan.row_loops:
            self.line(inner, f"int64_t {', '.join(f'at{n}[{rows_knob}]' for n in range(len(plan.row_loops)))};")
            self.line(inner, "for (int64_t r = 0; r < nr; ++r) {")
            self.line(inner, "  int64_t q = row0 + r;")
            if plan.reuse_order is None:
                self._row_coordinates(list(reversed(range(len(plan.row_loops)))), inner)
            else:
                self.line("", f"#if {loopnest.ROW_ORDER.name}")
                self._row_coordinates([plan.row_loops.index(d) for d in plan.reuse_order], inner)
                self.line("", "#else")
                self._row_coordinates(list(reversed(range(len(plan.row_loops)))), inner)
                self.line("", "#endif")
            self.line(inner, "}")
        reduction = nest.reduction
        if reduction is not None:
            self.line(inner, f"{self.ctype} acc[{rows_knob}][{cols_knob}];")
            init = reduction.op.operands[reduction.n_ins]
            self._over_tile(rows_knob, inner, lambda body: f"acc[r][c] = {self.value(init, at, body, {}, None, at)};")
            *outer, innermost = plan.reduction_loops
            for d in outer:
                self.line(inner, f"for (int64_t k{d} = 0; k{d} < {nest.sizes[d]}; ++k{d}) {{")
                inner += "  "
            self._packed_step(reduction, loops, at, innermost, cols_knob, inner, blocked=not outer)
            for _ in outer:
                inner = inner[:-2]
                self.line(inner, "}")
        acc = "acc[r][c]" if reduction is not None else None
        out = self.out
        where = self.relayout(at) if self.relayout is not None else at
        point = self.gather(at) if self.gather is not None else at
        store = f"{out.pointer}[{self.index(where, out.dims)}]"
        self._over_tile(rows_knob, inner, lambda body: f"{store} = ({out.ctype}){self.value(nest.result, point, body, {}, acc, point)};")

    def _packed_step(self, reduction: loopnest.Stage, loops: list[str], at: list[str], d: int, cols_knob: str, indent: str, *, blocked: bool) -> None:
        """The innermost reduction loop's steps, in blocks of PYREE_PACK_K (the IR's order kept):
        each block first copies the strided loads' panels (block steps x columns) contiguously.
        With no strided load, the plain loop; `blocked`: in blocks even so (the one reduction
        loop of a matmul, whose knobs always declare PYREE_PACK_K)."""
        rows_knob = self.plan.knobs[0].name
        var, size = f"k{d}", self.nest.sizes[d]
        # A window's loop shorter than any block (a convolution's kernel width) is one block of
        # constant length, so its steps unroll; a longer one, or a matmul's reduction, goes in
        # blocks of PYREE_PACK_K steps.
        whole = not blocked and str(size).isdigit() and int(size) <= min(loopnest.PACK_K.candidates)
        step_lines, self.k.lines = self.k.lines, []
        self.packing, self.packs, self.pack_stepped = var, [], whole
        body = indent + "    "
        self._over_tile(rows_knob, body, lambda inner: f"acc[r][c] = {self.stage(reduction, loops, inner, {}, None, at, out_arg='acc[r][c]')};")
        self.packing = None
        step, self.k.lines = self.k.lines, step_lines
        if not blocked and not self.packs:
            self.line(indent, f"for (int64_t {var} = 0; {var} < {size}; ++{var}) {{")
            self.k.lines += [line[2:] for line in step]
            self.line(indent, "}")
            return
        steps = str(size) if whole else "PYREE_PACK_K"
        if whole:
            self.line(indent, f"{{  // the loop's {size} steps in one block")
            self.line(indent, f"  const int64_t kb = 0, kn = {size};")
        else:
            self.line(indent, f"for (int64_t kb = 0; kb < {size}; kb += PYREE_PACK_K) {{")
            self.line(indent, f"  const int64_t kn = {size} - kb < PYREE_PACK_K ? {size} - kb : PYREE_PACK_K;")
        for pack in self.packs:
            self._copy(pack, var, rows_knob, steps, cols_knob, indent + "  ")
        self.line(indent, f"  for (int64_t {var} = kb; {var} < kb + kn; ++{var}) {{")
        self.k.lines += step
        self.line(indent, "  }")
        self.line(indent, "}")

    def _copy(self, pack: Pack, var: str, rows_knob: str, steps: str, cols_knob: str, indent: str) -> None:
        """A pack's panel declared and filled for the block's steps kb .. kb + kn - 1."""
        rows = f"[{rows_knob}]" if pack.shared else ""
        self.line(indent, f"{pack.ctype} {pack.panel}{rows}[{steps}][{cols_knob}];  // strided along the columns: packed once a block")
        loops, copy = [], f"{pack.panel}{pack.row()}[{var} - kb][c] = {pack.load};"
        if not pack.contiguous_steps:
            loops.append(f"if ({PACK_STRIDED}) {{")
        if pack.shared:
            loops.append(f"for (int64_t r = 0; r < {pack.rows()}; ++r) {{")
        loop_k = f"for (int64_t {var} = kb; {var} < kb + kn; ++{var})"
        if pack.contiguous_steps:  # the load's address moves by one element with the step
            loops.append("for (int64_t c = 0; c < nc; ++c) {")
            body = [f"{loop_k} {copy}"]
        else:
            loops.append(f"{loop_k} {{")
            body = ["PYREE_VECTORIZE", f"for (int64_t c = 0; c < nc; ++c) {copy}"]
        for depth, text in enumerate(loops):
            self.line(indent + "  " * depth, text)
        for text in body:
            self.line(indent + "  " * len(loops), text)
        for depth in reversed(range(len(loops))):
            self.line(indent + "  " * depth, "}")

    def _over_tile(self, rows_knob: str, indent: str, statement: Any) -> None:
        # The row loop runs to the knob, a constant, so it unrolls; an edge tile leaves early.
        self.line(indent, "PYREE_ROWS")
        self.line(indent, f"for (int64_t r = 0; r < {rows_knob}; ++r) {{")
        self.line(indent, "  if (r >= nr) break;")
        self.line(indent, "  PYREE_VECTORIZE")
        self.line(indent, "  for (int64_t c = 0; c < nc; ++c) {")
        body = indent + "    "
        text = statement(body)  # emits the loads and scalar ops the statement needs first
        self.line(body, text)
        self.line(indent, "  }")
        self.line(indent, "}")


def emit(k: c_reference.Kernel, nest: loopnest.Nest, plan: loopnest.Schedule, *, name: str, fields: list[c_reference.Parameter], constants: list[Any],
         out: c_reference.Buffer | None = None, relayout: loopnest.Relayout | None = None, gather: loopnest.Relayout | None = None) -> None:  # fmt: skip
    """The nest as C: the knobs and the tile function into `k.preamble`, the loop over the
    workgroup's tiles into `k.lines`. `k` holds the buffers; `constants` are the group's
    scalar constant ops, defined in the tile function; `fields` the kernel's arguments.
    `out` and `relayout`: the group's result where the nest's value is stored moved
    (loopnest.peel_layout); by default the nest's own result, element for element. `gather`:
    the nest is over `out`'s space and each element is computed where it came from."""
    k.preamble = []
    tiled = TiledEmitter(k, nest, plan, out if out is not None else k.buffers[nest.result])
    tiled.relayout, tiled.gather = relayout, gather
    tiled.emit(name, fields, constants)  # appends the tile function
    packed = any("PYREE_PACK_K" in line for line in [*k.preamble, *k.lines])
    stepped = any(PACK_STRIDED in line for line in k.preamble)
    knobs = knob_lines(plan.knobs, tiled.ctype, tiled.full_columns, pack=packed, reorder=plan.reuse_order is not None)
    k.preamble = [*knobs, *(pack_strided_lines(tiled.full_columns) if stepped else []), *k.preamble]
    k.attributes = "PYREE_WIDE_VECTORS "


LAST_NEST = "_2"  # the suffix of the macros and tile function of a kernel's second tiled nest


def emit_last(k: c_reference.Kernel, nest: loopnest.Nest, plan: loopnest.Schedule, *, name: str, fields: list[c_reference.Parameter], constants: list[Any],
              out: c_reference.Buffer, rows_of: str, reads: Any, relayout: loopnest.Relayout | None = None) -> None:  # fmt: skip
    """A tiled nest after a tiled nest (`emit`, whose tile-rows knob is `rows_of`) and its row
    passes (c_rows.emit_after_tiles), in the same kernel: each workgroup computes the rows that
    its tiles of the first nest computed, reading `reads`, the value the passes left in a scratch
    buffer, at those rows only (the caller checks that), and storing into `out` (moved by
    `relayout`, as `emit` does). Its knobs are its own (PYREE_TILE_ROWS_2, ...), swept after the
    first nest's; the knobs both nests share are declared once."""
    plan = replace(plan, knobs=[replace(knob, name=knob.name + LAST_NEST, later=True) for knob in plan.knobs], reuse_order=None)
    before, k.preamble = k.preamble, []
    tiled = TiledEmitter(k, nest, plan, out)
    tiled.suffix, tiled.rows_of, tiled.stored_before, tiled.relayout = LAST_NEST, rows_of, reads, relayout
    tiled.emit(name, fields, constants)
    declared = "\n".join(before)
    shared = []
    if "PYREE_PACK_K" in "\n".join([*k.preamble, *k.lines]) and f"#ifndef {loopnest.PACK_K.name}" not in declared:
        shared += _declaration(loopnest.PACK_K, _default_lines(loopnest.PACK_K))
    if any(PACK_STRIDED in line for line in k.preamble) and f"#ifndef {PACK_STRIDED}" not in declared:
        shared += pack_strided_lines(tiled.full_columns)
    k.preamble = [*before, *own_knob_lines(plan.knobs), *shared, *k.preamble]
