"""Matching C and MLIR for one import: `pyree-build new DIR --import NAME --args "in:f32,out:f32"`.

The import's argument block is produced by IREE's compiler from the MLIR declaration and
read by the C function; both are generated here from one list of arguments, so they agree
field for field (see docs/writing-an-import.md for the rules this encodes).

Each argument is a 1-D buffer: `in` (read), `out` (a new result) or `inout` (updated in
place: the result is tied to the operand). The dispatch splits the buffers into tiles of
TILE elements, one workgroup each; the import gets each buffer's base pointer and element
offset, then the tile's element count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyree_build.backends.llvm_cpu import plugin_entry
from pyree_build.core.errors import PyreeError

TILE = 64
LENGTH = 8  # elements in the generated test
KINDS = ("in", "out", "inout")
# No f64: iree-compile demotes f64 to f32 by default, so a `double*` would read floats.
C_TYPES = {"f32": "float", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t"}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FIX = "write --args as KIND:TYPE,... with KIND in, out or inout and TYPE one of " + ", ".join(C_TYPES) + ', e.g. "in:f32,in:f32,out:f32"'


@dataclass(frozen=True)
class Arg:
    kind: str
    type: str
    name: str

    @property
    def c_type(self) -> str:
        return C_TYPES[self.type]

    @property
    def tensor(self) -> str:
        return f"tensor<?x{self.type}>"


def parse_args(name: str, spec: str) -> list[Arg]:
    """Validate the import name and the argument list; name the arguments in0, out0, io0, ..."""
    if not _IDENT.match(name) or name.startswith("iree_"):
        raise PyreeError(f"'{name}' cannot name an import", fix="use a C identifier (letters, digits, _) not starting with iree_")
    args: list[Arg] = []
    counts = {k: 0 for k in KINDS}
    for item in (s.strip() for s in spec.split(",")):
        kind, sep, etype = item.partition(":")
        if not sep or kind not in KINDS or etype not in C_TYPES:
            raise PyreeError(f"'{item}' in --args is not KIND:TYPE", fix=_FIX)
        prefix = {"in": "in", "out": "out", "inout": "io"}[kind]
        args.append(Arg(kind, etype, f"{prefix}{counts[kind]}"))
        counts[kind] += 1
    if not any(a.kind != "in" for a in args):
        raise PyreeError("--args has no out or inout argument, so the import would compute nothing visible", fix=_FIX)
    if len(args) > 8:
        raise PyreeError(f"--args lists {len(args)} buffers; the generator makes at most 8", fix="start with fewer and add more by hand")
    return args


def test_values(args: list[Arg]) -> tuple[list[str], list[str]]:
    """(--input specs, expected result lines) for the generated function and C body.

    Input k (in or inout, in order) holds k + 1 everywhere; the C body writes the sum of the
    `in` buffers to each `out`, and adds it to each `inout`.
    """
    inputs, value = [], {}
    for k, a in enumerate(a for a in args if a.kind != "out"):
        value[a.name] = k + 1
        inputs.append(f"{LENGTH}x{a.type}={k + 1}")
    total = sum(value[a.name] for a in args if a.kind == "in")
    expected = []
    for a in args:
        if a.kind == "out":
            expected.append(f"{LENGTH}x{a.type}=" + " ".join([str(total)] * LENGTH))
        elif a.kind == "inout":
            expected.append(f"{LENGTH}x{a.type}=" + " ".join([str(total + value[a.name])] * LENGTH))
    return inputs, expected


def c_source(name: str, args: list[Arg]) -> str:
    """plugin.c: the import `name` with its argument block, and a body the generated test checks."""
    head = _C_TEMPLATE.format(name=name, field_text=_c_fields(args), body_text=_c_body(args))
    return head + plugin_entry.plugin_entry(name, f"provides the import {name}", {name: name})


def _c_fields(args: list[Arg]) -> str:
    """The argument block's fields: each buffer's base pointer and element offset."""
    fields = []
    for a in args:
        const = "const " if a.kind == "in" else ""
        fields.append(f"  {const}{a.c_type}* {a.name};  // {a.kind} buffer: base pointer (llvm.bareptr)")
        fields.append(f"  size_t {a.name}_offset;  // ... and where this tile starts, in elements")
    return "\n".join(fields)


def _c_body(args: list[Arg]) -> str:
    """The placeholder loop body: the sum of the `in` buffers, stored to each `out`, added to each `inout`."""
    ins = [a for a in args if a.kind == "in"]
    acc_type = C_TYPES[ins[0].type] if ins else "int32_t"
    total = " + ".join(f"({acc_type})a->{x.name}[a->{x.name}_offset + i]" for x in ins) or "0"
    body = [f"    {acc_type} sum = {total};"]
    for a in args:
        if a.kind == "out":
            body.append(f"    a->{a.name}[a->{a.name}_offset + i] = ({a.c_type})sum;")
        elif a.kind == "inout":
            body.append(f"    a->{a.name}[a->{a.name}_offset + i] += ({a.c_type})sum;")
    return "\n".join(body)


def mlir_source(name: str, args: list[Arg]) -> str:
    """program.mlir: the import's declaration, a dispatch that calls it per tile, and @run."""
    return _MLIR_TEMPLATE.format(name=name, TILE=TILE, **_mlir_kernel_parts(args), **_mlir_run_parts(args))


def _mlir_kernel_parts(args: list[Arg]) -> dict[str, str]:
    """The executable's pieces: the import's declaration, the entry's bindings, and the views
    that turn each binding into the base pointer and element offset the import takes."""
    operands = [a for a in args if a.kind != "out"]  # tensors passed to the dispatch
    outs = [a for a in args if a.kind == "out"]
    # Entry bindings: the operands in order, then the new (untied) results. IREE maps
    # !stream.binding arguments to bindings in order and the index to a push constant.
    binding_order = [*operands, *outs]
    views = []
    for a in args:
        views.append(f"        %{a.name} = stream.binding.subspan %{a.name}_binding[%c0] : !stream.binding -> memref<?x{a.type}>{{%n}}")
        views.append(
            f"        %{a.name}_base, %{a.name}_offset, %{a.name}_size, %{a.name}_stride = iree_codegen.extract_strided_metadata %{a.name}\n"
            f"            : memref<?x{a.type}> -> memref<{a.type}>, index, index, index"
        )
        views.append(f"        %{a.name}_at = arith.addi %{a.name}_offset, %begin : index")
    return {
        "decl": ", ".join(["memref<" + a.type + ">, index" for a in args] + ["index"]),
        "entry_params": ",\n                        ".join([f"%{a.name}_binding: !stream.binding" for a in binding_order] + ["%n: index"]),
        "views_text": "\n".join(views),
        "call_operands": ", ".join([f"%{a.name}_base, %{a.name}_at" for a in args] + ["%count"]),
    }


def _mlir_run_parts(args: list[Arg]) -> dict[str, str]:
    """@run's pieces: its parameters and results, and the flow.dispatch of the executable."""
    operands = [a for a in args if a.kind != "out"]
    first = operands[0].name if operands else None
    results = [a for a in args if a.kind != "in"]
    dispatch_results = ", ".join(f"%{a.name}{{%n}}" if a.kind == "inout" else f"{a.tensor}{{%n}}" for a in results)
    if len(results) > 1:
        dispatch_results = f"({dispatch_results})"
    size_line = (
        f"    %n = tensor.dim %{first}, %c0 : {operands[0].tensor}\n" if first
        else f"    %n = arith.constant {LENGTH} : index\n"
    )  # fmt: skip
    return {
        "fn_params": ", ".join(f"%{a.name}: {a.tensor}" for a in operands),
        "result_types": ", ".join(a.tensor for a in results),
        "dispatch_results": dispatch_results,
        "lhs": ", ".join(f"%r_{a.name}" for a in results),
        "size_line": size_line,
        "dispatch_operands": ", ".join([*(f"%{a.name}" for a in operands), "%n"]),
        "dispatch_types": ", ".join([*(f"{a.tensor}{{%n}}" for a in operands), "index"]),
    }


# The files' text; str.format fills the {names} ({{ and }} are literal braces).
_C_TEMPLATE = """\
// The import `{name}`, provided by this plugin. Made by `pyree-build new --import`;
// program.mlir declares the same import, and the two must agree field for field
// (docs/writing-an-import.md in pyree_build explains the rules).
//
// The body is a placeholder that the generated test checks: each `out` buffer
// gets the sum of the `in` buffers, each `inout` buffer has it added. Replace it
// with your kernel. It uses no libc, so the plugin also builds as a standalone
// plugin (CMake STANDALONE, `pyree-build plugin --kind standalone`).

#include <stddef.h>
#include <stdint.h>

#include "iree/hal/local/executable_plugin.h"

// The argument block: one field per operand of the `func.call` in program.mlir,
// in call order, each with its natural C alignment.
typedef struct {{
{field_text}
  size_t count;  // elements in this tile
}} {name}_args_t;

// Returns 0 on success; anything else makes the dispatch (and the call) fail.
static int {name}(void* params, void* context, void* reserved) {{
  (void)context;
  (void)reserved;
  const {name}_args_t* a = (const {name}_args_t*)params;
  for (size_t i = 0; i < a->count; ++i) {{
{body_text}
  }}
  return 0;
}}

"""

_MLIR_TEMPLATE = """\
// Calls the import `{name}` from a dispatch. Made by `pyree-build new --import`;
// plugin.c implements the import with a matching argument block.
//
// @run takes the `in` and `inout` buffers (all of one length) and returns the
// `out` buffers and the updated `inout` buffers, in the order of --args.

module @{name}_program {{

  stream.executable private @{name}_executable {{
    // One workgroup per {TILE} elements.
    stream.executable.export public @{name}_entry workgroups(%n: index) -> (index, index, index) {{
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv {TILE})>()[%n]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }}

    builtin.module {{
      // Provided at run time by a plugin. llvm.bareptr = true passes each memref
      // as one base pointer; the index after it is the element offset. Without
      // it, each memref would become a multi-field descriptor, and the C struct
      // would read garbage.
      func.func private @{name}({decl})
          attributes {{llvm.bareptr = true}}

      func.func @{name}_entry({entry_params}) {{
        %c0 = arith.constant 0 : index
        %workgroup = stream.dispatch.workgroup.id[0] : index
        %begin = affine.apply affine_map<()[s0] -> (s0 * {TILE})>()[%workgroup]
        %count = affine.min affine_map<()[s0, s1] -> ({TILE}, s1 - s0)>()[%begin, %n]
{views_text}
        func.call @{name}({call_operands})
            : ({decl}) -> ()
        return
      }}
    }}
  }}

  func.func @run({fn_params}) -> ({result_types}) {{
    %c0 = arith.constant 0 : index
{size_line}    {lhs} = flow.dispatch @{name}_executable::@{name}_entry[%n]({dispatch_operands})
        : ({dispatch_types}) -> {dispatch_results}
    return {lhs} : {result_types}
  }}
}}
"""
