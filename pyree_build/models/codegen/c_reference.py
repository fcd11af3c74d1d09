"""C for a replaced group: a correct, naive reference body generated from the group's ops.

Each op, as a linalg.generic (named ops are generalised first), becomes a loop nest over its
iteration space: operands are read through their indexing maps from row-major buffers, the
body's arith/math ops become C expressions, and what it yields is stored. Reductions read
the result buffer as their accumulator, so a fill or any other initial value is copied in
first. Math functions come from pyree_build/math_inline.h, copied into the file (the form of
the element type: float code never converts to double), so the same file builds as a system
plugin, a standalone plugin and an embedded object. An op with no C form is refused by name.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyree_build.backends.llvm_cpu import plugin_entry
from pyree_build.core import escape, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.models.codegen.loopnest import linear_index
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

# The math functions come from one freestanding header, pyree_build/math_inline.h (float and
# double forms, branch-free, so the loops calling them vectorize): a kernel's file gets a copy
# of the functions it calls (and what they call), so it stays self-contained (NVRTC has no -I).
MATH_HEADER = toolchain.include_dir() / "pyree_build" / "math_inline.h"
_FUNCTION = re.compile(r"^PYREE_MATH_FN [^\n(]*?\b(pyree_\w+)\(.*?^\}\n", re.S | re.M)


@functools.cache
def _math_functions() -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """The header's functions, each as `static inline` C, and the header's functions each one calls."""
    text = MATH_HEADER.read_text()
    found = {m.group(1): m.group(0).rstrip("\n").replace("PYREE_MATH_FN", "static inline", 1) for m in _FUNCTION.finditer(text)}
    needs = {name: tuple(sorted(set(re.findall(r"\b(pyree_\w+)\(", body)) - {name})) for name, body in found.items()}
    return found, needs


def _float_form(name: str, ctype: str) -> str:
    """The form of `name` for the element type: f32 calls the float form, computed in float."""
    return name + "f" if ctype == "float" and name + "f" in _math_functions()[0] else name


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
    attributes: str = ""  # before the kernel function's `void`: what its preamble defines for it
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
    needs = _math_functions()[1]
    pending = [name]
    while pending:
        current = pending.pop()
        if current not in k.helpers:
            k.helpers.add(current)
            pending.extend(needs.get(current, ()))
    return name


def _expression(k: Kernel, op: Any, args: list[str], loops: list[str], ctype: str) -> str:
    name = op.name
    if name in _BINARY:
        return f"{args[0]} {_BINARY[name]} {args[1]}"
    if name in _CALLS:
        return f"{_helper(k, _float_form(_CALLS[name], ctype))}({', '.join(args)})"
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


# The float functions with a faster form in math_inline.h (NAME_fast: fewer terms, looser stated
# bounds): a kernel defining any of them declares PYREE_FAST_MATH, which `tune` sweeps and keeps
# only where the variant still passes its check.
FAST_FORMS = ("pyree_expf", "pyree_erff", "pyree_tanhf", "pyree_sigmoidf")


def fast_math_lines(k: Kernel) -> list[str]:
    """The PYREE_FAST_MATH knob for the functions of FAST_FORMS the kernel defines (their fast
    forms added to its helpers); placed after the helpers, so it renames only the kernel's calls."""
    defined = [name for name in FAST_FORMS if name in k.helpers]
    for name in defined:
        _helper(k, f"{name}_fast")
    if not defined:
        return []
    return [
        f"// pyree-tune after: PYREE_FAST_MATH=0,1  (1: the faster forms of {', '.join(defined)}; bounds in docs/math.md; kept only where the check passes)",
        "#ifndef PYREE_FAST_MATH",
        "#define PYREE_FAST_MATH 0",
        "#endif",
        "#if PYREE_FAST_MATH",
        *[f"#define {name} {name}_fast" for name in defined],
        "#endif",
    ]


def helpers_text(k: Kernel) -> list[str]:
    """The math functions the kernel calls, in the header's order (each after what it calls)."""
    functions = _math_functions()[0]
    return [text for name, text in functions.items() if name in k.helpers]


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


# After the math helpers, so their code is compiled as written (their accuracy is measured so)
# and only the kernel's own multiply-adds fuse. IREE fuses them too (its matmul is FMA
# instructions); unfused, a matmul on an FMA target issued a multiply and an add per step and took
# 1.28x the time of the fused one (docs/models-at-scale.md).
_CONTRACT = [
    "// The kernel's multiply-adds are fused (one rounding: the FMA instruction where the target has one),",
    "// as IREE's code generation fuses them; -DPYREE_FP_CONTRACT=0 rounds each product and sum apart.",
    "#ifndef PYREE_FP_CONTRACT",
    "#define PYREE_FP_CONTRACT 1",
    "#endif",
    "#if PYREE_FP_CONTRACT && defined(__clang__)",
    "#pragma clang fp contract(fast)",
    "#endif",
]


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
    fast_math = fast_math_lines(k)
    lines += [*helpers_text(k), ""] if k.helpers else []
    lines += [*_CONTRACT, ""]
    lines += [*fast_math, ""] if fast_math else []
    lines += [*k.preamble, ""] if k.preamble else []
    lines += [
        "// The kernel: a plain C function. An embedded object is called with these arguments",
        "// directly (hal.import.static); a plugin unpacks them from the argument block below.",
    ]
    lines += [f"{k.attributes}void {name}(\n    {arguments}) {{", *pointers, *k.lines, "}"]
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
