"""Matching C and MLIR for one import: `pyree-build new DIR --import NAME --args "in:f32,out:f32"`.

The import's argument block is produced by IREE's compiler from the MLIR declaration and
read by the C function; both are generated here from one list of arguments, so they agree
field for field (see docs/writing-an-import.md for the rules this encodes).

Each argument is a buffer, `in` (read), `out` (a new result) or `inout` (updated in place:
the result is tied to the operand), 1-D (`in:f32`) or N-D (`in:f32[?x?]`), or a `scalar`
(`scalar:f32`), which @run takes as a number and the dispatch passes as a push constant.
The dispatch splits the buffers' outer dimension into tiles, one workgroup each. The import
gets each buffer's base pointer and element offset, then the scalars, then the tile's
outer count and, for N-D buffers, the inner extents.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pyree_build.backends.llvm_cpu import plugin_entry
from pyree_build.core.args import import_name as check_import_name
from pyree_build.core.errors import PyreeError

TILE = 64  # elements per workgroup, 1-D buffers
ROW_TILE = 8  # outer rows per workgroup, N-D buffers
LENGTH = 8  # elements in the generated test, 1-D
TEST_SHAPES = {2: (10, 3), 3: (10, 2, 2), 4: (10, 2, 2, 2)}  # N-D: 10 rows, so two tiles, the second partial
MAX_RANK = 4
MAX_BUFFERS = 8
MAX_SCALARS = 4
BUFFER_KINDS = ("in", "out", "inout")
KINDS = (*BUFFER_KINDS, "scalar")
# No f64: iree-compile demotes f64 to f32 by default, so a `double*` would read floats.
C_TYPES = {"f32": "float", "f16": "_Float16", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t"}
# Scalars reach the dispatch as push constants (IREE packs each into 32-bit words). Checked
# on IREE 3.13 by running: f32, i8, i16, i32 and i64 arrive intact; an f16 scalar passed to
# @run arrives as the integer's bits (2 became 1.19e-07), so it is refused: take an f32.
SCALAR_TYPES = ("f32", "i8", "i16", "i32", "i64")
FLOATS = ("f32", "f16")
_ITEM = re.compile(r"^(?P<kind>[^:\[\]]*):(?P<type>[^:\[\]]*)(?:\[(?P<shape>[^\]]*)\])?$")
SYNTAX = (
    "write --args as a comma-separated list of KIND:TYPE (a 1-D buffer), KIND:TYPE[?x?] (an N-D "
    f"buffer, one ? per dimension, up to {MAX_RANK}) or scalar:STYPE, with KIND in, out or inout, TYPE one of "
    + ", ".join(C_TYPES)
    + " and STYPE one of "
    + ", ".join(SCALAR_TYPES)
    + ', e.g. "in:f32,out:f32", "in:f32,scalar:f32,scalar:f32,out:f32" or "in:f32[?x?],out:f32[?x?]"'
)


@dataclass(frozen=True)
class Arg:
    kind: str
    type: str
    name: str
    rank: int  # 0 for a scalar

    @property
    def c_type(self) -> str:
        return C_TYPES[self.type]

    @property
    def is_buffer(self) -> bool:
        return self.kind != "scalar"

    @property
    def tensor(self) -> str:
        return "tensor<" + "?x" * self.rank + self.type + ">" if self.is_buffer else self.type

    @property
    def memref(self) -> str:
        return "memref<" + "?x" * self.rank + self.type + ">"


def parse_args(name: str, spec: str) -> list[Arg]:
    """Validate the import name and the argument list; name the arguments in0, out0, io0, s0, ..."""
    check_import_name(name)
    args: list[Arg] = []
    counts = dict.fromkeys(KINDS, 0)
    first: tuple[str, int] | None = None  # the first buffer's item and rank: every buffer shares its shape
    for position, item in enumerate((s.strip() for s in spec.split(",")), start=1):
        kind, etype, rank = _parse_item(position, item)
        if kind != "scalar" and first is None:
            first = (f"item {position} '{item}'", rank)
        elif kind != "scalar" and first is not None and rank != first[1]:
            raise PyreeError(
                f"--args item {position} '{item}' is {rank}-D but {first[0]} is {first[1]}-D",
                fix="give every buffer the same shape, e.g. all [?x?]: the generated dispatch tiles one shape",
            )
        prefix = {"in": "in", "out": "out", "inout": "io", "scalar": "s"}[kind]
        args.append(Arg(kind, etype, f"{prefix}{counts[kind]}", rank))
        counts[kind] += 1
    _check_list(args)
    return args


def _parse_item(position: int, item: str) -> tuple[str, str, int]:
    """(kind, type, rank) of one --args item, or an error naming it and what is wrong."""
    where = f"--args item {position} '{item}'"
    match = _ITEM.match(item)
    if not item:
        raise PyreeError(f"--args item {position} is empty", fix=SYNTAX)
    if not match:
        raise PyreeError(f"{where} is not KIND:TYPE", fix=SYNTAX)
    kind, etype, shape = match["kind"], match["type"], match["shape"]
    if kind not in KINDS:
        raise PyreeError(f"{where}: '{kind}' is not a kind (in, out, inout or scalar)", fix=SYNTAX)
    if etype == "f64":
        raise PyreeError(f"{where}: f64 is not supported: iree-compile demotes f64 to f32 by default, so the C side would read floats as doubles", fix=SYNTAX)
    if kind == "scalar":
        if shape is not None:
            raise PyreeError(f"{where}: a scalar has no shape", fix=SYNTAX)
        if etype not in SCALAR_TYPES:
            raise PyreeError(f"{where}: a scalar is one of {', '.join(SCALAR_TYPES)}, not '{etype}' (for f16, take an f32 and convert in C)", fix=SYNTAX)
        return kind, etype, 0
    if etype not in C_TYPES:
        raise PyreeError(f"{where}: '{etype}' is not an element type the generator knows ({', '.join(C_TYPES)})", fix=SYNTAX)
    dims = ["?"] if shape is None else [d.strip() for d in shape.split("x")]
    if any(d != "?" for d in dims):
        raise PyreeError(f"{where}: write each dimension as ?, e.g. [?x?]: the sizes come from the inputs at run time", fix=SYNTAX)
    if len(dims) > MAX_RANK:
        raise PyreeError(f"{where} has {len(dims)} dimensions; the generator makes at most {MAX_RANK}", fix=SYNTAX)
    return kind, etype, len(dims)


def _check_list(args: list[Arg]) -> None:
    """The rules for the whole list: something to compute, not too many."""
    buffers = [a for a in args if a.is_buffer]
    if not any(a.kind in ("out", "inout") for a in args):
        raise PyreeError("--args has no out or inout argument, so the import would compute nothing visible", fix=SYNTAX)
    if len(buffers) > MAX_BUFFERS:
        raise PyreeError(f"--args lists {len(buffers)} buffers; the generator makes at most {MAX_BUFFERS}", fix="start with fewer and add more by hand")
    if len(args) - len(buffers) > MAX_SCALARS:
        raise PyreeError(
            f"--args lists {len(args) - len(buffers)} scalars; the generator makes at most {MAX_SCALARS}", fix="start with fewer and add more by hand"
        )


def rank(args: list[Arg]) -> int:
    return next(a.rank for a in args if a.is_buffer)


def test_shape(args: list[Arg]) -> tuple[int, ...]:
    r = rank(args)
    return (LENGTH,) if r == 1 else TEST_SHAPES[r]


def _scalar_value(k: int) -> int:
    return k + 2


def _buffer_values(k: int, size: int) -> list[int]:
    """Input buffer k's elements: 2 + k, 3 + k, ..., 6 + k, repeating: never 1, so a·x+b and b·x+a differ,
    and rows of 2, 3 or 4 elements differ, so a wrong row offset shows."""
    return [k + 2 + e % 5 for e in range(size)]


def test_data(args: list[Arg]) -> tuple[tuple[int, ...], list[tuple[Arg, list[int]]], list[tuple[Arg, list[int]]]]:
    """(shape, @run's parameters with their values, its results with theirs) for the generated
    test: flat, row-major values; a scalar's list holds its one value.

    Input buffer k (in or inout, in order) holds 2 + k, 3 + k, ...; scalar k is 2 + k.
    The C body computes, per element, the sum of the `in` buffers (1 if none), then `acc * s0 + s1`,
    `acc * s2 + s3`, ... (a·x+b for one in buffer and two scalars); writes it to each `out`
    and adds it to each `inout`. Every value stays an integer below 2048, so f16 and f32
    hold it exactly; integer results wrap to their type as the C casts do.
    """
    shape = test_shape(args)
    size = math.prod(shape)
    params: list[tuple[Arg, list[int]]] = []
    values: dict[str, list[int]] = {}
    scalars: list[int] = []
    for a in (a for a in args if a.kind != "out"):  # @run's parameters, in --args order
        if a.kind == "scalar":
            scalars.append(_scalar_value(len(scalars)))
            params.append((a, [scalars[-1]]))
        else:
            values[a.name] = _buffer_values(len(values), size)
            params.append((a, values[a.name]))
    ins = [a for a in args if a.kind == "in"]
    acc = [sum(values[a.name][e] for a in ins) if ins else 1 for e in range(size)]
    for j in range(0, len(scalars), 2):
        add = scalars[j + 1] if j + 1 < len(scalars) else 0
        acc = [x * scalars[j] + add for x in acc]
    results = []
    for a in (a for a in args if a.kind in ("out", "inout")):
        result = [x + (values[a.name][e] if a.kind == "inout" else 0) for e, x in enumerate(acc)]
        results.append((a, [_wrap(v, a.type) for v in result]))
    return shape, params, results


def test_values(args: list[Arg]) -> tuple[list[str], list[str]]:
    """(--input specs, expected result lines as iree-run-module prints them) for test_data."""
    shape, params, results = test_data(args)
    inputs = [f"{a.type}={v[0]}" if a.kind == "scalar" else f"{_dims(shape)}x{a.type}=" + " ".join(map(str, v)) for a, v in params]
    return inputs, [f"{_dims(shape)}x{a.type}=" + _format(shape, v) for a, v in results]


def python_example(args: list[Arg]) -> tuple[str, str]:
    """(the arguments of a Python call of @run, its first result's .tolist()) for test_data."""
    shape, params, results = test_data(args)
    numpy_types = {"f32": "float32", "f16": "float16", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64"}
    texts = []
    for a, v in params:
        if a.kind == "scalar":
            texts.append(f"{float(v[0])}" if a.type in FLOATS else str(v[0]))
        else:
            reshape = f".reshape{shape}" if len(shape) > 1 else ""
            texts.append(f"np.array({v}, np.{numpy_types[a.type]}){reshape}")
    first, values = results[0]
    flat: list[float] | list[int] = [float(x) for x in values] if first.type in FLOATS else values
    return ", ".join(texts), str(_nest(shape, flat))


def _nest(shape: tuple[int, ...], flat: list[Any]) -> list[Any]:
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_nest(shape[1:], flat[i * step : (i + 1) * step]) for i in range(shape[0])]


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _wrap(value: int, etype: str) -> int:
    """`value` stored as `etype`, as C's cast (through int64_t) does: integers wrap."""
    if etype in FLOATS:
        return value
    bits = int(etype[1:])
    return (value + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


def _format(shape: tuple[int, ...], flat: list[int]) -> str:
    """Values as iree-run-module prints them: `1 2 3` for 1-D, `[1 2][3 4]` nested for N-D."""
    if len(shape) == 1:
        return " ".join(map(str, flat))
    step = len(flat) // shape[0]
    return "".join("[" + _format(shape[1:], flat[i * step : (i + 1) * step]) + "]" for i in range(shape[0]))


def c_source(name: str, args: list[Arg]) -> str:
    """plugin.c: the import `name` with its argument block, and a body the generated test checks."""
    f16 = _F16_HELPERS if any(a.type == "f16" for a in args) else ""
    row_size = "".join(f" * a->dim{d}" for d in range(1, rank(args)))
    head = _C_TEMPLATE.format(name=name, f16_helpers=f16, field_text=_c_fields(args), body_text=_c_body(args), row_size=row_size)
    return head + plugin_entry.plugin_entry(name, f"provides the import {name}", {name: name})


def _c_fields(args: list[Arg]) -> str:
    """The argument block's fields, in call order: each buffer's base pointer and element
    offset, then each scalar, then the tile's outer count and the inner extents."""
    fields = []
    for a in args:
        if a.is_buffer:
            const = "const " if a.kind == "in" else ""
            fields.append(f"  {const}{a.c_type}* {a.name};  // {a.kind} buffer: base pointer (llvm.bareptr)")
            fields.append(f"  size_t {a.name}_offset;  // ... and where this tile starts, in elements")
    fields += [f"  {a.c_type} {a.name};  // scalar operand (a push constant of the dispatch)" for a in args if not a.is_buffer]
    r = rank(args)
    fields.append("  size_t count;  // elements in this tile" if r == 1 else "  size_t count;  // rows (outer dimension) in this tile")
    fields += [f"  size_t dim{d};  // extent of dimension {d} (the same for every buffer)" for d in range(1, r)]
    return "\n".join(fields)


def _c_body(args: list[Arg]) -> str:
    """The placeholder loop body (see test_values)."""
    acc_type = "float" if any(a.type in FLOATS for a in args) else "int64_t"

    def load(expr: str, etype: str) -> str:
        return f"f16_to_f32({expr})" if etype == "f16" else f"({acc_type}){expr}"

    def store(expr: str, etype: str) -> str:
        if etype == "f16":
            return f"f32_to_f16({expr})"
        return f"({C_TYPES[etype]})(int64_t){expr}" if etype not in FLOATS and acc_type == "float" else f"({C_TYPES[etype]}){expr}"

    at = {a.name: f"a->{a.name}[a->{a.name}_offset + i]" for a in args if a.is_buffer}
    total = " + ".join(load(at[a.name], a.type) for a in args if a.kind == "in") or "1"  # 1: no in buffer
    body = [f"    {acc_type} acc = {total};"]
    scalars = [a for a in args if a.kind == "scalar"]
    for j in range(0, len(scalars), 2):
        add = f" + {load('a->' + scalars[j + 1].name, scalars[j + 1].type)}" if j + 1 < len(scalars) else ""
        body.append(f"    acc = acc * {load('a->' + scalars[j].name, scalars[j].type)}{add};")
    for a in args:
        if a.kind == "out":
            body.append(f"    {at[a.name]} = {store('acc', a.type)};")
        elif a.kind == "inout":
            body.append(f"    {at[a.name]} = {store('(' + load(at[a.name], a.type) + ' + acc)', a.type)};")
    return "\n".join(body)


def mlir_source(name: str, args: list[Arg]) -> str:
    """program.mlir: the import's declaration, a dispatch that calls it per tile, and @run."""
    r = rank(args)
    tile = TILE if r == 1 else ROW_TILE
    unit = f"{TILE} elements" if r == 1 else f"{ROW_TILE} rows (outer dimension)"
    return _MLIR_TEMPLATE.format(name=name, TILE=tile, unit=unit, **_mlir_kernel_parts(args), **_mlir_run_parts(args))


def _dim_list(r: int) -> str:
    return ", ".join(f"%d{d}" for d in range(r))


def _mlir_kernel_parts(args: list[Arg]) -> dict[str, str]:
    """The executable's pieces: the import's declaration, the entry's parameters, and the
    views that turn each binding into the base pointer and element offset the import takes."""
    r = rank(args)
    buffers = [a for a in args if a.is_buffer]
    # Entry parameters: the operand buffers in order, then the new (untied) results, then
    # the scalars and sizes. IREE maps !stream.binding parameters to the dispatch's
    # buffers in that order, and the other parameters to its other operands in order.
    binding_order = [*(a for a in buffers if a.kind != "out"), *(a for a in buffers if a.kind == "out")]
    scalars = [a for a in args if not a.is_buffer]
    views = []
    for a in buffers:
        sizes = ", ".join(f"%{a.name}_size{d}" for d in range(r))
        strides = ", ".join(f"%{a.name}_stride{d}" for d in range(r))
        views.append(f"        %{a.name} = stream.binding.subspan %{a.name}_binding[%c0] : !stream.binding -> {a.memref}{{{_dim_list(r)}}}")
        views.append(
            f"        %{a.name}_base, %{a.name}_offset, {sizes}, {strides} = iree_codegen.extract_strided_metadata %{a.name}\n"
            f"            : {a.memref} -> memref<{a.type}>, index, " + ", ".join(["index"] * 2 * r)
        )
        views.append(f"        %{a.name}_at = affine.apply affine_map<()[s0, s1, s2] -> (s0 + s1 * s2)>()[%{a.name}_offset, %begin, %{a.name}_stride0]")
    decl = [*(f"memref<{a.type}>, index" for a in buffers), *(a.type for a in scalars), *(["index"] * r)]
    return {
        "decl": ", ".join(decl),
        "entry_params": ",\n                        ".join(
            [*(f"%{a.name}_binding: !stream.binding" for a in binding_order), *(f"%{a.name}: {a.type}" for a in scalars), *(f"%d{d}: index" for d in range(r))]
        ),
        "views_text": "\n".join(views),
        "call_operands": ", ".join(
            [*(f"%{a.name}_base, %{a.name}_at" for a in buffers), *(f"%{a.name}" for a in scalars), "%count", *(f"%d{d}" for d in range(1, r))]
        ),
    }


def _mlir_run_parts(args: list[Arg]) -> dict[str, str]:
    """@run's pieces: its parameters and results, and the flow.dispatch of the executable."""
    r = rank(args)
    dims = _dim_list(r)
    operands = [a for a in args if a.kind != "out"]  # @run's parameters, in --args order
    first = next((a for a in operands if a.is_buffer), None)
    results = [a for a in args if a.kind in ("out", "inout")]
    dispatch_results = ", ".join(f"%{a.name}{{{dims}}}" if a.kind == "inout" else f"{a.tensor}{{{dims}}}" for a in results)
    if len(results) > 1:
        dispatch_results = f"({dispatch_results})"
    if first:
        size_lines = "".join(f"    %c{d} = arith.constant {d} : index\n    %d{d} = tensor.dim %{first.name}, %c{d} : {first.tensor}\n" for d in range(r))
    else:  # no input buffer to take the sizes from: the test's shape
        size_lines = "".join(f"    %d{d} = arith.constant {n} : index\n" for d, n in enumerate(test_shape(args)))
    return {
        "fn_params": ", ".join(f"%{a.name}: {a.tensor}" for a in operands),
        "result_types": ", ".join(a.tensor for a in results),
        "dispatch_results": dispatch_results,
        "lhs": ", ".join(f"%r_{a.name}" for a in results),
        "size_lines": size_lines,
        "dispatch_operands": ", ".join([*(f"%{a.name}" for a in operands), *(f"%d{d}" for d in range(r))]),
        "dispatch_types": ", ".join([*(f"{a.tensor}{{{dims}}}" if a.is_buffer else a.type for a in operands), *(["index"] * r)]),
    }


# The files' text; str.format fills the {names} ({{ and }} are literal braces).
_C_TEMPLATE = """\
// The import `{name}`, provided by this plugin. Made by `pyree-build new --import`;
// program.mlir declares the same import, and the two must agree field for field
// (docs/writing-an-import.md in pyree_build explains the rules).
//
// The body is a placeholder that the generated test checks: per element, the sum
// of the `in` buffers, times the first scalar plus the second (a*x+b; then times
// the third plus the fourth), written to each `out` buffer and added to each
// `inout` buffer. Replace it with your kernel. It uses no libc, so the plugin also
// builds as a standalone plugin (CMake STANDALONE, `pyree-build plugin --kind standalone`).

#include <stddef.h>
#include <stdint.h>

#include "iree/hal/local/executable_plugin.h"
{f16_helpers}
// The argument block: one field per operand of the `func.call` in program.mlir,
// in call order (buffers, then scalars, then sizes), each with its natural C alignment.
typedef struct {{
{field_text}
}} {name}_args_t;

// Returns 0 on success; anything else makes the dispatch (and the call) fail.
static int {name}(void* params, void* context, void* reserved) {{
  (void)context;
  (void)reserved;
  const {name}_args_t* a = (const {name}_args_t*)params;
  // Buffers are dense and row-major: element i of this tile is at [offset + i].
  for (size_t i = 0; i < a->count{row_size}; ++i) {{
{body_text}
  }}
  return 0;
}}

"""

# Converting _Float16 with a cast makes clang call compiler-rt's __extendhfsf2 and
# __truncsfhf2 on CPUs without f16 instructions (x86_64 and riscv64 baselines), which a
# standalone plugin cannot link; these do it with integer operations instead.
_F16_HELPERS = """
// f16 <-> f32 by bits: a cast would call compiler-rt helpers (__extendhfsf2,
// __truncsfhf2) on x86_64 and riscv64, which a standalone plugin does not have.
static inline float f16_to_f32(_Float16 h) {
  union { _Float16 h; uint16_t u; } in = {.h = h};
  uint32_t sign = (uint32_t)(in.u & 0x8000u) << 16, exp = (in.u >> 10) & 0x1fu, man = in.u & 0x3ffu;
  union { uint32_t u; float f; } out;
  if (exp == 0x1fu) {
    out.u = sign | 0x7f800000u | (man << 13);  // inf, nan
  } else if (exp != 0) {
    out.u = sign | ((exp + 112u) << 23) | (man << 13);  // normal
  } else {
    out.f = (float)man * (1.0f / 16777216.0f);  // zero, subnormal: man * 2^-24
    out.u |= sign;
  }
  return out.f;
}

static inline _Float16 f32_to_f16(float f) {  // round to nearest even
  union { float f; uint32_t u; } in = {.f = f};
  uint32_t sign = (in.u >> 16) & 0x8000u, abs = in.u & 0x7fffffffu;
  uint16_t bits;
  if (abs >= 0x7f800000u) {
    bits = (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));  // inf, nan
  } else if (abs >= 0x477ff000u) {
    bits = (uint16_t)(sign | 0x7c00u);  // rounds past 65504: inf
  } else if (abs < 0x38800000u) {  // below 2^-14: subnormal or zero
    union { uint32_t u; float f; } v = {.u = abs};
    float scaled = v.f * 16777216.0f;  // in units of 2^-24, below 1024
    uint32_t m = (uint32_t)scaled;
    float rest = scaled - (float)m;
    m += (rest > 0.5f || (rest == 0.5f && (m & 1u))) ? 1u : 0u;
    bits = (uint16_t)(sign | m);
  } else {
    uint32_t m = abs - 0x38000000u;  // rebias the exponent (127 -> 15)
    m += 0xfffu + ((m >> 13) & 1u);
    bits = (uint16_t)(sign | (m >> 13));
  }
  union { uint16_t u; _Float16 h; } out = {.u = bits};
  return out.h;
}
"""

_MLIR_TEMPLATE = """\
// Calls the import `{name}` from a dispatch. Made by `pyree-build new --import`;
// plugin.c implements the import with a matching argument block.
//
// @run takes the `in` and `inout` buffers (all of one shape) and the scalars, in the
// order of --args, and returns the `out` buffers and the updated `inout` buffers.

module @{name}_program {{

  stream.executable private @{name}_executable {{
    // One workgroup per {unit}.
    stream.executable.export public @{name}_entry workgroups(%d0: index) -> (index, index, index) {{
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv {TILE})>()[%d0]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }}

    builtin.module {{
      // Provided at run time by a plugin. llvm.bareptr = true passes each memref
      // as one base pointer; the index after it is the element offset. Without
      // it, each memref would become a multi-field descriptor, and the C struct
      // would read garbage. Scalars follow the buffers, then the sizes.
      func.func private @{name}({decl})
          attributes {{llvm.bareptr = true}}

      func.func @{name}_entry({entry_params}) {{
        %c0 = arith.constant 0 : index
        %workgroup = stream.dispatch.workgroup.id[0] : index
        %begin = affine.apply affine_map<()[s0] -> (s0 * {TILE})>()[%workgroup]
        %count = affine.min affine_map<()[s0, s1] -> ({TILE}, s1 - s0)>()[%begin, %d0]
{views_text}
        func.call @{name}({call_operands})
            : ({decl}) -> ()
        return
      }}
    }}
  }}

  func.func @run({fn_params}) -> ({result_types}) {{
{size_lines}    {lhs} = flow.dispatch @{name}_executable::@{name}_entry[%d0]({dispatch_operands})
        : ({dispatch_types}) -> {dispatch_results}
    return {lhs} : {result_types}
  }}
}}
"""
