"""A kernel given as a plain C function and its signature: `args="in:f32[n], in:f32[n], out:f32[n]"`.

From the signature alone this module writes the program that calls the function (one module
for every size: each named size is a dynamic dimension, read from the inputs at each call)
and the C that turns IREE's import call into a call of the function. `pb.load_inline`
builds both around the caller's C; nothing of the caller's C goes into the program, so an
edited function never compiles the program again.

Each item is `KIND:TYPE[DIMS]` (a buffer) or `KIND:TYPE` (a scalar, `in` or `scalar`), with
KIND `in` (read), `out` (allocated from its declared sizes and returned) or `inout` (updated
in place), TYPE an element type and DIMS sizes by name (`n`, `m`) or by number (`4`). The C
function takes the buffers and scalars in the signature's order (a buffer as a pointer to its
first element, row-major and dense), then each named size as a `size_t`, in order of first
use: `void axpy(const float* x, const float* y, float* out, size_t n)`.

The dispatch splits the first output's leading size into tiles, one workgroup each, and
calls the function once per tile: buffers whose leading size is that one are given from the
tile's first row, and that size is given as the tile's row count; every other buffer is given
whole. The function must then compute an output row from the same rows of those inputs (an
elementwise op, a row of a matmul, a row-wise softmax); `tile=0` gives it everything at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyree_build.core import args as arg_checks
from pyree_build.core.errors import PyreeError

ELEMENT_TYPES: Mapping[str, tuple[str, str]] = {  # signature type -> (C type, numpy dtype name)
    "f32": ("float", "float32"),
    "f64": ("double", "float64"),
    "f16": ("_Float16", "float16"),
    "i8": ("int8_t", "int8"),
    "i16": ("int16_t", "int16"),
    "i32": ("int32_t", "int32"),
    "i64": ("int64_t", "int64"),
}
# A scalar reaches the dispatch as push constants: an f16 one arrives as its integer's bits
# (IREE 3.13), so half scalars are refused (take an f32 and convert in C).
SCALAR_TYPES = ("f32", "f64", "i8", "i16", "i32", "i64")
KINDS = ("in", "out", "inout", "scalar")
MAX_DIMS = 6
MAX_BUFFERS = 16
# Rows per workgroup: a 1-D buffer's tile is this many elements; an N-D buffer's, this many rows.
DEFAULT_TILE_ELEMENTS = 4096
DEFAULT_TILE_ROWS = 16
# iree-compile demotes f64 to f32 unless told not to: a double* would read floats.
F64_FLAGS = ("--iree-input-demote-f64-to-f32=false",)
SYNTAX = (
    "write args= as a comma-separated list of KIND:TYPE[DIMS] (a buffer) or KIND:TYPE (a scalar), with KIND in, out or inout, "
    f"TYPE one of {', '.join(ELEMENT_TYPES)} and DIMS sizes by name or number, e.g. "
    '"in:f32[n], in:f32[n], out:f32[n]", "in:f32[m, k], in:f32[k, n], out:f32[m, n]" or "in:f32[n], in:f32, out:f32[n]"'
)
_ITEM = re.compile(r"^(?P<kind>[^:\[\]]*):(?P<type>[^:\[\]]*?)\s*(?:\[(?P<dims>[^\[\]]*)\])?$")
_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Param:
    """One item of the signature: `dims` is None for a scalar."""

    position: int  # 1-based, as errors name it
    text: str  # the item rebuilt from what was parsed (what generated files show: no byte of the caller's spacing)
    kind: str
    type: str
    dims: tuple[str | int, ...] | None

    @property
    def is_buffer(self) -> bool:
        return self.dims is not None

    @property
    def is_output(self) -> bool:
        return self.kind in ("out", "inout")

    @property
    def is_operand(self) -> bool:
        """Passed by the caller: inputs, updated buffers and scalars."""
        return self.kind != "out"

    @property
    def c_type(self) -> str:
        return ELEMENT_TYPES[self.type][0]

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(ELEMENT_TYPES[self.type][1])

    def shaped(self, container: str) -> str:
        """`tensor<?x4xf32>` or `memref<...>`: a named size is dynamic, a number static."""
        assert self.dims is not None
        return f"{container}<" + "".join(f"{d if isinstance(d, int) else '?'}x" for d in self.dims) + f"{self.type}>"

    def dynamic(self, prefix: str = "%size_") -> str:
        """The values of the dynamic dims, as a type's `{...}` lists them."""
        assert self.dims is not None
        return ", ".join(f"{prefix}{d}" for d in self.dims if isinstance(d, str))

    def sized(self, value_or_container: str) -> str:
        """`tensor<?x4xf32>{%size_n}` (a type, or an SSA value, with its dynamic dims' values);
        nothing after a type whose dims are all numbers."""
        head = self.shaped(value_or_container) if value_or_container in ("tensor", "memref") else value_or_container
        return f"{head}{{{self.dynamic()}}}" if self.dynamic() else head

    def described(self) -> str:
        return f"argument {self.position} ('{self.text}')"


@dataclass(frozen=True)
class Signature:
    function: str
    params: tuple[Param, ...]
    sizes: tuple[str, ...]  # named sizes, in order of first use
    tiled: str | None  # the size the dispatch splits into tiles, or None: one call gets everything
    tile: int  # rows (elements, 1-D) per workgroup when tiled

    @property
    def import_name(self) -> str:
        return f"pyree_call_{self.function}"

    @property
    def operands(self) -> list[Param]:
        return [p for p in self.params if p.is_operand]

    @property
    def outputs(self) -> list[Param]:
        return [p for p in self.params if p.is_output]

    @property
    def compile_flags(self) -> tuple[str, ...]:
        return F64_FLAGS if any(p.type == "f64" for p in self.params) else ()

    def text(self) -> str:
        return ", ".join(p.text for p in self.params)


def split_items(text: str) -> list[str]:
    """The items of a signature: commas inside [...] separate dims, not items."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    items.append("".join(current).strip())
    return items


def is_named_form(text: str) -> bool:
    """Whether a list names its sizes (this module's form) rather than writing `?` for each
    dimension (`pyree-build new --args "in:f32[?x?]"`, the import's own argument block): some
    item has dims, and none writes a `?`."""
    dims = [m["dims"] for item in split_items(text) if (m := _ITEM.match(item)) and m["dims"] is not None]
    return bool(dims) and not any("?" in d for d in dims)


def parse(text: object, function: object, *, tile: int | None = None) -> Signature:
    """The signature `text` of the C function `function`, or an error that names the item
    and says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise PyreeError(f"args= must be a non-empty string, not {text!r}", fix=SYNTAX)
    name = arg_checks.import_name(function, role="function")
    params = tuple(_parse_item(position, item) for position, item in enumerate(split_items(text), start=1))
    _check_whole(params)
    sizes = tuple(dict.fromkeys(d for p in params for d in p.dims or () if isinstance(d, str)))
    return Signature(name, params, sizes, *_tiling(params, tile))


def _parse_item(position: int, item: str) -> Param:
    where = f"args item {position} '{item}'"
    if not item:
        raise PyreeError(f"args item {position} is empty", fix=SYNTAX)
    match = _ITEM.match(item)
    if not match:
        raise PyreeError(f"{where} is not KIND:TYPE or KIND:TYPE[DIMS]", fix=SYNTAX)
    kind, etype, dims_text = match["kind"].strip(), match["type"].strip(), match["dims"]
    if kind not in KINDS:
        raise PyreeError(f"{where}: '{kind}' is not a kind (in, out, inout or scalar)", fix=SYNTAX)
    if etype not in ELEMENT_TYPES:
        raise PyreeError(f"{where}: '{etype}' is not an element type ({', '.join(ELEMENT_TYPES)})", fix=SYNTAX)
    if dims_text is None:
        if kind in ("out", "inout"):
            raise PyreeError(
                f"{where} is an output without a size",
                fix=f"outputs are allocated before the call: give its dims by the inputs' size names, e.g. {kind}:{etype}[n]",
            )
        if etype not in SCALAR_TYPES:
            raise PyreeError(f"{where}: a scalar is one of {', '.join(SCALAR_TYPES)}, not {etype} (take an f32 and convert in C)", fix=SYNTAX)
        return Param(position, f"{kind}:{etype}", "scalar", etype, None)
    if kind == "scalar":
        raise PyreeError(f"{where}: a scalar has no dims", fix="write in:TYPE[DIMS] for a buffer, or scalar:TYPE for one number")
    dims = [d.strip() for d in dims_text.split(",")]
    if dims == [""]:
        raise PyreeError(f"{where} has no dims", fix="a buffer has at least one dim (f32[n]); a single number is a scalar: in:f32")
    if len(dims) > MAX_DIMS:
        raise PyreeError(f"{where} has {len(dims)} dims; at most {MAX_DIMS}", fix="flatten inner dims into one")
    parsed = tuple(_dim(where, d) for d in dims)
    return Param(position, f"{kind}:{etype}[{', '.join(map(str, parsed))}]", kind, etype, parsed)


def _dim(where: str, dim: str) -> str | int:
    if _NUMBER.fullmatch(dim):
        return int(dim)
    if dim == "?":
        raise PyreeError(f"{where}: name each size (f32[n]) rather than ? (the ?x? form is `pyree-build new --args`'s import block)", fix=SYNTAX)
    return arg_checks.import_name(dim, role=f"size name in {where}")


def _check_whole(params: Sequence[Param]) -> None:
    outputs = [p for p in params if p.is_output]
    if not outputs:
        raise PyreeError("args= has no out or inout argument, so the function would compute nothing the call returns", fix=SYNTAX)
    buffers = [p for p in params if p.is_buffer]
    if len(buffers) > MAX_BUFFERS:
        raise PyreeError(f"args= lists {len(buffers)} buffers; at most {MAX_BUFFERS}", fix="pass fewer buffers (pack related ones into one)")
    known = {d for p in params if p.is_buffer and p.kind != "out" for d in p.dims or () if isinstance(d, str)}
    for p in params:
        if p.kind == "out":
            unknown = [d for d in p.dims or () if isinstance(d, str) and d not in known]
            if unknown:
                raise PyreeError(
                    f"args item {p.position} '{p.text}': size '{unknown[0]}' is used by no input, so its value is unknown when the output is allocated",
                    fix="give the output's dims by sizes of the in or inout buffers, or by numbers (f32[4])",
                )


def _tiling(params: Sequence[Param], tile: int | None) -> tuple[str | None, int]:
    """(the size split into tiles, rows per tile): the first output's leading size, when it is
    a name and no buffer uses it but as its leading size (a tile of rows must then hold whole
    rows of everything that shares the size)."""
    first = next(p for p in params if p.is_output)
    lead = first.dims[0] if first.dims else None
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 0):
        raise PyreeError(f"tile={tile!r} is not a row count", fix="pass tile=ROWS (rows per workgroup), tile=0 for one call over everything, or leave it out")
    if not isinstance(lead, str) or tile == 0:
        return None, 1
    if any(lead in (p.dims or ())[1:] for p in params):
        return None, 1
    default = DEFAULT_TILE_ELEMENTS if len(first.dims or ()) == 1 else DEFAULT_TILE_ROWS
    return lead, tile or default


# --- the program ---------------------------------------------------------------------------


def _declaration(sig: Signature) -> str:
    """The import's operand types, in call order: each buffer's base and element offset, then
    the scalars, then the sizes."""
    buffers = [p for p in sig.params if p.is_buffer]
    scalars = [p.type for p in sig.params if not p.is_buffer]
    return ", ".join([*(f"memref<{p.type}>, index" for p in buffers), *scalars, *(["index"] * len(sig.sizes))])


def _entry(sig: Signature) -> str:
    """The dispatch's function: each buffer's binding as a base pointer and element offset
    (moved to the tile's first row for a tiled buffer), then the call."""
    buffers = [p for p in sig.params if p.is_buffer]
    scalars = [p for p in sig.params if not p.is_buffer]
    # IREE hands the operand buffers to the bindings first, then the new results, then the rest in order.
    bindings = [*(p for p in buffers if p.kind != "out"), *(p for p in buffers if p.kind == "out")]
    params = [*(f"%b{p.position}_binding: !stream.binding" for p in bindings), *(f"%s{p.position}: {p.type}" for p in scalars)]
    params += [f"%size_{s}: index" for s in sig.sizes]
    body = ["%c0 = arith.constant 0 : index"]
    if sig.tiled:
        body += [
            "%workgroup = stream.dispatch.workgroup.id[0] : index",
            f"%begin = affine.apply affine_map<()[s0] -> (s0 * {sig.tile})>()[%workgroup]",
            f"%count = affine.min affine_map<()[s0, s1] -> ({sig.tile}, s1 - s0)>()[%begin, %size_{sig.tiled}]",
        ]
    call = []
    for p in buffers:
        b, rank, memref = f"%b{p.position}", len(p.dims or ()), p.shaped("memref")
        body.append(f"{b} = stream.binding.subspan {b}_binding[%c0] : !stream.binding -> {p.sized('memref')}")
        metadata = [f"{b}_base", f"{b}_offset", *(f"{b}_d{d}" for d in range(rank)), *(f"{b}_stride{d}" for d in range(rank))]
        body.append(
            f"{', '.join(metadata)} = iree_codegen.extract_strided_metadata {b} : {memref} -> memref<{p.type}>, " + ", ".join(["index"] * (1 + 2 * rank))
        )
        at = f"{b}_offset"
        if sig.tiled and p.dims and p.dims[0] == sig.tiled:
            at = f"{b}_at"
            body.append(f"{at} = affine.apply affine_map<()[s0, s1, s2] -> (s0 + s1 * s2)>()[{b}_offset, %begin, {b}_stride0]")
        call.append(f"{b}_base, {at}")
    call += [f"%s{p.position}" for p in scalars]
    call += ["%count" if s == sig.tiled else f"%size_{s}" for s in sig.sizes]
    body += [f"func.call @{sig.import_name}({', '.join(call)}) : ({_declaration(sig)}) -> ()", "return"]
    lines = "\n".join(f"        {line}" for line in body)
    return f"      func.func @{sig.function}_entry(\n          " + ",\n          ".join(params) + f") {{\n{lines}\n      }}"


@dataclass(frozen=True)
class _Host:
    """The pieces of @FUNCTION both program forms share: its parameters, the lines that read
    each named size from the first operand that has it, and its results."""

    params: str
    lines: list[str]
    results: str  # the dispatch's result types, an inout one tied to its operand
    result_types: str
    names: str


def _host(sig: Signature) -> _Host:
    operands = sig.operands
    lines = []
    for s in sig.sizes:
        owner = next(p for p in operands if p.is_buffer and s in (p.dims or ()))
        lines.append(f"%size_{s} = tensor.dim %a{owner.position}, %c{(owner.dims or ()).index(s)} : {owner.shaped('tensor')}")
    constants = sorted({(p.dims or ()).index(s) for s in sig.sizes for p in operands if p.is_buffer and s in (p.dims or ())} | {1})
    results = ", ".join(p.sized(f"%a{p.position}") if p.kind == "inout" else p.sized("tensor") for p in sig.outputs)
    return _Host(
        params=", ".join(f"%a{p.position}: {p.shaped('tensor') if p.is_buffer else p.type}" for p in operands),
        lines=[f"%c{i} = arith.constant {i} : index" for i in constants] + lines,
        results=f"({results})" if len(sig.outputs) > 1 else results,
        result_types=", ".join(p.shaped("tensor") for p in sig.outputs),
        names=", ".join(f"%r{p.position}" for p in sig.outputs),
    )


def _function_text(sig: Signature, host: _Host, lines: list[str]) -> str:
    body = "\n".join(f"    {line}" for line in [*host.lines, *lines, f"return {host.names} : {host.result_types}"])
    return f"  func.func @{sig.function}({host.params}) -> ({host.result_types}) {{\n{body}\n  }}"


def _host_function(sig: Signature) -> str:
    """@FUNCTION: reads each named size and dispatches the import."""
    host, operands = _host(sig), sig.operands
    dispatch_operands = ", ".join([*(f"%a{p.position}" for p in operands), *(f"%size_{s}" for s in sig.sizes)])
    dispatch_types = ", ".join([*(p.sized("tensor") if p.is_buffer else p.type for p in operands), *(["index"] * len(sig.sizes))])
    workload = f"%size_{sig.tiled}" if sig.tiled else "%c1"
    dispatch = [
        f"{host.names} = flow.dispatch @{sig.function}_executable::@{sig.function}_entry[{workload}]({dispatch_operands})",
        f"    : ({dispatch_types}) -> {host.results}",
    ]
    return _function_text(sig, host, dispatch)


# The target each CPU's objects are keyed by, as IREE spells the arch.
OBJECT_ARCHS = {"x86_64": "x86_64", "aarch64": "arm_64", "riscv64": "riscv_64"}


def program(sig: Signature, *, objects: str | None = None, arch: str = "x86_64") -> str:
    """The MLIR: @FUNCTION takes the operands, allocates the outputs and dispatches the import
    once per tile. With `objects` (a file stem), the import is linked statically from
    `STEM_ARCH.o` for the host's `arch`, found on the object search path, instead of being
    provided by a plugin."""
    how = f"once per tile of {sig.tile} along size {sig.tiled}" if sig.tiled else "once, over everything"
    linked = ""
    if objects is not None:
        target = f'#hal.executable.target<"llvm-cpu", "embedded-elf-{OBJECT_ARCHS[arch]}">'
        linked = f' attributes {{\n    hal.executable.objects = #hal.executable.objects<{{{target} = [#hal.executable.object<{{path = "{objects}_{arch}.o"}}>]}}>\n  }}'
    static = "hal.import.static, " if objects is not None else ""
    return f"""\
// Generated by pyree_build from the signature of the C function `{sig.function}`:
//   {sig.text()}
// @{sig.function} dispatches the import @{sig.import_name} (the generated C around the
// caller's function) {how}.
module @{sig.function}_inline {{
  stream.executable private @{sig.function}_executable{linked} {{
    stream.executable.export public @{sig.function}_entry workgroups(%workload: index) -> (index, index, index) {{
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv {sig.tile})>()[%workload]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }}
    builtin.module {{
      func.func private @{sig.import_name}({_declaration(sig)}) attributes {{{static}llvm.bareptr = true}}
{_entry(sig)}
    }}
  }}

{_host_function(sig)}
}}
"""


# --- a compute shader's program ---------------------------------------------------------------

# A shader's push constants are 32-bit words: the scalars it can take as they are.
SHADER_SCALAR_TYPES = ("f32", "i32")
_LOCAL_SIZE = re.compile(r"layout\s*\(([^)]*)\)\s*in\s*;")


def local_size(glsl: str) -> int:
    """The shader's local_size_x (local_size_y and _z must be 1: args= dispatches one
    invocation per element of the first output, along x)."""
    found = _LOCAL_SIZE.search(glsl)
    sizes = dict(re.findall(r"local_size_([xyz])\s*=\s*(\d+)", found[1])) if found else {}
    if "x" not in sizes:
        raise PyreeError(
            "the shader declares no local_size_x", fix="declare layout(local_size_x = 64) in; args= dispatches one invocation per output element along x"
        )
    if int(sizes.get("y", 1)) != 1 or int(sizes.get("z", 1)) != 1:
        raise PyreeError(
            "args= dispatches one invocation per element of the first output, along x: the shader's local_size_y and local_size_z must be 1",
            fix="index the output with gl_GlobalInvocationID.x (a flat index), or write the program yourself (mlir=)",
        )
    return int(sizes["x"])


def shader_program(sig: Signature, spirv: str, local_x: int) -> str:
    """The MLIR for a compute shader of this signature: its bindings are the in and inout
    buffers in order, then the out buffers; its push constants the scalars in order, then each
    named size as a 32-bit uint; one invocation per element of the first output."""
    bad = [p for p in sig.params if not p.is_buffer and p.type not in SHADER_SCALAR_TYPES]
    if bad:
        raise PyreeError(
            f"{bad[0].described()}: a shader's push constants are 32-bit words, so its scalars are {' or '.join(SHADER_SCALAR_TYPES)}",
            fix="take the scalar as f32 or i32 and convert in the shader",
        )
    buffers = [p for p in sig.params if p.is_buffer]
    bindings = [*(p for p in buffers if p.kind != "out"), *(p for p in buffers if p.kind == "out")]
    layout = ",\n          ".join(f"#hal.pipeline.binding<storage_buffer{', ReadOnly' if p.kind == 'in' else ''}>" for p in bindings)
    scalars = [p for p in sig.params if not p.is_buffer]
    host = _host(sig)
    lines = [f"%size_{s}_i32 = arith.index_cast %size_{s} : index to i32" for s in sig.sizes]
    # Push constants are i32 words: a float scalar goes as its bits, which the shader reads as a float.
    lines += [f"%a{p.position}_bits = arith.bitcast %a{p.position} : f32 to i32" for p in scalars if p.type == "f32"]
    word = {p.position: f"%a{p.position}_bits" if p.type == "f32" else f"%a{p.position}" for p in scalars}
    work = "%c1"
    for i, d in enumerate(sig.outputs[0].dims or ()):  # one invocation per element of the first output
        lines += [] if isinstance(d, str) else [f"%c{d}_work = arith.constant {d} : index"]
        lines.append(f"%work{i} = arith.muli {work}, {f'%size_{d}' if isinstance(d, str) else f'%c{d}_work'} : index")
        work = f"%work{i}"
    tensors = [p for p in sig.operands if p.is_buffer]
    dispatch_operands = ", ".join([*(word[p.position] for p in scalars), *(f"%size_{s}_i32" for s in sig.sizes), *(f"%a{p.position}" for p in tensors)])
    dispatch_types = ", ".join([*(["i32"] * (len(scalars) + len(sig.sizes))), *(p.sized("tensor") for p in tensors)])
    lines += [f"{host.names} = flow.dispatch @{sig.function}_shader::@main[{work}]({dispatch_operands})", f"    : ({dispatch_types}) -> {host.results}"]
    return f"""\
// Generated by pyree_build from the signature of the shader `{spirv}`: {sig.text()}
// Bindings: {", ".join(p.text for p in bindings)}; push constants: {", ".join([*(p.text for p in scalars), *(f"uint {s}" for s in sig.sizes)]) or "none"}.
#spirv = #hal.executable.target<"vulkan-spirv", "vulkan-spirv-fb">
module @{sig.function}_inline {{
  hal.executable.source private @{sig.function}_shader <{{objects = #hal.executable.objects<{{
    #spirv = [#hal.executable.object<{{path = "{spirv}"}}>]
  }}>}}> {{
    hal.executable.export public @main ordinal(0)
        layout(#hal.pipeline.layout<constants = {len(scalars) + len(sig.sizes)}, bindings = [
          {layout}
        ]>) count(%device: !hal.device, %work: index) -> (index, index, index) {{
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv {local_x})>()[%work]
      %one = arith.constant 1 : index
      hal.return %groups, %one, %one : index, index, index
    }}
  }}

{_function_text(sig, host, lines)}
}}
"""


# --- the C around the caller's function --------------------------------------------------------


def adapter(sig: Signature, kernel_file: str, *, static: bool = False) -> str:
    """C that includes the caller's file and defines the import. A plugin's import reads IREE's
    argument block (one field per operand of the MLIR's call, in order); a static one (linked
    into the module from an object) takes the operands as its parameters. Either calls the
    function."""
    buffers = [p for p in sig.params if p.is_buffer]
    fields = []
    for p in buffers:
        fields.append(f"{p.c_type}* b{p.position}")
        fields.append(f"size_t b{p.position}_offset")
    fields += [f"{p.c_type} s{p.position}" for p in sig.params if not p.is_buffer]
    fields += [f"size_t size_{s}" for s in sig.sizes]
    at = "" if static else "a->"
    arguments = [f"{at}b{p.position} + {at}b{p.position}_offset" if p.is_buffer else f"{at}s{p.position}" for p in sig.params]
    arguments += [f"{at}size_{s}" for s in sig.sizes]
    head = f"""\
// Generated by pb.load_inline from args="{sig.text()}": the import @{sig.import_name}
// that the generated program calls {"once per tile" if sig.tiled else "once"}, calling {sig.function}() of {kernel_file}.
#include <stddef.h>
#include <stdint.h>

#include "{kernel_file}"

"""
    call = f"{sig.function}({', '.join(arguments)});"
    if static:  # a plain C call from the module's code: buffers as (base, element offset), then the rest
        return head + f"void {sig.import_name}({', '.join(fields)}) {{\n  {call}\n}}\n"
    return head + (
        "typedef struct {\n" + "".join(f"  {field};\n" for field in fields) + f"}} {sig.import_name}_args_t;\n\n"
        f"static int {sig.import_name}(void* params, void* context, void* reserved) {{\n"
        "  (void)context;\n  (void)reserved;\n"
        f"  const {sig.import_name}_args_t* a = (const {sig.import_name}_args_t*)params;\n"
        f"  {call}\n  return 0;\n}}\n"
    )


# --- a call ----------------------------------------------------------------------------------


def bind(sig: Signature, values: Sequence[object]) -> tuple[list[object], dict[str, int]]:
    """The program's operands for one call (arrays of the declared types, numbers for scalars)
    and the sizes they give, or an error naming the argument that does not fit."""
    operands = sig.operands
    if len(values) != len(operands):
        listed = ", ".join(p.text for p in operands)
        raise PyreeError(
            f"{sig.function} takes {len(operands)} arguments ({listed}), not {len(values)}",
            fix="pass the in and inout buffers and the scalars, in the signature's order",
        )
    bound: list[object] = []
    sizes: dict[str, tuple[int, Param]] = {}
    for p, value in zip(operands, values):
        if not p.is_buffer:
            bound.append(_scalar(p, value))
            continue
        array = as_array(value)
        if array.dtype != p.dtype:
            raise PyreeError(f"{p.described()} is an array of {array.dtype}, not {p.dtype}", fix=f"pass a {p.dtype} array (x.astype(np.{p.dtype}))")
        dims = p.dims or ()
        if array.ndim != len(dims):
            raise PyreeError(f"{p.described()} has {array.ndim} dims (shape {array.shape}), not {len(dims)}", fix="pass an array of the declared rank")
        for d, extent in zip(dims, array.shape):
            if isinstance(d, int) and d != extent:
                raise PyreeError(f"{p.described()} has shape {array.shape}: its size {d} is fixed by the signature", fix="pass an array of that size")
            if isinstance(d, str):
                seen = sizes.setdefault(d, (extent, p))
                if seen[0] != extent:
                    raise PyreeError(
                        f"size '{d}' is {seen[0]} in {seen[1].described()} but {extent} in {p.described()}",
                        fix="pass arrays that agree on every size they share",
                    )
        bound.append(np.ascontiguousarray(array))
    return bound, {name: extent for name, (extent, _) in sizes.items()}


def _scalar(p: Param, value: object) -> object:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if p.type.startswith("f"):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise PyreeError(f"{p.described()} is a number, not {type(value).__name__}", fix="pass a Python or numpy number")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PyreeError(f"{p.described()} is an integer, not {type(value).__name__} {value!r}", fix="pass a Python or numpy integer")
    info = np.iinfo(p.dtype)
    if not info.min <= int(value) <= info.max:
        raise PyreeError(f"{p.described()} is {value}, outside {p.type} ({info.min}..{info.max})", fix="pass a value the type holds")
    return int(value)


def as_array(value: object) -> np.ndarray:
    """A numpy view of an array, a tensor or anything else with `__dlpack__` (no copy on the
    CPU), or the value as numpy makes it."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError) as exc:
            raise PyreeError(f"a {type(value).__name__} could not be read as a CPU array ({exc})", fix="pass an array in CPU memory (tensor.cpu())") from None
    return np.asarray(value)


def like(template: object, array: np.ndarray) -> object:
    """`array` as the kind of array `template` is (a torch tensor for a torch tensor, through
    DLPack, no copy); numpy for numpy and anything unknown."""
    if isinstance(template, np.ndarray) or not hasattr(template, "__dlpack__"):
        return array
    package = __import__(type(template).__module__.split(".")[0])
    convert = getattr(package, "from_dlpack", None)
    return convert(array) if convert is not None else array
