"""The GPU emitters of a loop nest (loopnest.Nest): a GLSL compute shader (Vulkan), CUDA C and
HIP C, from the same model the C emitter (c_tiled.py) reads.

One invocation per result element: the element's index is split into the result's loops,
the reduction (if any) runs over its loops in the IR's order with the accumulator in a
register, then the epilogue's stages are applied and the element stored; an elementwise
producer is inlined where it is read, as in c_tiled. The invocations stride over the result
(`i += invocations`), so any workgroup size and any workgroup count compute every element
once: the workgroup size is a knob (`PYREE_WG_SIZE`, a `pyree-tune:` line) and the spec's
count is only how the work is shared.

The ABI IREE uses for a precompiled GPU executable (checked on 3.13, Vulkan on lavapipe,
CUDA and HIP compile-only): the dispatch's tensors are the bindings in order (the inputs,
then the result), each at its own start (the HAL applies a binding's offset); its i32
operands are the push constants in order (GLSL: one push_constant block; CUDA and HIP: the
kernel's parameters after the buffer pointers). The sizes passed are the inputs' sizes, as
the C kernel takes them.

Element types a language cannot hold are refused for that target. GLSL holds f32 and i32 in
core Vulkan; i8, i16, i64 and i1 (stored as a byte, as IREE stores it) through
GL_EXT_shader_explicit_arithmetic_types and 8/16-bit storage, declared only in a shader that
uses them, so the device needs those features (lavapipe has them: checked on ONNX's Where,
Greater, Not, Max int64 and Add uint8 node tests). f16 (wrong on lavapipe in an attention
test, not yet understood), f64, bf16 and f8 types are refused, and so
is a tensor of 2^31 elements or more (GLSL indexes with 32-bit ints).
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from pyree_build.core import escape
from pyree_build.core.errors import PyreeError
from pyree_build.models.codegen import c_reference, c_tiled, loopnest
from pyree_build.models.codegen.emitter import NestEmitter, Unfused, coordinate
from pyree_build.models.ir import program

# Each GPU target, the language its kernel is generated in, and that file's suffix.
TARGETS = {"vulkan": "glsl", "cuda": "cuda", "hip": "hip"}
SUFFIXES = {"glsl": ".glsl", "cuda": ".cu", "hip": ".hip"}
WORKGROUP_SIZE = loopnest.Knob("PYREE_WG_SIZE", 64, (32, 64, 128, 256), "invocations per workgroup, one result element each")
# Workgroups a dispatch has at most (Vulkan's guaranteed maxComputeWorkGroupCount[0] is 65535):
# beyond it each invocation computes several elements.
MAX_WORKGROUPS = 65535

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


def refuse(target: str, what: str, op_name: str = "") -> PyreeError:
    return PyreeError(
        f"the group cannot be generated for {target}: {what}",
        details=f"op: {op_name}" if op_name else None,
        fix=f"choose another group (pyree-build ops --target {target} lists which can be generated), or another --target",
    )


def glsl_type(type_: Any, op_name: str = "") -> str:
    name = program.element_type(type_)
    if name not in _GLSL_TYPES:
        raise refuse("vulkan", f"element type {name} has no GLSL type here (f32, i64, i32, i16, i8 and i1 do)", op_name or str(type_))
    return _GLSL_TYPES[name]


@dataclass
class Binding:
    """A buffer of the kernel: its name, element type (as the language spells it) and sizes."""

    name: str
    ctype: str
    dims: list[str]
    about: str


def bindings(target: str, inputs: list[Any], result: Any, input_names: list[str]) -> tuple[list[Binding], Binding, list[str]]:
    """The kernel's buffers (inputs, result) and its size parameters (push constants), or a
    refusal where the target's language cannot hold an element type."""
    ins = []
    for i, value in enumerate(inputs):
        dims = [f"in{i}_d{d}" for d in range(len(program.shape(value.type)))]
        ins.append(Binding(f"in{i}", _buffer_type(target, value), dims, f"{value.type}, input {i}: {input_names[i]}"))
    if None in program.shape(result.type):
        raise refuse(target, f"the result has a size only known at run time ({result.type})")
    if TARGETS[target] == "glsl":
        # GLSL indexes in 32-bit int (no 64-bit integers without extensions).
        for value in [*inputs, result]:
            if math.prod(d or 0 for d in program.shape(value.type)) >= 2**31:
                raise refuse(target, f"a tensor of 2^31 elements or more ({value.type}): GLSL indexes with 32-bit integers")
    out = Binding("out0", _buffer_type(target, result), [str(d) for d in program.shape(result.type)], f"{result.type}, result 0")
    return ins, out, [d for b in ins for d in b.dims]


def _buffer_type(target: str, value: Any) -> str:
    element = program.element_type(value.type)
    if TARGETS[target] == "glsl":
        if element not in _GLSL_BUFFER_TYPES:
            raise refuse(target, f"a tensor of {element} ({value.type}): GLSL buffers here hold f32, i64, i32, i16, i8 and i1")
        return _GLSL_BUFFER_TYPES[element]
    return c_reference.c_type(value.type)


class GpuEmitter(NestEmitter):
    """Statements of one result element's computation, one invocation each. The language's forms
    (types, declarations, loads, stores, scalar ops) come from GlslForms or CudaForms, mixed in
    by the concrete emitters at the end of this module."""

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
        self.line(indent, self.element_load(buffer, c_reference.linear_index(coords, buffer.dims), value, name))
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
                self.line(indent, f"{index_type} l{d} = q % {_index(nest.sizes[d], index_type)};")
                self.line(indent, f"q /= {_index(nest.sizes[d], index_type)};")
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
            self.line(inner, f"for ({index_type} k{d} = 0; k{d} < {_index(self.nest.sizes[d], index_type)}; ++k{d}) {{")
            inner += "  "
        self.line(inner, f"{acc} = {step(inner)};")
        for _ in reduced:
            inner = inner[:-2]
            self.line(inner, "}")

    def live(self, stage: loopnest.Stage) -> int:
        """The result of a reduction the nest reads (its only one, in a per-element nest)."""
        return 0

    def store(self, result: str, at: list[str], indent: str) -> None:
        self.line(indent, self.element_store(result, c_reference.linear_index(at, self.out.dims)))


class CudaForms(GpuEmitter):
    """CUDA and HIP C: C's types, expressions and helpers, buffers as pointers."""

    def scalar_type(self, type_: Any, op_name: str = "") -> str:
        return c_reference.c_type(type_, op_name)

    def declare(self, ctype: str, name: str, expression: str) -> str:
        return f"const {ctype} {name} = ({ctype})({expression});"

    def literal(self, attr: Any, ctype: str) -> str:
        return c_reference.literal(attr, ctype)

    def element_load(self, buffer: c_reference.Buffer, index: str, value: Any, name: str) -> str:
        return self.declare(buffer.ctype, name, f"{buffer.pointer}[{index}]")

    def element_store(self, result: str, index: str) -> str:
        return f"out0[{index}] = ({self.out.ctype})({result});"

    def body_op(self, op: Any, values: dict[Any, str], indent: str, coords: list[str]) -> None:
        c_reference.emit_body_op(self.k, op, values, indent, coords, [])


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


def _index(size: str, index_type: str) -> str:
    return size if size.isdigit() or index_type == "int" else f"({index_type}){size}"


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


@dataclass
class _Parts:
    """What both languages' files are made of: the header comment, the statements before the
    element loop (constants), the loop's body, the element count and the loop's comment."""

    head: list[str]
    prologue: list[str]
    body: list[str]
    total: str
    comment: list[str]


# NVRTC has no <stdint.h>: the fixed-width types a body uses, as LP64 defines them.
_CUDA_INCLUDES = [
    "// NVRTC has no <stdint.h>: the fixed-width types the body uses, as LP64 defines them.",
    "#if defined(__CUDACC_RTC__)",
    "typedef signed char int8_t;",
    "typedef short int16_t;",
    "typedef int int32_t;",
    "typedef long long int64_t;",
    "typedef unsigned char uint8_t;",
    "typedef unsigned short uint16_t;",
    "typedef unsigned int uint32_t;",
    "typedef unsigned long long uint64_t;",
    "#else",
    "#include <stdint.h>",
    "#endif",
]


def emit(
    target: str,
    k: c_reference.Kernel,
    nest: loopnest.Nest | loopnest.RowNest,
    *,
    name: str,
    inputs: list[Binding],
    out: Binding,
    sizes: list[str],
    constants: list[Any],
    header: list[str],
) -> str:
    """The whole kernel source for `target`. `k` holds the buffers by value (pointers named as
    `inputs` and `out`); `constants` are the group's scalar constant ops; `sizes` the push
    constants (the inputs' sizes, in order). Raises Unfused where the per-element form cannot
    compute the nest, a PyreeError where the language cannot hold a type or op. A row-wise nest
    (a softmax, a LayerNorm) is computed by each element from its row's reductions (RowElements)."""
    lang = TARGETS[target]
    emitter: GpuEmitter
    if isinstance(nest, loopnest.RowNest):
        emitter = (GlslRowEmitter if lang == "glsl" else CudaRowEmitter)(target, k, nest, out)
    else:
        emitter = (GlslEmitter if lang == "glsl" else CudaEmitter)(target, k, nest, out)
    index_type = "int" if lang == "glsl" else "int64_t"
    declared = []
    for op in constants:
        ctype = emitter.scalar_type(op.results[0].type, op.name)
        const = k.fresh("c")
        declared.append((const, f"  {emitter.declare(ctype, const, emitter.literal(op.attributes['value'], ctype))}"))
        k.scalars[op.results[0]] = const
    prologue, k.lines = list(k.lines), []
    emitter.element(index_type, "    ")
    # Only the constants the kernel reads (a max's index constant is not: its i64 would need the
    # device's 64-bit integer feature for nothing).
    body = "\n".join(k.lines)
    prologue += [line for const, line in declared if re.search(rf"\b{const}\b", body)]
    parts = _Parts(
        head=[*map(escape.c_comment, header), ""],
        prologue=prologue,
        body=k.lines,
        total=" * ".join(_index(emitter.nest.sizes[d], index_type) for d in emitter.nest.result_loops) or "1",
        comment=_comment(nest),
    )
    if lang == "glsl":
        return _glsl_file(parts, inputs, out, sizes, emitter.glsl_helpers)
    return _cuda_file(parts, lang, name, inputs, out, sizes, c_reference.helpers_text(k))


def _comment(nest: loopnest.Nest | loopnest.RowNest) -> list[str]:
    if isinstance(nest, loopnest.RowNest):
        return [
            f"// One invocation per element of the result ({len(nest.sizes)} loops, the last reduced {len(nest.reductions)} times): it splits",
            "// its index into the result's loops, computes its row's reductions in the IR's order, each in its own",
            "// loop over the row, then the element from them, and stores. Naive: every element of a row recomputes",
            "// the row's reductions (O(n^2) per row of n elements). The invocations stride over the result, so any",
            "// workgroup size and count are correct.",
        ]
    return [
        f"// One invocation per element of the result ({', '.join(nest.kinds)} loops): it splits its index into",
        "// the result's loops, runs the reduction in the IR's order, applies the epilogue and stores.",
        "// The invocations stride over the result, so any workgroup size and count are correct.",
    ]


def _glsl_file(parts: _Parts, inputs: list[Binding], out: Binding, sizes: list[str], helpers: set[str]) -> str:
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
        *_knob_lines(knob),
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


def _knob_lines(knob: loopnest.Knob) -> list[str]:
    """A knob as every language declares it: the `pyree-tune:` line tune reads, the default first as
    the C's (c_tiled.declared_order: among variants noise cannot tell apart, tune keeps the untuned
    kernel), and the default."""
    values = ",".join(map(str, c_tiled.declared_order(knob)))
    return [f"// pyree-tune: {knob.name}={values}  ({knob.about})", f"#ifndef {knob.name}", f"#define {knob.name} {knob.default}", "#endif"]


def _cuda_file(parts: _Parts, lang: str, name: str, inputs: list[Binding], out: Binding, sizes: list[str], helpers: list[str]) -> str:
    """CUDA C or HIP C: the c_reference helpers as device functions, the kernel taking IREE's parameters."""
    device_helpers = [h.replace("static inline ", "__device__ static inline ", 1) for h in helpers]
    params = [f"const {b.ctype}* __restrict__ {b.name}" for b in inputs] + [f"{out.ctype}* __restrict__ {out.name}"]
    params += [f"int32_t {s}" for s in sizes]
    includes = _CUDA_INCLUDES if lang == "cuda" else ["#include <hip/hip_runtime.h>", "#include <stdint.h>"]
    lines = [
        *parts.head,
        *includes,
        "",
        *([*device_helpers, ""] if device_helpers else []),
        "// Schedule knob: the block size is the workgroup_size of the spec's export, which `pyree-build tune`",
        "// sets to each listed value in the spec of that variant (with -DPYREE_WG_SIZE=N for the kernel's own use);",
        "// any block and grid size compute every element once.",
        *_knob_lines(WORKGROUP_SIZE),
        "",
        "// IREE passes the dispatch's buffers as pointers, in order (inputs, then the result), then",
        "// its i32 operands (the inputs' sizes).",
        f'extern "C" __global__ void {name}(\n    {", ".join(params)}) {{',
        *parts.prologue,
        *(f"  {c}" for c in parts.comment),
        f"  const int64_t total = {parts.total};",
        "  const int64_t invocations = (int64_t)gridDim.x * blockDim.x;",
        "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += invocations) {",
        *parts.body,
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


# The concrete emitters: a language's forms over the per-element or the row-wise nest.
class GlslEmitter(GlslForms):
    pass


class CudaEmitter(CudaForms):
    pass


class GlslRowEmitter(RowElements, GlslForms):
    pass


class CudaRowEmitter(RowElements, CudaForms):
    pass
