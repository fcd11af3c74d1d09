"""GLSL compute shaders (Vulkan) from the GPU emitter: GLSL's types, constructors, built-ins and
helper functions (`GlslForms`), its buffer types, and the shader file around the element loop.

Element types GLSL cannot hold are refused. It holds f32 and i32 in core Vulkan; i8, i16, i64
and i1 (stored as a byte, as IREE stores it) through GL_EXT_shader_explicit_arithmetic_types
and 8/16-bit storage, declared only in a shader that uses them, so the device needs those
features (lavapipe has them: checked on ONNX's Where, Greater, Not, Max int64 and Add uint8
node tests). f16 (wrong on lavapipe in an attention test, not yet understood), f64, bf16 and f8
types are refused, and so is a tensor of 2^31 elements or more (GLSL indexes with 32-bit ints).
"""

from __future__ import annotations

import re
import struct
from typing import Any

from pyree_build.core import escape
from pyree_build.models.codegen import c_reference
from pyree_build.models.codegen.gpu_emitter import WORKGROUP_SIZE, Binding, GpuEmitter, Parts, knob_lines, refuse
from pyree_build.models.ir import program

# Types beyond f32 and i32 need GL_EXT_shader_explicit_arithmetic_types (and 8/16-bit storage
# for buffers), so the device's shaderInt8/Int16/Int64/Float16 and 8/16-bit storage features.
# f16 is not generated: f16 kernels gave wrong results on lavapipe in ONNX's attention test with
# an f16 mask (onnx_conformance --target vulkan), not yet understood.
_GLSL_TYPES = {"f32": "float", "i32": "int", "i1": "bool", "index": "int", "i8": "int8_t", "i16": "int16_t", "i64": "int64_t"}
# IREE stores i1 as one byte an element.
_GLSL_BUFFER_TYPES = {"f32": "float", "i32": "int", "i8": "int8_t", "i16": "int16_t", "i64": "int64_t", "i1": "int8_t"}
_GLSL_UNSIGNED = {"i1": "uint", "i8": "uint8_t", "i16": "uint16_t", "i32": "uint", "i64": "uint64_t", "index": "uint"}
_GLSL_EXTENSIONS = [
    "// 8-, 16- and 64-bit types: the device needs their features (shaderInt8, storageBuffer8BitAccess, ...).",
    "#extension GL_EXT_shader_explicit_arithmetic_types : require",
    "#extension GL_EXT_shader_8bit_storage : require",
    "#extension GL_EXT_shader_16bit_storage : require",
]


def glsl_type(type_: Any, op_name: str = "") -> str:
    name = program.element_type(type_)
    if name not in _GLSL_TYPES:
        raise refuse("vulkan", f"element type {name} has no GLSL type here (f32, i64, i32, i16, i8 and i1 do)", op_name or str(type_))
    return _GLSL_TYPES[name]


def buffer_type(target: str, value: Any) -> str:
    """The GLSL type of a buffer of `value`'s elements, or a refusal for `target`."""
    element = program.element_type(value.type)
    if element not in _GLSL_BUFFER_TYPES:
        raise refuse(target, f"a tensor of {element} ({value.type}): GLSL buffers here hold f32, i64, i32, i16, i8 and i1")
    return _GLSL_BUFFER_TYPES[element]


class GlslForms(GpuEmitter):
    """GLSL (Vulkan): its types, constructors and built-ins, buffers as blocks (`.v[i]`), i1 stored as a byte."""

    def scalar_type(self, type_: Any, op_name: str = "") -> str:
        return glsl_type(type_, op_name)

    def declare(self, ctype: str, name: str, expression: str) -> str:
        return f"{ctype} {name} = {expression};"

    def literal(self, attr: Any, ctype: str) -> str:
        return _glsl_literal(attr, ctype)

    def element_load(self, buffer: c_reference.Buffer, index: str, value: Any, name: str) -> str:
        load = f"{buffer.pointer}.v[{index}]"
        if program.element_type(value.type) == "i1":
            return f"bool {name} = ({load} != int8_t(0));"  # stored as a byte
        return self.declare(buffer.ctype, name, load)

    def element_store(self, result: str, index: str) -> str:
        stored = f"({result} ? 1 : 0)" if program.element_type(self.nest.result.type) == "i1" else result
        return f"out0.v[{index}] = {self.out.ctype}({stored});"

    def body_op(self, op: Any, values: dict[Any, str], indent: str, coords: list[str]) -> None:
        self.glsl_op(op, values, indent, coords)

    def glsl_op(self, op: Any, values: dict[Any, str], indent: str, coords: list[str]) -> None:
        if len(op.results) != 1:
            raise refuse(self.target, f"{op.name} has {len(op.results)} results", op.name)
        gtype = glsl_type(op.results[0].type, op.name)
        args = [c_reference.operand(self.k, values, v, op.name) for v in op.operands]
        name = self.k.fresh()
        self.line(indent, f"{gtype} {name} = {self.glsl_expression(op, args, coords, gtype)};")
        values[op.results[0]] = name

    def glsl_expression(self, op: Any, args: list[str], coords: list[str], gtype: str) -> str:
        name = op.name
        operand_types = [program.element_type(v.type) for v in op.operands]
        if name in _GLSL_BINARY:
            symbol = _GLSL_BINARY[name]
            if operand_types[0] == "i1":
                symbol = {"&": "&&", "|": "||", "^": "^^"}.get(symbol, "")
                if not symbol:
                    raise refuse(self.target, f"{name} on i1", name)
            return f"({args[0]} {symbol} {args[1]})"
        if name in _GLSL_CALLS:
            function = _GLSL_CALLS[name]
            if function.startswith("pyree_"):
                self._helper(function)
            if name == "math.fpowi":  # the exponent may be any integer type; the helper takes an int
                args = [args[0], f"int({args[1]})"]
            if function.startswith("pyree_") and gtype == "float16_t":  # the helpers compute in f32
                args = [f"float({a})" if program.element_type(v.type) == "f16" else a for a, v in zip(args, op.operands)]
                return f"float16_t({function}({', '.join(args)}))"
            return f"{function}({', '.join(args)})"
        if name == "arith.negf":
            return f"(-{args[0]})"
        if name == "arith.select":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        if name == "arith.cmpf":
            return _glsl_cmpf(op, args)
        if name == "arith.cmpi":
            number = int(str(op.attributes["predicate"]).split(":")[0].strip())
            kind = ("eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge")[number]
            if kind.startswith("u"):
                unsigned = _GLSL_UNSIGNED[operand_types[0]]
                return f"({unsigned}({args[0]}) {c_reference.CMPI[kind]} {unsigned}({args[1]}))"
            return f"({args[0]} {c_reference.CMPI[kind]} {args[1]})"
        if name in ("arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast", "arith.index_castui", "arith.sitofp", "arith.fptosi"):
            if operand_types[0] == "i1" and name == "arith.extsi":
                return f"{gtype}({args[0]} ? -1 : 0)"
            if gtype == "bool":
                return f"((int({args[0]}) & 1) != 0)"
            if gtype == "int64_t" and operand_types[0] in ("i8", "i16", "i32", "index"):
                return _glsl_widen(args[0], operand_types[0], unsigned=name in ("arith.extui", "arith.index_castui"))
            return f"{gtype}({args[0]})"
        if name in ("arith.extf", "arith.truncf"):
            return f"{gtype}({args[0]})"
        if name == "arith.uitofp":
            return f"{gtype}({_GLSL_UNSIGNED[operand_types[0]]}({args[0]}))" if operand_types[0] != "i1" else f"{gtype}({args[0]})"
        if name == "arith.fptoui":
            return f"{gtype}({_GLSL_UNSIGNED[program.element_type(op.results[0].type)]}({args[0]}))"
        if name == "arith.constant":
            return _glsl_literal(op.attributes["value"], gtype)
        if name == "linalg.index":
            return coords[int(program.ir.IntegerAttr(op.attributes["dim"]).value)]
        if name in ("arith.divui", "arith.remui"):
            symbol = {"arith.divui": "/", "arith.remui": "%"}[name]
            unsigned = _GLSL_UNSIGNED[operand_types[0]]
            return f"{gtype}({unsigned}({args[0]}) {symbol} {unsigned}({args[1]}))"
        if name == "math.fma":
            return f"({args[0]} * {args[1]} + {args[2]})"
        raise refuse(self.target, f"{name} has no GLSL form in the generator", name)

    def _helper(self, name: str) -> None:
        pending = [name]
        while pending:
            current = pending.pop()
            if current not in self.glsl_helpers:
                self.glsl_helpers.add(current)
                pending.extend(_GLSL_HELPER_NEEDS.get(current, ()))


_GLSL_BINARY = {
    "arith.addf": "+", "arith.subf": "-", "arith.mulf": "*", "arith.divf": "/",
    "arith.addi": "+", "arith.subi": "-", "arith.muli": "*", "arith.divsi": "/", "arith.remsi": "%",
    "arith.andi": "&", "arith.ori": "|", "arith.xori": "^",
}  # fmt: skip
_GLSL_CALLS = {
    "arith.maximumf": "pyree_maximum", "arith.minimumf": "pyree_minimum", "arith.maxnumf": "pyree_maxnum", "arith.minnumf": "pyree_minnum",
    "math.exp": "exp", "math.exp2": "exp2", "math.log": "log", "math.tanh": "pyree_tanh", "math.sqrt": "sqrt",
    "math.rsqrt": "inversesqrt", "math.erf": "pyree_erf", "math.absf": "abs", "math.floor": "floor", "math.ceil": "ceil",
    "math.powf": "pyree_pow", "math.log1p": "pyree_log1p", "math.expm1": "pyree_expm1", "math.roundeven": "roundEven",
    "math.round": "pyree_round", "math.trunc": "trunc", "arith.maxsi": "max", "arith.minsi": "min", "math.fpowi": "pyree_powi",
}  # fmt: skip
# GLSL's builtins where they are exact enough; helpers where a builtin is missing (erf), leaves
# NaN handling to the implementation (max/min), or loses precision (tanh near 0 through exp).
_GLSL_HELPERS = {
    "pyree_maximum": "float pyree_maximum(float a, float b) { return (isnan(a) || isnan(b)) ? a + b : max(a, b); }",
    "pyree_minimum": "float pyree_minimum(float a, float b) { return (isnan(a) || isnan(b)) ? a + b : min(a, b); }",
    "pyree_maxnum": "float pyree_maxnum(float a, float b) { return isnan(a) ? b : (isnan(b) ? a : max(a, b)); }",
    "pyree_minnum": "float pyree_minnum(float a, float b) { return isnan(a) ? b : (isnan(b) ? a : min(a, b)); }",
    "pyree_expm1": (
        "float pyree_expm1(float x) {\n"
        "  if (abs(x) > 0.5) return exp(x) - 1.0;\n"
        "  float term = x, sum = x;\n  for (int n = 2; n < 12; ++n) { term *= x / float(n); sum += term; }\n  return sum;\n}"
    ),
    "pyree_tanh": (
        "float pyree_tanh(float x) {\n"
        "  if (isnan(x)) return x;\n  if (x > 10.0) return 1.0;\n  if (x < -10.0) return -1.0;\n"
        "  float e = pyree_expm1(2.0 * x);\n  return e / (e + 2.0);\n}"
    ),
    "pyree_log1p": "float pyree_log1p(float x) { return abs(x) < 1e-4 ? x - x * x / 2.0 + x * x * x / 3.0 : log(1.0 + x); }",
    "pyree_round": "float pyree_round(float x) { return x < 0.0 ? -floor(0.5 - x) : floor(x + 0.5); }",
    "pyree_powi": (
        "float pyree_powi(float a, int n) {\n"
        "  uint m = n < 0 ? uint(-n) : uint(n);\n  float r = 1.0;\n"
        "  while (m != 0u) {\n    if ((m & 1u) != 0u) r *= a;\n    a *= a;\n    m >>= 1;\n  }\n"
        "  return n < 0 ? 1.0 / r : r;\n}"
    ),
    "pyree_pow": (
        "float pyree_pow(float a, float b) {\n"
        "  if (b == 0.0) return 1.0;\n"
        "  if (b == floor(b) && abs(b) < 64.0) return pyree_powi(a, int(b));\n"
        "  return a < 0.0 ? uintBitsToFloat(0x7fc00000u) : exp(b * log(a));\n}"
    ),
    "pyree_erf": (
        "float pyree_erf(float x) {\n"
        "  float ax = abs(x);\n"
        "  if (ax < 2.5) {\n"
        "    float term = ax, sum = ax;\n"
        "    for (int n = 1; n < 40; ++n) { term *= -ax * ax / float(n); sum += term / float(2 * n + 1); }\n"
        "    return sign(x) * sum * 1.1283791670955126;\n  }\n"
        "  if (ax > 6.0) return sign(x);\n"
        "  float f = 0.0;\n  for (int n = 60; n >= 1; --n) f = (float(n) / 2.0) / (ax + f);\n"
        "  return sign(x) * (1.0 - exp(-ax * ax) / (ax + f) * 0.5641895835477563);\n}"
    ),
}
_GLSL_HELPER_NEEDS = {"pyree_tanh": ("pyree_expm1",), "pyree_pow": ("pyree_powi",)}


def _glsl_cmpf(op: Any, args: list[str]) -> str:
    predicate = str(op.attributes["predicate"]).split(":")[0].strip()
    table = {"0": "false", "1": "oeq", "2": "ogt", "3": "oge", "4": "olt", "5": "ole", "6": "one", "7": "ord",
             "8": "ueq", "9": "ugt", "10": "uge", "11": "ult", "12": "ule", "13": "une", "14": "uno", "15": "true"}  # fmt: skip
    form = table[predicate]
    if form in ("true", "false"):
        return form
    a, b = f"({args[0]})", f"({args[1]})"
    # NaN tests by isnan, not x != x: a shader compiler may assume x == x.
    if form in ("ord", "uno"):
        return f"(!isnan{a} && !isnan{b})" if form == "ord" else f"(isnan{a} || isnan{b})"
    return "(" + c_reference.CMPF[form].replace("a", "\0").replace("b", b).replace("\0", a) + ")"


def _glsl_widen(value: str, element: str, *, unsigned: bool) -> str:
    """A 32-bit-or-narrower integer as int64_t, from its two halves: lavapipe (Mesa, LLVM 15)
    computed int64_t(x) of an int wrong (Trilu's index compare: every element 0), while
    packInt2x32 of the value and its sign gives the right one."""
    low = f"int({value})"
    if unsigned:
        mask = {"i8": " & 0xff", "i16": " & 0xffff"}.get(element, "")
        return f"packInt2x32(ivec2({low}{mask}, 0))"
    return f"packInt2x32(ivec2({low}, {low} >> 31))"


def _glsl_literal(attr: Any, gtype: str) -> str:
    """A constant exactly: a float by its bits (GLSL has no hex floats)."""
    if isinstance(attr, program.ir.FloatAttr):
        bits = struct.unpack("<I", struct.pack("<f", float(attr.value)))[0]
        exact = f"uintBitsToFloat(0x{bits:08x}u)"
        return exact if gtype == "float" else f"{gtype}({exact})"  # an f16 value is an f32 one too
    if str(attr) in ("true", "false"):  # an i1 constant (a BoolAttr)
        return str(attr) if gtype == "bool" else f"{gtype}({int(str(attr) == 'true')})"
    if isinstance(attr, program.ir.IntegerAttr):
        value = int(attr.value)
        if gtype == "bool":
            return "true" if value else "false"
        if gtype == "int64_t":
            return f"int64_t({value}l)"
        if not -(2**31) <= value < 2**31:
            raise refuse("vulkan", f"an integer constant {value} beyond 32 bits", "arith.constant")
        text = f"({value})" if value < 0 else str(value)
        return text if gtype == "int" else f"{gtype}({text})"
    raise refuse("vulkan", f"a constant {attr} that is not a number", "arith.constant")


def kernel_file(parts: Parts, inputs: list[Binding], out: Binding, sizes: list[str], helpers: set[str]) -> str:
    knob = WORKGROUP_SIZE
    buffers = [
        f"layout(set = 0, binding = {n}) buffer {'readonly ' if b.name.startswith('in') else 'writeonly '}"
        f"Binding{n} {{ {b.ctype} v[]; }} {b.name};  {escape.c_comment(b.about)}"
        for n, b in enumerate([*inputs, out])
    ]
    pushed = [f"layout(push_constant) uniform Sizes {{ {' '.join(f'int {s};' for s in sizes)} }} sizes;"] if sizes else []
    lines = [
        "#version 450",
        *parts.head,
        "// Schedule knob: -DPYREE_WG_SIZE=N overrides it; `pyree-build tune` with no --param tries each listed value.",
        *knob_lines(knob),
        "layout(local_size_x = PYREE_WG_SIZE, local_size_y = 1, local_size_z = 1) in;",
        "",
        "// IREE binds the dispatch's tensors in order (inputs, then the result), and passes the",
        "// inputs' sizes as push constants, 4 bytes each, in order.",
        *buffers,
        *pushed,
        "",
        *(_GLSL_HELPERS[h] for h in _GLSL_HELPERS if h in helpers),
        "",
        "void main() {",
        *(f"  int {s} = sizes.{s};" for s in sizes),
        *parts.prologue,
        *(f"  {c}" for c in parts.comment),
        f"  int total = {parts.total};",
        "  int invocations = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);",
        "  for (int i = int(gl_GlobalInvocationID.x); i < total; i += invocations) {",
        *parts.body,
        "  }",
        "}",
    ]
    if re.search(r"\b(u?int(8|16|64)_t|float16_t)\b", "\n".join(lines)):
        lines[1:1] = _GLSL_EXTENSIONS
    return "\n".join(lines) + "\n"
