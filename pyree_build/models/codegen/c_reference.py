"""C for a replaced group: a correct, naive reference body generated from the group's ops.

Each op, as a linalg.generic (named ops are generalised first), becomes a loop nest over its
iteration space: operands are read through their indexing maps from row-major buffers, the
body's arith/math ops become C expressions, and what it yields is stored. Reductions read
the result buffer as their accumulator, so a fill or any other initial value is copied in
first. Math functions come from small freestanding helpers written here (double-precision
evaluation rounded to the element type), so the same file builds as a system plugin, a
standalone plugin and an embedded object. An op with no C form is refused by name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyree_build.backends.llvm_cpu import plugin_entry
from pyree_build.core import escape
from pyree_build.core.errors import PyreeError
from pyree_build.models.ir import program

C_TYPES = {"f32": "float", "f64": "double", "i1": "int8_t", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "index": "int64_t"}
_UNSIGNED = {"int8_t": "uint8_t", "int16_t": "uint16_t", "int32_t": "uint32_t", "int64_t": "uint64_t"}

_BINARY = {
    "arith.addf": "+", "arith.subf": "-", "arith.mulf": "*", "arith.divf": "/",
    "arith.addi": "+", "arith.subi": "-", "arith.muli": "*", "arith.divsi": "/", "arith.remsi": "%",
    "arith.andi": "&", "arith.ori": "|", "arith.xori": "^",
}  # fmt: skip
CMPF = {
    "oeq": "a == b", "ogt": "a > b", "oge": "a >= b", "olt": "a < b", "ole": "a <= b", "one": "(a < b || a > b)",
    "ord": "(a == a && b == b)", "ueq": "!(a < b || a > b)", "ugt": "!(a <= b)", "uge": "!(a < b)", "ult": "!(a >= b)",
    "ule": "!(a > b)", "une": "a != b", "uno": "(a != a || b != b)", "true": "1", "false": "0",
}  # fmt: skip
CMPI = {"eq": "==", "ne": "!=", "slt": "<", "sle": "<=", "sgt": ">", "sge": ">=", "ult": "<", "ule": "<=", "ugt": ">", "uge": ">="}
_CALLS = {
    "arith.maximumf": "pyree_maximum", "arith.minimumf": "pyree_minimum", "arith.maxnumf": "pyree_maxnum", "arith.minnumf": "pyree_minnum",
    "math.exp": "pyree_exp", "math.exp2": "pyree_exp2", "math.log": "pyree_log", "math.tanh": "pyree_tanh", "math.sqrt": "pyree_sqrt",
    "math.rsqrt": "pyree_rsqrt", "math.erf": "pyree_erf", "math.absf": "pyree_fabs", "math.floor": "pyree_floor", "math.ceil": "pyree_ceil",
    "math.powf": "pyree_pow", "math.log1p": "pyree_log1p", "math.expm1": "pyree_expm1", "math.fpowi": "pyree_powi",
    "math.ipowi": "pyree_ipowi", "math.roundeven": "pyree_roundeven", "math.round": "pyree_round", "math.trunc": "pyree_trunc",
    "arith.maxsi": "pyree_imax", "arith.minsi": "pyree_imin",
}  # fmt: skip
_CASTS = ("arith.extf", "arith.truncf", "arith.sitofp", "arith.fptosi", "arith.index_cast", "arith.extsi", "arith.trunci", "arith.bitcast_never")
_UNSIGNED_CASTS = ("arith.uitofp", "arith.fptoui", "arith.extui", "arith.index_castui")

# Freestanding helpers, evaluated in double and rounded to the caller's type: exp by
# 2^k * e^r with |r| <= ln2/2 (Taylor series to 1e-16), log by frexp-style reduction and an
# atanh series, erf by its Taylor series near 0 and a continued-fraction tail.
HELPERS = {
    "pyree_maximum": "static inline double pyree_maximum(double a, double b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }",
    "pyree_minimum": "static inline double pyree_minimum(double a, double b) { return (a != a || b != b) ? a + b : (a < b ? a : b); }",
    "pyree_maxnum": "static inline double pyree_maxnum(double a, double b) { return a != a ? b : (b != b ? a : (a > b ? a : b)); }",
    "pyree_minnum": "static inline double pyree_minnum(double a, double b) { return a != a ? b : (b != b ? a : (a < b ? a : b)); }",
    # Float forms for loops that vectorize: no conversion to double, no branches, no loops.
    "pyree_maximumf": "static inline float pyree_maximumf(float a, float b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }",
    "pyree_minimumf": "static inline float pyree_minimumf(float a, float b) { return (a != a || b != b) ? a + b : (a < b ? a : b); }",
    # e^x = 2^k e^r, k = round(x log2 e) (by adding 1.5 * 2^23), |r| <= ln2/2 with ln2 in two
    # parts (k times the first is exact), e^r by its Taylor polynomial to r^7 (truncation 5e-9):
    # within 1 ulp of the rounded exact value (checked over [-110, 90], subnormal results included:
    # 2^k is two normal factors, so k reaches 128 and -150).
    "pyree_expf": (
        "static inline float pyree_expf(float x) {\n"
        "  float xc = x < -104.0f ? -104.0f : (x > 88.75f ? 88.75f : x);\n"
        "  float k = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;\n"
        "  float r = (xc - k * 0.693145752f) - k * 1.42860677e-6f;\n"
        "  float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-1f + r * (4.16666679e-2f + r * (8.33333377e-3f\n"
        "      + r * (1.38888892e-3f + r * 1.98412701e-4f))))));\n"
        "  int32_t n = (int32_t)k, h = n >> 1;\n"
        "  union { float f; int32_t i; } a, b;\n  a.i = (h + 127) << 23;\n  b.i = (n - h + 127) << 23;\n"
        "  float y = p * a.f * b.f;\n"
        "  y = x > 88.7228394f ? 1.0f / 0.0f : (x < -104.0f ? 0.0f : y);\n"
        "  return x != x ? x : y;\n}"
    ),
    "pyree_imax": "static inline int64_t pyree_imax(int64_t a, int64_t b) { return a > b ? a : b; }",
    "pyree_imin": "static inline int64_t pyree_imin(int64_t a, int64_t b) { return a < b ? a : b; }",
    "pyree_fabs": "static inline double pyree_fabs(double x) { return x < 0 ? -x : x; }",
    "pyree_floor": "static inline double pyree_floor(double x) {\n  if (!(x > -4.5e15 && x < 4.5e15)) return x;\n  double t = (double)(int64_t)x;\n  return t > x ? t - 1.0 : t;\n}",
    "pyree_ceil": "static inline double pyree_ceil(double x) { return -pyree_floor(-x); }",
    "pyree_trunc": "static inline double pyree_trunc(double x) { return x < 0 ? pyree_ceil(x) : pyree_floor(x); }",
    # Halves away from zero (math.round) and to the even neighbour (math.roundeven: ONNX's Round).
    "pyree_round": "static inline double pyree_round(double x) { return x < 0 ? -pyree_floor(0.5 - x) : pyree_floor(x + 0.5); }",
    "pyree_roundeven": (
        "static inline double pyree_roundeven(double x) {\n"
        "  double r = pyree_floor(x), d = x - r;\n"
        "  if (d > 0.5 || (d == 0.5 && pyree_floor(r * 0.5) * 2.0 != r)) r += 1.0;\n"
        "  return x == 0 ? x : r;\n}"
    ),
    "pyree_scale2": (
        "static inline double pyree_scale2(double x, int k) {\n"
        "  while (k > 1000) { x *= 8.98846567431158e307; k -= 1023; }\n"
        "  while (k < -1000) { x *= 2.2250738585072014e-308; k += 1022; }\n"
        "  union { double d; uint64_t u; } p;\n  p.u = (uint64_t)(k + 1023) << 52;\n  return x * p.d;\n}"
    ),
    "pyree_exp": (
        "static inline double pyree_exp(double x) {\n"
        "  if (x != x) return x;\n  if (x > 709.7) return 1.0 / 0.0;\n  if (x < -745.2) return 0.0;\n"
        "  double k = pyree_floor(x * 1.4426950408889634 + 0.5);\n"
        "  double r = (x - k * 0.6931471803691238) - k * 1.9082149292705877e-10;\n"
        "  double term = 1.0, sum = 1.0;\n"
        "  for (int n = 1; n < 18; ++n) { term *= r / n; sum += term; }\n"
        "  return pyree_scale2(sum, (int)k);\n}"
    ),
    "pyree_exp2": "static inline double pyree_exp2(double x) { return pyree_exp(x * 0.6931471805599453); }",
    "pyree_expm1": (
        "static inline double pyree_expm1(double x) {\n"
        "  if (pyree_fabs(x) > 0.5) return pyree_exp(x) - 1.0;\n"
        "  double term = x, sum = x;\n  for (int n = 2; n < 20; ++n) { term *= x / n; sum += term; }\n  return sum;\n}"
    ),
    "pyree_log": (
        "static inline double pyree_log(double x) {\n"
        "  if (x != x || x < 0) return 0.0 / 0.0;\n  if (x == 0) return -1.0 / 0.0;\n  if (x > 1.7976931348623157e308) return x;\n"
        "  int k = 0;\n  while (x > 1.4142135623730951) { x *= 0.5; ++k; }\n  while (x < 0.7071067811865476) { x *= 2.0; --k; }\n"
        "  double s = (x - 1.0) / (x + 1.0), s2 = s * s, term = s, sum = 0.0;\n"
        "  for (int n = 1; n < 40; n += 2) { sum += term / n; term *= s2; }\n"
        "  return 2.0 * sum + k * 0.6931471805599453;\n}"
    ),
    "pyree_log1p": "static inline double pyree_log1p(double x) { return pyree_fabs(x) < 1e-4 ? x - x * x / 2 + x * x * x / 3 : pyree_log(1.0 + x); }",
    "pyree_tanh": (
        "static inline double pyree_tanh(double x) {\n"
        "  if (x != x) return x;\n  if (x > 20) return 1.0;\n  if (x < -20) return -1.0;\n"
        "  double e = pyree_expm1(2.0 * x);\n  return e / (e + 2.0);\n}"
    ),
    "pyree_sqrt": (
        "static inline double pyree_sqrt(double x) {\n"
        "  if (x != x || x < 0) return 0.0 / 0.0;\n  if (x == 0 || x > 1.7976931348623157e308) return x;\n"
        "  double y = x > 1 ? x : 1.0;\n  for (int n = 0; n < 2000; ++n) {\n"
        "    double next = 0.5 * (y + x / y);\n    if (next >= y) break;\n    y = next;\n  }\n"
        "  return y;\n}"
    ),
    "pyree_rsqrt": "static inline double pyree_rsqrt(double x) { return 1.0 / pyree_sqrt(x); }",
    "pyree_pow": (
        "static inline double pyree_pow(double a, double b) {\n"
        "  if (b == 0) return 1.0;\n  if (b == pyree_floor(b) && pyree_fabs(b) < 64) {\n"
        "    double r = 1.0;\n    for (int n = 0; n < (int)pyree_fabs(b); ++n) r *= a;\n    return b < 0 ? 1.0 / r : r;\n  }\n"
        "  return pyree_exp(b * pyree_log(a));\n}"
    ),
    # A float to an integer power by repeated squaring, as LLVM's powi (math.fpowi: ONNX's Pow
    # with an integer exponent); a negative power is the reciprocal.
    "pyree_powi": (
        "static inline double pyree_powi(double a, int64_t n) {\n"
        "  uint64_t m = n < 0 ? 0 - (uint64_t)n : (uint64_t)n;\n  double r = 1.0;\n"
        "  while (m) {\n    if (m & 1) r *= a;\n    a *= a;\n    m >>= 1;\n  }\n"
        "  return n < 0 ? 1.0 / r : r;\n}"
    ),
    # An integer to an integer power, wrapping as the integer type does (math.ipowi): a
    # negative power is 0 except for bases 1 and -1.
    "pyree_ipowi": (
        "static inline int64_t pyree_ipowi(int64_t a, int64_t n) {\n"
        "  if (n < 0) return a == 1 ? 1 : (a == -1 ? ((n & 1) ? -1 : 1) : 0);\n"
        "  uint64_t r = 1, b = (uint64_t)a;\n"
        "  while (n) {\n    if (n & 1) r *= b;\n    b *= b;\n    n >>= 1;\n  }\n"
        "  return (int64_t)r;\n}"
    ),
    "pyree_erf": (
        "static inline double pyree_erf(double x) {\n"
        "  double ax = pyree_fabs(x), sign = x < 0 ? -1.0 : 1.0;\n"
        "  if (ax < 2.5) {\n"
        "    double term = ax, sum = ax;\n"
        "    for (int n = 1; n < 60; ++n) { term *= -ax * ax / n; sum += term / (2 * n + 1); }\n"
        "    return sign * sum * 1.1283791670955126;\n  }\n"
        "  if (ax > 6) return sign;\n"
        "  double f = 0.0;\n  for (int n = 60; n >= 1; --n) f = (n / 2.0) / (ax + f);\n"
        "  return sign * (1.0 - pyree_exp(-ax * ax) / (ax + f) * 0.5641895835477563);\n}"
    ),
}
_HELPER_NEEDS = {
    "pyree_exp": ("pyree_floor", "pyree_scale2"),
    "pyree_exp2": ("pyree_exp",),
    "pyree_expm1": ("pyree_exp", "pyree_fabs"),
    "pyree_tanh": ("pyree_expm1",),
    "pyree_log1p": ("pyree_log", "pyree_fabs"),
    "pyree_rsqrt": ("pyree_sqrt",),
    "pyree_ceil": ("pyree_floor",),
    "pyree_trunc": ("pyree_floor", "pyree_ceil"),
    "pyree_round": ("pyree_floor",),
    "pyree_roundeven": ("pyree_floor",),
    "pyree_pow": ("pyree_exp", "pyree_log", "pyree_floor", "pyree_fabs"),
    "pyree_erf": ("pyree_exp", "pyree_fabs"),
}


@dataclass
class Buffer:
    """A tensor in C: the pointer it lives behind (None: no data yet, tensor.empty) and its sizes."""

    pointer: str | None
    dims: list[str]
    ctype: str


@dataclass
class Kernel:
    """What the C body is being built from: each tensor's buffer, each scalar's C name."""

    buffers: dict[Any, Buffer] = field(default_factory=dict)
    scalars: dict[Any, str] = field(default_factory=dict)
    helpers: set[str] = field(default_factory=set)
    lines: list[str] = field(default_factory=list)
    preamble: list[str] = field(default_factory=list)  # before the kernel: the schedule's knobs
    counter: int = 0
    # What the body is, for the file's header: an emitter that writes another form says which.
    form: str = "A correct, naive reference: one loop nest per op, as the IR says."

    def fresh(self, stem: str = "v") -> str:
        self.counter += 1
        return f"{stem}{self.counter}"


def refuse(what: str, op_name: str) -> PyreeError:
    return PyreeError(
        f"the group cannot be generated in C: {what}",
        details=f"op: {op_name}",
        fix="choose another group (pyree-build ops lists them), or write this kernel's body yourself from a group the generator accepts",
    )


def c_type(type_: Any, op_name: str = "") -> str:
    name = program.element_type(type_)
    if name not in C_TYPES:
        raise refuse(f"element type {name} has no C type here (f32, f64 and integers do)", op_name or str(type_))
    return C_TYPES[name]


def literal(attr: Any, ctype: str) -> str:
    """A constant as a C literal, exactly (hex floats)."""
    if isinstance(attr, program.ir.FloatAttr):
        value = float(attr.value)
        suffix = "f" if ctype == "float" else ""
        if math.isnan(value):
            return f"(({ctype})(0.0 / 0.0))"
        if math.isinf(value):
            return f"(({ctype})({'-' if value < 0 else ''}1.0 / 0.0))"
        return f"{value.hex()}{suffix}" if value != 0 or math.copysign(1, value) > 0 else f"-0.0{suffix}"
    if isinstance(attr, program.ir.IntegerAttr):
        value = int(attr.value)
        if ctype == "int8_t" and str(attr.type) == "i1":
            value = 1 if value else 0
        return f"(({ctype}){value}LL)" if ctype != "int64_t" or -(2**62) < value < 2**62 else f"(({ctype})({value}LL))"
    raise refuse(f"a constant {attr} that is not a number", "arith.constant")


_AFFINE_TOKEN = re.compile(r"d(\d+)|s\d+|ceildiv")


def affine_c(expr: Any, loops: list[str]) -> str:
    """An affine expression of the loop variables as C (indices are never negative, so
    floordiv and mod are C's / and %)."""
    text = str(expr)
    if _AFFINE_TOKEN.search(text) and ("ceildiv" in text or re.search(r"\bs\d+", text)):
        raise refuse(f"indexing expression {text}", "linalg.generic")
    text = text.replace("floordiv", "/").replace("mod", "%")
    return "(" + re.sub(r"\bd(\d+)\b", lambda m: loops[int(m.group(1))], text) + ")"


def linear_index(results: list[str], dims: list[str]) -> str:
    """Row-major offset of an element, from its coordinates and the tensor's sizes."""
    if not results:
        return "0"
    index = results[0]
    for coordinate, size in zip(results[1:], dims[1:]):
        index = f"({index} * {size} + {coordinate})"
    return index


def _static_dims(type_: Any, op_name: str) -> list[str]:
    dims = program.shape(type_)
    if any(d is None for d in dims):
        raise refuse(f"a dynamic size in {type_} inside the group", op_name)
    return [str(d) for d in dims]


def emit_constant(k: Kernel, op: Any) -> None:
    ctype = c_type(op.results[0].type, op.name)
    name = k.fresh("c")
    k.lines.append(f"  const {ctype} {name} = {literal(op.attributes['value'], ctype)};")
    k.scalars[op.results[0]] = name


def emit_reshape(k: Kernel, op: Any) -> None:
    """A reshape reinterprets its row-major source: inside the group it is the source's
    buffer under new sizes; when its result is one the import must write (the group's
    result), the elements are copied there, since nothing else writes that buffer."""
    source = k.buffers[op.operands[0]]
    written = k.buffers.get(op.results[0])
    if written is None:
        k.buffers[op.results[0]] = Buffer(source.pointer, _static_dims(op.results[0].type, op.name), source.ctype)
        return
    if source.pointer is None:
        raise refuse("a reshape of a tensor nothing writes", op.name)
    k.lines.append(f"  // {op.name}: the result is the source's elements, in the same order")
    k.lines.append(f"  for (int64_t e = 0; e < {_element_count(written.dims)}; ++e) {written.pointer}[e] = {source.pointer}[e];")


def _loop_bounds(k: Kernel, op: Any, maps: list[Any]) -> list[str]:
    bounds = []
    for j in range(maps[0].n_dims):
        found = None
        for operand, amap in zip(op.operands, maps):
            if operand in k.buffers:
                results = [str(e) for e in amap.results]
                if f"d{j}" in results:
                    found = k.buffers[operand].dims[results.index(f"d{j}")]
                    break
        if found is None:
            raise refuse(f"loop d{j} is not the size of any operand's dimension", op.name)
        bounds.append(found)
    return bounds


def _element_count(dims: list[str]) -> str:
    return " * ".join(f"(int64_t){d}" for d in dims) or "1"


def emit_generic(k: Kernel, op: Any, results: list[Buffer]) -> None:
    """One linalg.generic as a loop nest writing its results into `results`."""
    maps = [program.ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
    n_ins = len(op.operands) - len(op.results)
    iterators = [str(it).split("<")[-1].rstrip(">") for it in op.attributes["iterator_types"]]
    names = ", ".join(program.location_names(op.location)) or ", ".join(f"{Path(f).name}:{line}" for f, line in program.location_lines(op.location)[:1]) or "?"
    k.lines.append("  " + escape.c_comment(f"{op.name} ({names}): {', '.join(iterators)}"))
    for k_out, buffer in enumerate(results):
        init = k.buffers.get(op.operands[n_ins + k_out])
        if init is not None and init.pointer is not None:
            k.lines.append(f"  for (int64_t e = 0; e < {_element_count(buffer.dims)}; ++e) {buffer.pointer}[e] = {init.pointer}[e];")
    bounds = _loop_bounds(k, op, maps)
    loops = [f"i{j}" for j in range(len(bounds))]
    indent = "  "
    for loop, bound in zip(loops, bounds):
        k.lines.append(f"{indent}for (int64_t {loop} = 0; {loop} < {bound}; ++{loop}) {{")
        indent += "  "
    body = op.regions[0].blocks[0]
    values: dict[Any, str] = {}
    for n, (operand, arg) in enumerate(zip(op.operands, body.arguments)):
        if not list(arg.uses):
            continue
        values[arg] = _load(k, op, operand, maps[n], loops, indent, results[n - n_ins] if n >= n_ins else None)
    for inner in body.operations:
        emit_body_op(k, inner.operation, values, indent, loops, [(b, maps[n_ins + i]) for i, b in enumerate(results)])
    for _ in loops:
        indent = indent[:-2]
        k.lines.append(f"{indent}}}")


def _load(k: Kernel, op: Any, operand: Any, amap: Any, loops: list[str], indent: str, result: Buffer | None) -> str:
    buffer = result if result is not None else k.buffers.get(operand)
    if buffer is None:
        if operand in k.scalars:
            return k.scalars[operand]
        raise refuse(f"operand {operand.get_name()} is neither a tensor of the group nor a constant", op.name)
    coordinates = [affine_c(e, loops) for e in amap.results]
    name = k.fresh("a")
    k.lines.append(f"{indent}const {buffer.ctype} {name} = {buffer.pointer}[{linear_index(coordinates, buffer.dims)}];")
    return name


def operand(k: Kernel, values: dict[Any, str], value: Any, op_name: str) -> str:
    if value in values:
        return values[value]
    if value in k.scalars:
        return k.scalars[value]
    raise refuse(f"a value from outside the op's body that is not a constant ({value.get_name()})", op_name)


def emit_body_op(k: Kernel, op: Any, values: dict[Any, str], indent: str, loops: list[str], stores: list[tuple[Buffer, Any]]) -> None:
    if op.name == "linalg.yield":
        for (buffer, amap), value in zip(stores, op.operands):
            coordinates = [affine_c(e, loops) for e in amap.results]
            k.lines.append(f"{indent}{buffer.pointer}[{linear_index(coordinates, buffer.dims)}] = ({buffer.ctype}){operand(k, values, value, op.name)};")
        return
    if len(op.results) != 1:
        raise refuse(f"{op.name} has {len(op.results)} results", op.name)
    ctype = c_type(op.results[0].type, op.name)
    expression = _expression(k, op, [operand(k, values, v, op.name) for v in op.operands], loops, ctype)
    name = k.fresh()
    k.lines.append(f"{indent}const {ctype} {name} = ({ctype})({expression});")
    values[op.results[0]] = name


def _helper(k: Kernel, name: str) -> str:
    pending = [name]
    while pending:
        current = pending.pop()
        if current not in k.helpers:
            k.helpers.add(current)
            pending.extend(_HELPER_NEEDS.get(current, ()))
    return name


def _expression(k: Kernel, op: Any, args: list[str], loops: list[str], ctype: str) -> str:
    name = op.name
    if name in _BINARY:
        return f"{args[0]} {_BINARY[name]} {args[1]}"
    if name in _CALLS:
        return f"{_helper(k, _CALLS[name])}({', '.join(args)})"
    if name == "arith.negf":
        return f"-{args[0]}"
    if name == "arith.select":
        return f"{args[0]} ? {args[1]} : {args[2]}"
    if name == "arith.cmpf":
        predicate = str(op.attributes["predicate"]).split(":")[0].strip()
        table = {"0": "false", "1": "oeq", "2": "ogt", "3": "oge", "4": "olt", "5": "ole", "6": "one", "7": "ord",
                 "8": "ueq", "9": "ugt", "10": "uge", "11": "ult", "12": "ule", "13": "une", "14": "uno", "15": "true"}  # fmt: skip
        form = CMPF[table[predicate]]
        return re.sub(r"\b([ab])\b", lambda m: f"({args[0] if m.group(1) == 'a' else args[1]})", form)
    if name == "arith.cmpi":
        number = str(op.attributes["predicate"]).split(":")[0].strip()
        kind = ("eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge")[int(number)]
        if kind.startswith("u"):
            operand_type = c_type(op.operands[0].type, name)
            unsigned = _UNSIGNED.get(operand_type, operand_type)
            return f"({unsigned}){args[0]} {CMPI[kind]} ({unsigned}){args[1]}"
        return f"{args[0]} {CMPI[kind]} {args[1]}"
    if name in _CASTS:
        return args[0]
    if name in _UNSIGNED_CASTS:
        source = c_type(op.operands[0].type, name)
        return f"({_UNSIGNED.get(source, source)}){args[0]}" if name != "arith.fptoui" else f"({_UNSIGNED.get(ctype, ctype)}){args[0]}"
    if name == "arith.constant":
        return literal(op.attributes["value"], ctype)
    if name == "linalg.index":
        return loops[int(program.ir.IntegerAttr(op.attributes["dim"]).value)]
    if name in ("arith.shli", "arith.shrui", "arith.shrsi"):
        return _shift(name, args, ctype)
    if name in ("arith.divui", "arith.remui"):
        unsigned = _UNSIGNED.get(ctype, ctype)
        symbol = {"arith.divui": "/", "arith.remui": "%"}[name]
        return f"({unsigned}){args[0]} {symbol} ({unsigned}){args[1]}"
    if name == "math.fma":
        return f"{args[0]} * {args[1]} + {args[2]}"
    raise refuse(f"{name} has no C form in the generator", name)


def _shift(name: str, args: list[str], ctype: str) -> str:
    """A shift whose amount (read unsigned) reaches the width gives what IREE's code gives
    (ONNX's BitShift expects it): 0, or for an arithmetic right shift the sign. C leaves
    such shifts undefined, and MLIR calls them poison."""
    unsigned = _UNSIGNED.get(ctype, ctype)
    too_far = f"(uint64_t)({unsigned}){args[1]} >= 8 * sizeof({ctype})"
    if name == "arith.shli":
        return f"{too_far} ? 0 : ({ctype})(({unsigned}){args[0]} << ({unsigned}){args[1]})"
    if name == "arith.shrui":
        return f"{too_far} ? 0 : ({ctype})(({unsigned}){args[0]} >> ({unsigned}){args[1]})"
    return f"{too_far} ? ({args[0]} < 0 ? -1 : 0) : {args[0]} >> ({unsigned}){args[1]}"


@dataclass
class Parameter:
    """One field of the argument block: its C declaration and what it is, for the comments."""

    ctype: str
    name: str
    about: str


def parameters(inputs: list[Any], outputs: list[Any], scratch: list[Any], input_names: list[str]) -> list[Parameter]:
    """The import's argument block, in the order the spec's func.call passes it."""
    fields: list[Parameter] = []
    roles = [("in", i, v, f"input {i}: {input_names[i]}") for i, v in enumerate(inputs)]
    roles += [("out", j, v, f"result {j}") for j, v in enumerate(outputs)]
    roles += [("tmp", j, v, "scratch for an intermediate (IREE allocates it)") for j, v in enumerate(scratch)]
    for stem, n, value, about in roles:
        ctype = c_type(value.type)
        const = "const " if stem == "in" else ""
        fields.append(Parameter(f"{const}{ctype}*", f"{stem}{n}", f"{value.type}, {about}"))
        fields.append(Parameter("size_t", f"{stem}{n}_offset", f"offset of {stem}{n} in elements"))
    for i, value in enumerate(inputs):
        for d in range(len(program.shape(value.type))):
            fields.append(Parameter("int32_t", f"in{i}_d{d}", f"size of dimension {d} of in{i}"))
    fields.append(Parameter("int32_t", "workgroup_id", "this call's workgroup: it computes its share of the result"))
    fields.append(Parameter("int32_t", "workgroup_count", "how many workgroups share the work (the spec's workgroups())"))
    return fields


def kernel_body(function: Any, members: list[tuple[int, int]], constants: list[int], empties: list[int], roles: dict[tuple[int, int], Buffer]) -> Kernel:
    """The statements of the kernel for the group whose ops sit at these body indices of the
    generalised `function`; `roles` gives the buffers of inputs, results and scratch."""
    k = Kernel()
    ops = program.body_ops(function)
    for where, buffer in roles.items():
        k.buffers[program.value_at(where, function)] = buffer
    for index in sorted({*constants, *empties, *(m for m, _ in members)}):
        op = ops[index]
        if index in constants:
            emit_constant(k, op)
        elif index in empties:
            k.buffers[op.results[0]] = Buffer(None, _static_dims(op.results[0].type, op.name), c_type(op.results[0].type, op.name))
        elif op.name in ("tensor.expand_shape", "tensor.collapse_shape"):
            emit_reshape(k, op)
        elif op.name == "linalg.generic":
            emit_generic(k, op, [k.buffers[r] for r in op.results])
        else:
            raise refuse(f"{op.name} has no C form in the generator", op.name)
    return k


def helpers_text(k: Kernel) -> list[str]:
    order = list(HELPERS)
    return [HELPERS[name] for name in order if name in k.helpers]


_IMPORT = """
// The plugin's import: IREE passes the argument block above as `params`.
static int {name}_import(void* params, void* context, void* reserved) {{
  (void)context;
  (void)reserved;
  const {name}_args_t* {name}_args = (const {name}_args_t*)params;
  {name}({unpacked});
  return 0;  // non-zero tells the runtime the call failed
}}

"""


def c_file(name: str, fields: list[Parameter], k: Kernel, header: list[str]) -> str:
    """The whole C file: the argument block, the kernel as a plain function (what an embedded
    object links), and the plugin around it (what a system or standalone plugin exports)."""
    width = max(len(f"{f.ctype} {f.name};") for f in fields)
    struct = [f"  {f'{f.ctype} {f.name};':<{width}}  {escape.c_comment(f.about)}" for f in fields]
    # Every buffer is its own allocation (two inputs may be one tensor, only ever read): restrict holds.
    arguments = ",\n    ".join(f"{f.ctype} restrict {f.name}" if f.ctype.endswith("*") else f"{f.ctype} {f.name}" for f in fields)
    pointers = [f"  {f.name} += {f.name}_offset;" for f in fields if f.ctype.endswith("*")]
    lines = [
        *map(escape.c_comment, header),
        "",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "",
        '#include "iree/hal/local/executable_plugin.h"',
        "",
    ]
    lines += ["typedef struct {", *struct, f"}} {name}_args_t;", ""]
    lines += [*helpers_text(k), ""] if k.helpers else []
    lines += [*k.preamble, ""] if k.preamble else []
    lines += [
        "// The kernel: a plain C function. An embedded object is called with these arguments",
        "// directly (hal.import.static); a plugin unpacks them from the argument block below.",
    ]
    lines += [f"void {name}(\n    {arguments}) {{", *pointers, *k.lines, "}"]
    # The block's local is named after the import: a fixed name (`a`) shadowed an import of that name.
    unpacked = ", ".join(f"{name}_args->{f.name}" for f in fields)
    lines += _IMPORT.format(name=name, unpacked=unpacked).splitlines()
    lines += plugin_entry.plugin_entry(name, "generated by pyree-build replace", {name: f"{name}_import"}).splitlines()
    return "\n".join(lines) + "\n"


# A size of a tensor in a replaced group, when sizes are general: the size of dimension k of
# input i ("in", i, k), or a number fixed by the op itself ("const", n, 0).
Dim = tuple[str, int, int]


def dim_c(dim: Dim) -> str:
    return f"in{dim[1]}_d{dim[2]}" if dim[0] == "in" else str(dim[1])


def derive_dims(function: Any, members: list[int], inputs: list[tuple[int, int]]) -> dict[tuple[int, int], list[Dim]]:
    """Every tensor's sizes in terms of the inputs' sizes, through the loops the ops' indexing
    maps bind, repeated until nothing more is learned (a fill's size comes from the op that
    uses it): what general (`--dynamic`) sizes need, in C and in the spec."""
    ops = program.body_ops(function)
    known: dict[Any, list[Dim]] = {}
    for i, where in enumerate(inputs):
        value = program.value_at(where, function)
        known[value] = [("in", i, k) for k in range(len(program.shape(value.type)))]
    generics = []
    for index in members:
        op = ops[index]
        if op.name != "linalg.generic":
            raise refuse(f"{op.name} fixes its sizes in the IR; without --dynamic the group can be replaced", op.name)
        maps = [program.ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
        n_ins = len(op.operands) - len(op.results)
        shaped = [(v, m) for v, m in zip(op.operands, maps) if program.is_tensor(v.type)] + list(zip(op.results, maps[n_ins:]))
        generics.append((op, maps[0].n_dims, shaped))
    while any(_learn(known, n_loops, shaped) for _, n_loops, shaped in generics):
        pass
    for op, _, shaped in generics:
        if any(v not in known for v, _ in shaped):
            raise refuse("a size is given by no input (with --dynamic every size must come from an input)", op.name)
    return {program.position(v, function): dims for v, dims in known.items()}


def _learn(known: dict[Any, list[Dim]], n_loops: int, shaped: list[tuple[Any, Any]]) -> bool:
    """One op: bind its loops from the sizes known, then size what they cover. Whether anything new was learned."""
    bounds: list[Dim | None] = [None] * n_loops
    for value, amap in shaped:
        if value in known:
            for k, expr in enumerate(str(e) for e in amap.results):
                if re.fullmatch(r"d\d+", expr) and bounds[int(expr[1:])] is None:
                    bounds[int(expr[1:])] = known[value][k]
    learned = False
    for value, amap in shaped:
        if value in known:
            continue
        dims = [_result_dim(str(e), bounds) for e in amap.results]
        if all(d is not None for d in dims):
            known[value] = [d for d in dims if d is not None]
            learned = True
    return learned


def _result_dim(expr: str, bounds: list[Dim | None]) -> Dim | None:
    if re.fullmatch(r"d\d+", expr):
        return bounds[int(expr[1:])]
    return ("const", 1, 0) if expr == "0" else None
