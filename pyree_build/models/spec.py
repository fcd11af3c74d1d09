"""The transform spec that replaces op groups by calls of C imports, or by dispatches of
generated GPU kernels (`replace --target vulkan|cuda|hip`: gpu_executable, gpu_call_function).

For each group: a matcher whose body is the group's own ops, cloned from the program and
printed by MLIR (so it matches this model, constant for constant, type for type); a
dispatch (a stream.executable with as many workgroups as the kernel's schedule shares its
work among) whose function calls the import with each tensor as a (base pointer, element
offset) pair under `llvm.bareptr`, then the input sizes as i32, then its workgroup's id and
the workgroup count as i32; and a function the rewrite calls instead of the group. Every intermediate
tensor of the group gets a buffer of its own in the dispatch (extra results the call drops),
so the C reference body needs no allocator and runs freestanding.

Long (~600 lines) because a spec is one text with three parts that must agree (matchers,
dispatches, rewrites) for CPU imports and GPU kernels; split, each part would need the others'
names and layouts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from pyree_build.core import escape
from pyree_build.core.errors import PyreeError
from pyree_build.models.ir import captures, groups, program

EMBEDDED_ARCHES = (("x86_64", "x86_64"), ("arm_64", "aarch64"))


@dataclass
class Replacement:
    """One group and the import that replaces it, with everything both generators need."""

    name: str
    group: groups.Group
    scratch: list[Any]  # member results that are neither an output nor a reshape of another buffer
    aliases: list[str]  # #map = ... lines the matcher body uses
    matcher: list[str]  # the matcher body's ops, printed
    arg_types: list[str]  # the matcher's block argument types (the group's inputs)
    # With general sizes (--dynamic): every tensor's sizes by its position in the function
    # (program.position), in terms of the inputs' sizes; empty for the static form.
    dims: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    # How many workgroups the dispatch has: the kernel gets its workgroup's id and this count,
    # and computes only its share (the generator's schedule sets it).
    workgroups: int = 1
    # With general sizes, the count is only known at run time: (rows each workgroup gets at
    # least, the most workgroups), the rows being the result's elements over its last size.
    row_workgroups: tuple[int, int] | None = None
    # The GPU target whose kernel replaces the group (vulkan, cuda, hip); None: a CPU import.
    target: str | None = None
    # Where the group's last op is: its name, its place among the program's ops of that name
    # (transform.structured.match's order), and how many the program has. The matcher is tried
    # on that op alone, so it replaces its own group and never takes ops of another that looks
    # the same.
    anchor: tuple[str, int, int] | None = None
    # With an anchor: the group's ops whose bodies hold scalar constants (each anchored the same
    # way) and those constants' values: the spec clones each into that op alone (_sink_lines).
    sinks: list[tuple[tuple[str, int, int], list[str]]] = field(default_factory=list)

    @property
    def dynamic(self) -> bool:
        return bool(self.dims)

    def type_of(self, value: Any) -> str:
        """The value's type as the spec writes it: every size `?` in the general form."""
        return general_type(str(value.type)) if self.dynamic else str(value.type)

    def sizes_of(self, value: Any) -> list[Any]:
        return self.dims[program.position(value, self.group.function)]


# Every size, static or already dynamic (a model's batch dimension): tensor<?x4xf32> too.
_TENSOR_SHAPE = re.compile(r"(tensor|memref)<((?:(?:\d+|\?)x)+)")
_EMPTY = re.compile(r"^(\s*%[\w.]+ = )tensor\.empty\(\) : (tensor<[^>]*>)")


def general_type(type_text: str) -> str:
    """tensor<4x32xf32> -> tensor<?x?xf32>: the form that matches any sizes."""
    return _TENSOR_SHAPE.sub(lambda m: f"{m.group(1)}<" + "?x" * m.group(2).count("x"), type_text)


def general_matcher(body: list[str]) -> list[str]:
    """The matcher body for any sizes: every tensor type general; each tensor.empty (whose
    static form has no operands) matched by its name only, its sizes a placeholder the
    matcher never visits."""
    out = ["%pyree_any_size = arith.constant 1 : index"]
    for line in body:
        line = general_type(line)
        empty = _EMPTY.match(line)
        if empty and "?" in empty.group(2):
            sizes = ", ".join(["%pyree_any_size"] * empty.group(2).count("?"))
            line = f"{empty.group(1)}tensor.empty({sizes}) {{match.operation_name_only}} : {empty.group(2)}"
        out.append(line)
    return out


def _ordered(group: groups.Group) -> list[Any]:
    return sorted({*group.constants, *group.empties, *group.members}, key=lambda op: program.op_index(op, group.function))


def clone_matcher(group: groups.Group) -> tuple[list[str], list[str], list[str]]:
    """Print the group's ops as a function of its inputs: (aliases, argument types, body lines).

    The program is left as it is: each clone's operands, and those of the ops in its
    bodies, are pointed at the clones' values."""
    aliases, lines = _cloned(group, returned=False)
    start = next(i for i, line in enumerate(lines) if "func.func @matcher" in line)
    end = max(i for i, line in enumerate(lines) if line.strip() == "return")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    return aliases, [str(v.type) for v in group.inputs], [line[indent:] for line in lines[start + 1 : end]]


def isolated_program(group: groups.Group, name: str = "group") -> str:
    """The group's ops alone as a program: a public function `name` of the group's inputs that
    returns its root's results, the same ops on the same types (what IREE compiles for exactly
    those ops, to time against the kernel that replaces them)."""
    aliases, lines = _cloned(group, returned=True)
    return "\n".join([*aliases, *lines]).replace("func.func @matcher(", f"func.func @{name}(", 1) + "\n"


def _cloned(group: groups.Group, *, returned: bool) -> tuple[list[str], list[str]]:
    """The group's ops cloned into a function @matcher of its inputs, printed: (aliases, the
    other lines). `returned`: the function returns the root's results (a program of its own);
    else it returns nothing and the ops a matcher compares by name only are marked so."""
    types = [str(v.type) for v in group.inputs]
    with group.function.context, program.ir.Location.unknown():
        scratch = program.ir.Module.parse(f"func.func @matcher({', '.join(f'%arg{i}: {t}' for i, t in enumerate(types))}) {{\n  return\n}}")
        function = scratch.body.operations[0].operation
        block = function.regions[0].blocks[0]
        mapping = dict(zip(group.inputs, block.arguments))
        terminator = block.operations[len(block.operations) - 1]
        point = program.ir.InsertionPoint(terminator)
        for op in _ordered(group):
            clone = op.clone(ip=point)
            if op in group.by_name and not returned:
                clone.attributes["match.operation_name_only"] = program.ir.UnitAttr.get()
            _remap(clone, mapping)
            mapping.update(zip(op.results, clone.results))
        if returned:
            results = [mapping[r] for r in group.root.results]
            program.ir.Operation.create("func.return", operands=results, ip=point)
            terminator.operation.erase()
            signature = program.ir.FunctionType.get([a.type for a in block.arguments], [r.type for r in results])
            function.attributes["function_type"] = program.ir.TypeAttr.get(signature)
        try:
            scratch.operation.verify()
        except program.ir.MLIRError as e:
            # A clone that still uses a value of the program (one no operand brings in) does
            # not verify, and MLIR would print it in generic form, which no matcher repeats.
            raise PyreeError(
                f"op group {group.index}'s ops do not form a function of its inputs, so no matcher can be written for them",
                details=str(e),
                fix="choose another group (pyree-build ops lists which can be replaced)",
            ) from None
        text = scratch.operation.get_asm(enable_debug_info=False)
    lines = text.splitlines()
    return [line for line in lines if line.startswith("#")], [line for line in lines if not line.startswith("#")]


def _remap(op: Any, mapping: dict[Any, Any]) -> None:
    """Point `op`'s operands, and its bodies' ops' operands, from the program's values to the clones'."""
    for each in [op, *captures.nested_ops(op)]:
        operands = each.operands
        for i in range(len(operands)):
            if operands[i] in mapping:
                operands[i] = mapping[operands[i]]


def replacement(name: str, group: groups.Group) -> Replacement:
    outputs = list(group.root.results)
    scratch = [r for op in group.members if op.name not in groups.RESHAPES for r in op.results if r not in outputs]
    aliases, arg_types, body = clone_matcher(group)
    return Replacement(name, group, scratch, aliases, body, arg_types)


def generalize(rep: Replacement, dims: dict[tuple[int, int], list[Any]]) -> None:
    """Make `rep` the form for any sizes: `dims` gives every tensor's sizes from the inputs'."""
    rep.dims = dims
    rep.matcher = general_matcher(rep.matcher)
    rep.arg_types = [general_type(t) for t in rep.arg_types]


def _memref(tensor_type: str) -> str:
    return tensor_type.replace("tensor<", "memref<", 1)


def _index_of(dim: Any) -> str:
    """The SSA name of a size (an index) in the dispatch function or the call function."""
    return f"%x{dim[1]}_{dim[2]}" if dim[0] == "in" else f"%k{dim[1]}"


def _sized_dims(rep: Replacement) -> list[tuple[int, int, int, int | None]]:
    """(k, input, dimension, size) for every input dimension the import is given a size for:
    the size is None where it is read at run time (every one in the general form, in the static
    form those an input leaves open: tensor<?xi64>, a size the model computes), else the type's."""
    dims = _input_dims(rep)
    open_ = set(_open_dims(rep)) if not rep.dynamic else set()
    return [(k, i, d, None if rep.dynamic or (i, d) in open_ else size) for k, (i, d, size) in enumerate(dims)]


def _size_constants(rep: Replacement) -> list[str]:
    """The general form's constant sizes (a dim the IR fixes) as index values %k<n>."""
    if not rep.dynamic:
        return []
    constants = sorted({dim[1] for dims in rep.dims.values() for dim in dims if dim[0] == "const"})
    return [f"%k{n} = arith.constant {n} : index" for n in constants]


def _dispatch_sizes(rep: Replacement) -> list[str]:
    """In the dispatch function: each size read at run time, from its i32 argument %d<k>."""
    lines = [f"%x{i}_{d} = arith.index_cast %d{k} : i32 to index" for k, i, d, size in _sized_dims(rep) if size is None]
    return lines + _size_constants(rep)


def _call_sizes(rep: Replacement) -> list[str]:
    """In the call function: each size read at run time from its tensor (%x<i>_<d>), and %d<k>,
    the i32 size of every input dimension the import is given (the type's constant where fixed)."""
    lines = []
    for k, i, d, size in _sized_dims(rep):
        if size is None:
            lines += [
                f"%i{k} = arith.constant {d} : index",
                f"%x{i}_{d} = tensor.dim %arg{i}, %i{k} : {rep.type_of(rep.group.inputs[i])}",
                f"%d{k} = arith.index_cast %x{i}_{d} : index to i32",
            ]
        else:
            lines.append(f"%d{k} = arith.constant {size} : i32")
    return lines + _size_constants(rep)


def _open_dims(rep: Replacement) -> list[tuple[int, int]]:
    """(input, dimension) of every input size the static types leave open."""
    return [(i, d) for i, d, size in _input_dims(rep) if size == 0 and program.shape(rep.group.inputs[i].type)[d] is None]


def _shaped(rep: Replacement, value: Any) -> str:
    """A type with the sizes its open dimensions need: tensor<?x?xf32>{%x0_0, %x1_1}."""
    type_text = rep.type_of(value)
    if "?" not in type_text:
        return type_text
    if rep.dynamic:
        return f"{type_text}{{{', '.join(_index_of(d) for d in rep.sizes_of(value))}}}"
    # Static form: only an input can be open (the C generators refuse an open result).
    i = next(n for n, v in enumerate(rep.group.inputs) if v == value)
    return f"{type_text}{{{', '.join(f'%x{i}_{d}' for n, d in _open_dims(rep) if n == i)}}}"


def _rank(type_: Any) -> int:
    return len(program.shape(type_))


def _input_dims(rep: Replacement) -> list[tuple[int, int, int]]:
    """(input, dimension, static size) for every dimension of every input, in order."""
    return [(i, d, size or 0) for i, value in enumerate(rep.group.inputs) for d, size in enumerate(program.shape(value.type))]


def import_signature(rep: Replacement) -> list[str]:
    """The import's MLIR argument types: (memref<elem>, index) per tensor, then i32 sizes,
    then the workgroup's id and the workgroup count (i32)."""
    tensors = [*rep.group.inputs, *rep.group.root.results, *rep.scratch]
    pairs = [t for v in tensors for t in (f"memref<{_stored(v.type)}>", "index")]
    return pairs + ["i32"] * (len(_input_dims(rep)) + 2)


def _stored(type_: Any) -> str:
    """The element type of a tensor as its buffer holds it: IREE stores i1 as one byte an
    element, so it is bound as i8 (bound as i1, the offset IREE reports counts bits)."""
    element = program.element_type(type_)
    return "i8" if element == "i1" else element


def _binding_lines(rep: Replacement, index: int, value: Any, binding: str) -> list[str]:
    element = program.element_type(value.type)
    memref = _as_stored(_memref(rep.type_of(value)), element)
    sized = _as_stored(_memref(_shaped(rep, value)), element)
    rank = _rank(value.type)
    if rank == 0:
        # A scalar tensor is read as one element of rank 1: for a rank-0 memref in a binding
        # IREE packs with others, the base pointer already points at the element and the
        # offset counts it again (Clip's bounds, a GELU's constant read past the tensor).
        memref = sized = f"memref<1x{_stored(value.type)}>"
        rank = 1
    metadata = f"memref<{_stored(value.type)}>, index" + ", index" * (2 * rank)
    names = f"%base{index}, %off{index}" + (f", %sizes{index}:{rank}, %strides{index}:{rank}" if rank else "")
    return [
        f"%m{index} = stream.binding.subspan {binding}[%c0] : !stream.binding -> {sized}",
        f"{names} = iree_codegen.extract_strided_metadata %m{index} : {memref} -> {metadata}",
    ]


def _as_stored(memref: str, element: str) -> str:
    return re.sub(r"xi1>|<i1>", lambda m: m.group(0).replace("i1", "i8"), memref) if element == "i1" else memref


def executable(rep: Replacement, *, embedded: bool) -> list[str]:
    """The stream.executable whose one function calls the import."""
    name = rep.name
    ins, outs = rep.group.inputs, [*rep.group.root.results, *rep.scratch]
    dims = _input_dims(rep)
    params = [f"%in{i}: !stream.binding" for i in range(len(ins))] + [f"%d{k}: i32" for k in range(len(dims))]
    params += [f"%out{j}: !stream.binding" for j in range(len(outs))]
    body = ["%c0 = arith.constant 0 : index", *_dispatch_sizes(rep)]
    for i, value in enumerate(ins):
        body += _binding_lines(rep, i, value, f"%in{i}")
    for j, value in enumerate(outs):
        body += _binding_lines(rep, len(ins) + j, value, f"%out{j}")
    body += [
        "%wg_id = stream.dispatch.workgroup.id[0] : index",
        "%wg_count = stream.dispatch.workgroup.count[0] : index",
        "%wg_id_i32 = arith.index_cast %wg_id : index to i32",
        "%wg_count_i32 = arith.index_cast %wg_count : index to i32",
    ]
    args = [f"%base{k}, %off{k}" for k in range(len(ins) + len(outs))] + [f"%d{k}" for k in range(len(dims))] + ["%wg_id_i32", "%wg_count_i32"]
    signature = ", ".join(import_signature(rep))
    body += [f"func.call @{name}({', '.join(args)}) : ({signature}) -> ()", "return"]
    attrs = "hal.import.static, llvm.bareptr = true" if embedded else "llvm.bareptr = true"
    objects = ""
    if embedded:
        keyed = ",\n".join(
            f'      #hal.executable.target<"llvm-cpu", "embedded-elf-{iree}"> = [#hal.executable.object<{{path = "{name}_{arch}.o"}}>]'
            for iree, arch in EMBEDDED_ARCHES
        )
        objects = f" attributes {{\n    hal.executable.objects = #hal.executable.objects<{{\n{keyed}\n    }}>\n  }}"
    return [
        f"stream.executable private @{name}_executable{objects} {{",
        *_workgroups_region(rep),
        "  builtin.module {",
        f"    func.func private @{name}({signature}) attributes {{{attrs}}}",
        f"    func.func @{name}_entry({', '.join(params)}) {{",
        *[f"      {line}" for line in body],
        "    }",
        "  }",
        "}",
    ]


def _workgroups_region(rep: Replacement) -> list[str]:
    """The export and its workgroup count: the schedule's, or with general sizes computed from
    the rows the dispatch's workload carries (one per ROWS rows, 1 to MOST)."""
    head = f"  stream.executable.export public @{rep.name}_entry"
    if rep.row_workgroups is None:
        return [
            f"{head} workgroups() -> (index, index, index) {{",
            "    %c1 = arith.constant 1 : index",
            f"    %count = arith.constant {rep.workgroups} : index",
            "    stream.return %count, %c1, %c1 : index, index, index",
            "  }",
        ]
    rows, most = rep.row_workgroups
    return [
        f"{head} workgroups(%rows: index) -> (index, index, index) {{",
        "    %c1 = arith.constant 1 : index",
        f"    %most = arith.constant {most} : index",
        f"    %tiles = affine.apply affine_map<()[s0] -> (s0 ceildiv {rows})>()[%rows]",
        "    %capped = arith.minui %tiles, %most : index",
        "    %count = arith.maxui %capped, %c1 : index",
        "    stream.return %count, %c1, %c1 : index, index, index",
        "  }",
    ]


def _rows_lines(rep: Replacement) -> tuple[list[str], str]:
    """Lines computing the rows of the result (every size but the last, multiplied) in the
    call function, and the dispatch's workload naming them ("" for a count fixed in the spec)."""
    if rep.row_workgroups is None:
        return [], ""
    sizes = [_index_of(d) for d in rep.sizes_of(rep.group.root.results[0])][:-1]
    lines, rows = ["%rows0 = arith.constant 1 : index"], "%rows0"
    for k, size in enumerate(sizes, 1):
        lines.append(f"%rows{k} = arith.muli %rows{k - 1}, {size} : index")
        rows = f"%rows{k}"
    return lines, f"[{rows}]"


# A GPU target's precompiled kernel: the executable target its object is keyed by (the generic
# key matches every variant the module is compiled for, so the spec names no GPU model) and the
# object's file name, as pyree-build spirv / ptx (sm_80: what IREE 3.13 compiles cuda modules
# for; newer GPUs JIT-compile its PTX) / hsaco (the module's own gfx directory) write it.
GPU_OBJECTS = {
    "vulkan": ('#hal.executable.target<"vulkan-spirv", "vulkan-spirv-fb">', "{name}.spv"),
    "cuda": ('#hal.executable.target<"cuda", "cuda-nvptx-fb">', "{name}_sm_80.ptx"),
    "hip": ('#hal.executable.target<"rocm", "rocm-hsaco-fb">', "{name}.co"),
}
GPU_WORKGROUP_SIZE = 64  # the generated kernel's default (gpu_source.WORKGROUP_SIZE): any size is correct
GPU_MAX_WORKGROUPS = 65535


def gpu_entry(rep: Replacement) -> str:
    """The kernel's name in its object: a GLSL shader's entry point is `main`."""
    return "main" if rep.target == "vulkan" else rep.name


def _elements(rep: Replacement) -> int:
    return math.prod(d or 0 for d in program.shape(rep.group.root.results[0].type))


def gpu_executable(rep: Replacement) -> list[str]:
    """The hal.executable.source holding the precompiled kernel: one export, its bindings the
    inputs (read-only) then the result, its push constants the inputs' sizes (i32), and as many
    workgroups as the result has elements per workgroup (at most GPU_MAX_WORKGROUPS: the
    kernel strides over the rest). Checked on IREE 3.13 with Vulkan (lavapipe)."""
    assert rep.target is not None
    key, path = GPU_OBJECTS[rep.target]
    bindings = ["#hal.pipeline.binding<storage_buffer, ReadOnly>"] * len(rep.group.inputs) + ["#hal.pipeline.binding<storage_buffer>"]
    # CUDA and HIP launch blocks of the export's workgroup_size; a Vulkan shader declares its own.
    size = "" if rep.target == "vulkan" else f" <workgroup_size = [{GPU_WORKGROUP_SIZE} : index, 1 : index, 1 : index]>"
    return [
        f"hal.executable.source private @{rep.name}_executable <{{objects = #hal.executable.objects<{{",
        f'  {key} = [#hal.executable.object<{{path = "{path.format(name=rep.name)}"}}>]',
        "}>}> {",
        f"  hal.executable.export public @{gpu_entry(rep)} ordinal(0)",
        f"      layout(#hal.pipeline.layout<constants = {len(_input_dims(rep))}, bindings = [",
        *[f"        {b}{',' if n < len(bindings) - 1 else ''}" for n, b in enumerate(bindings)],
        "      ]>) count(%device: !hal.device, %n: index) -> (index, index, index) {",
        f"    %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv {GPU_WORKGROUP_SIZE})>()[%n]",
        f"    %most = arith.constant {GPU_MAX_WORKGROUPS} : index",
        "    %count = arith.minui %groups, %most : index",
        "    %one = arith.constant 1 : index",
        "    hal.return %count, %one, %one : index, index, index",
        f"  }}{size}",
        "}",
    ]


def gpu_call_function(rep: Replacement) -> list[str]:
    """The function the rewrite calls: it dispatches the kernel over the result's elements,
    with the inputs' sizes as push constants (before the tensors, as IREE's samples write it)."""
    name, ins = rep.name, rep.group.inputs
    result_type = rep.type_of(rep.group.root.results[0])
    dims = _input_dims(rep)
    lines = _call_sizes(rep)
    lines.append(f"%n = arith.constant {_elements(rep)} : index")
    operands = [f"%d{k}" for k in range(len(dims))] + [f"%arg{i}" for i in range(len(ins))]
    operand_types = ["i32"] * len(dims) + [_shaped(rep, v) for v in ins]
    lines.append(f"%r = flow.dispatch @{name}_executable::@{gpu_entry(rep)}[%n]({', '.join(operands)}) : ({', '.join(operand_types)}) -> {result_type}")
    lines.append(f"util.return %r : {result_type}")
    args = ", ".join(f"%arg{i}: {rep.type_of(v)}" for i, v in enumerate(ins))
    return [f"util.func private @{name}_call({args}) -> {result_type} {{", *[f"  {line}" for line in lines], "}"]


def call_function(rep: Replacement) -> list[str]:
    """The function the rewrite calls with the matched inputs: it dispatches the executable."""
    if rep.target is not None:
        return gpu_call_function(rep)
    name, ins = rep.name, rep.group.inputs
    outs = [*rep.group.root.results, *rep.scratch]
    root_types = [rep.type_of(r) for r in rep.group.root.results]
    dims = _input_dims(rep)
    lines = _call_sizes(rep)
    operands = [f"%arg{i}" for i in range(len(ins))] + [f"%d{k}" for k in range(len(dims))]
    operand_types = [_shaped(rep, v) for v in ins] + ["i32"] * len(dims)
    result_types = ", ".join(_shaped(rep, v) for v in outs)
    rows, workload = _rows_lines(rep)
    lines += rows
    lines.append(
        f"%r:{len(outs)} = flow.dispatch @{name}_executable::@{name}_entry{workload}({', '.join(operands)}) : ({', '.join(operand_types)}) -> ({result_types})"
    )
    returned = ", ".join(f"%r#{j}" for j in range(len(root_types)))
    lines.append(f"util.return {returned} : {', '.join(root_types)}")
    args = ", ".join(f"%arg{i}: {rep.type_of(v)}" for i, v in enumerate(ins))
    results = root_types[0] if len(root_types) == 1 else f"({', '.join(root_types)})"
    return [f"util.func private @{name}_call({args}) -> {results} {{", *[f"  {line}" for line in lines], "}"]


def matcher(rep: Replacement) -> list[str]:
    args = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(rep.arg_types))
    return [
        f"transform.named_sequence @{rep.name}_match(%root: !transform.any_op {{transform.readonly}}) -> (!transform.any_value, !transform.any_value) {{",
        "  %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %root {",
        f"    ^bb0({args}):",
        *[f"      {line}" for line in rep.matcher],
        "  } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)",
        "  transform.yield %ins, %outs : !transform.any_value, !transform.any_value",
        "}",
    ]


def rewriter(rep: Replacement) -> list[str]:
    name = rep.name
    return [
        f"transform.named_sequence @{name}_rewrite(%ins: !transform.any_value {{transform.readonly}}, %out: !transform.any_value {{transform.readonly}}) {{",
        "  %root = transform.get_defining_op %out : (!transform.any_value) -> !transform.any_op",
        "  %program = transform.util.get_nearest_symbol_table %root : (!transform.any_op) -> !transform.any_op",
        f"  %exe = transform.util.import_symbol @{name}_executable into %program if undefined : (!transform.any_op) -> !transform.any_op",
        f"  %fn = transform.util.import_symbol @{name}_call into %program if undefined : (!transform.any_op) -> !transform.any_op",
        "  transform.util.cast_and_call %fn(%ins) -> %out after %root {",
        "    transform.type_conversion.tensor.cast_shape_dynamic_dims",
        "  } : (!transform.any_op, !transform.any_value, !transform.any_value, !transform.any_op) -> !transform.any_op",
        "  transform.yield",
        "}",
    ]


def entry(reps: list[Replacement]) -> list[str]:
    anchored = [r for r in reps if r.anchor is not None]
    walking = [r for r in reps if r.anchor is None]
    # Walking matchers compare bodies anywhere in the program, so every body gets its constants;
    # anchored ones only their own groups' (_sink_lines).
    sink = captures.spec_lines(captures.types_in([op for r in walking for op in r.group.members]))
    return [
        "transform.named_sequence @__transform_main(%program: !transform.any_op) {",
        '  %fns = transform.structured.match ops{["util.func"]} in %program : (!transform.any_op) -> !transform.any_op',
        *(f"  {line}" for line in sink),
        *_anchored_passes(anchored),
        *walking_passes(walking),
        *_inline_calls(),
        "  transform.yield",
        "}",
    ]


def dispatches_of(placed: str, name: str) -> int:
    """How many dispatches of import `name`'s kernel a program holds once a spec was applied
    (program.after_spec): each rewrite places one, inlined where the group was."""
    return len(re.findall(rf"flow\.dispatch @{re.escape(name)}_executable::", placed))


def _inline_calls() -> list[str]:
    # The rewrites leave each kernel's dispatch inside its own private function (@<name>_call),
    # and IREE's last inliner before stream conversion ran before the spec. Converted across
    # that call, every dispatch operand got a stream.async.transfer: a copy of each input into
    # a transient buffer per call, which IREE's own dispatches never pay. Worse than the copy,
    # that second allocation per call kept glibc trimming and re-faulting the heap: a 128 KB
    # elementwise group alone took 8x IREE's time on local-sync, 1.0x once inlined. Inlining
    # here (no pipeline after it, IREE canonicalizes later) puts the dispatch in the caller.
    # It runs last: it consumes the program's handle.
    return [
        '  %inlined = transform.apply_registered_pass "inline" with options = {"default-pipeline" = ""} to %program : (!transform.any_op) -> !transform.any_op'
    ]


def _anchored_passes(reps: list[Replacement]) -> list[str]:
    # Each matcher is tried on its own group's last op only (the op `anchor` names, picked out of
    # the program's ops of its name by position; `restrict_root`: that op, not what is nested in
    # it), never walked over the whole program: a matcher finds the same ops on the same types
    # wherever they are (the Q, K and V projections of an attention), and a smaller group's
    # matcher finds its ops inside a larger group, so matchers tried everywhere took each
    # other's groups and left imports uncalled. Picked out before any rewrite, every handle
    # names an op of the program as `ops` read it.
    if not reps:
        return []
    return [
        *_anchor_lines(reps),
        *_sink_lines(reps),
        *(
            f"  transform.foreach_match restrict_root in {_anchor_handle(r)} @{r.name}_match -> @{r.name}_rewrite : (!transform.any_op) -> (!transform.any_op)"
            for r in reps
        ),  # fmt: skip
        "  transform.apply_dce to %program : !transform.any_op",
    ]


def walking_passes(reps: list[Replacement]) -> list[str]:
    # The general form (--dynamic) replaces its ops wherever they are, at any sizes, in any
    # program: its matcher walks every function. One foreach_match per group, larger groups
    # first, dead ops removed after each: a small group's matcher (a lone reshape) would
    # otherwise take an op inside a larger group (the walk meets it before that group's root),
    # and the larger group's matcher, finding a call there, would leave its import uncalled.
    passes: list[str] = []
    for k, r in enumerate(sorted(reps, key=lambda r: -len(r.matcher))):
        passes += [
            # foreach_match consumes its handle: each pass finds the functions anew
            f'  %fns{k} = transform.structured.match ops{{["util.func"]}} in %program : (!transform.any_op) -> !transform.any_op',
            f"  transform.foreach %fns{k} : !transform.any_op {{",
            "    ^bb0(%fn: !transform.any_op):",
            f"      transform.foreach_match in %fn @{r.name}_match -> @{r.name}_rewrite : (!transform.any_op) -> (!transform.any_op)",
            "  }",
            "  transform.apply_dce to %program : !transform.any_op",
        ]
    return passes


def _sink_lines(reps: list[Replacement]) -> list[str]:
    """captures.sink's rewrite for the anchored groups' ops alone: each constant an op's body
    uses, found by its value (`attributes{value = ...}`), cloned into that op. Per op and
    constant, not per op and every constant of the function: on DenseNet-121 the latter was
    some 50,000 tries and minutes of iree-compile."""
    lines: list[str] = []
    done: set[tuple[str, int, int]] = set()
    for rep in reps:
        for where, values in rep.sinks:
            if where in done:
                continue  # an op two groups share (a fill) gets its constants once
            done.add(where)
            op = f"{_anchor_name(where[0])}#{where[1]}"
            fn = f"%fn_{len(done)}"
            # The generic form: the custom form cannot set this property.
            lines.append(f'  {fn} = "transform.get_parent_op"({op}) <{{isolated_from_above}}> : (!transform.any_op) -> !transform.any_op')
            for k, value in enumerate(values):
                found = f"%cst_{len(done)}_{k}"
                lines += [
                    f'  {found} = transform.structured.match ops{{["arith.constant"]}} attributes{{value = {value}}} in {fn} : (!transform.any_op) -> !transform.any_op',
                    # The function's own constant is the first found (constants head the body):
                    # later ones are clones already in bodies, and trying each of them made
                    # a value k ops use cost k^2 tries. Split off the first; the function's
                    # return pads the list (IREE 3.13's split_handle aborts on an empty rest),
                    # an op nothing else holds a handle to, so the sequence may consume it.
                    f'  {found}_end = transform.structured.match ops{{["util.return"]}} in {fn} : (!transform.any_op) -> !transform.any_op',
                    f"  {found}_padded = transform.merge_handles {found}, {found}_end, {found}_end : !transform.any_op",
                    f'  {found}_first, {found}_rest = "transform.split_handle"({found}_padded) <{{fail_on_payload_too_small = false, overflow_result = 1 : i64,'
                    " pass_through_empty_handle = true}> : (!transform.any_op) -> (!transform.any_op, !transform.any_op)",
                    f"  transform.sequence {found}_first : !transform.any_op failures(suppress) {{",
                    "    ^bb0(%constant: !transform.any_op):",
                    # not the padding (no such constant), not a clone inside a body: the function's own
                    '      transform.match.operation_name %constant ["arith.constant"] : !transform.any_op',
                    "      %parent = transform.get_parent_op %constant : (!transform.any_op) -> !transform.any_op",
                    '      transform.match.operation_name %parent ["util.func"] : !transform.any_op',
                    f"      %fused, %into = transform.structured.fuse_into_containing_op %constant into {op}"
                    " : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)",
                    "  }",
                ]
    return lines


def _anchor_name(op_name: str) -> str:
    return "%at_" + re.sub(r"\W", "_", op_name, flags=re.ASCII)


def _anchor_handle(rep: Replacement) -> str:
    if rep.anchor is None:
        raise ValueError(f"replacement {rep.name} has no anchor")  # generate() sets it
    name, position, _ = rep.anchor
    return f"{_anchor_name(name)}#{position}"


def _anchor_lines(reps: list[Replacement]) -> list[str]:
    """For each op name a group ends in: the program's ops of that name, one handle each. A
    program with fewer such ops than the spec was made for gets empty handles (its imports are
    then not called, which `compile --expect-import` reports); one with more is refused by the
    interpreter, naming both counts. (No overflow handle: IREE 3.13's split_handle aborts
    when an overflow handle would be empty.)"""
    counts: dict[str, int] = {}
    for rep in reps:
        for where in [rep.anchor, *(w for w, _ in rep.sinks)]:
            if where is not None:
                counts[where[0]] = where[2]
    lines: list[str] = []
    for name, count in counts.items():
        handle = _anchor_name(name)
        types = ", ".join(["!transform.any_op"] * count)
        lines += [
            f'  {handle}_all = transform.structured.match ops{{["{name}"]}} in %program : (!transform.any_op) -> !transform.any_op',
            # The generic form: the custom form cannot set this property.
            f'  {handle}:{count} = "transform.split_handle"({handle}_all) <{{fail_on_payload_too_small = false, pass_through_empty_handle = true}}>'
            f" : (!transform.any_op) -> ({types})",
        ]
    return lines


def spec_text(reps: list[Replacement], *, header: list[str], embedded: bool) -> str:
    """The whole spec file."""
    aliases = list(dict.fromkeys(a for r in reps for a in r.aliases))
    if len({a.split("=", 1)[0] for a in aliases}) != len(aliases):
        aliases = _renamed_aliases(reps)
    body: list[str] = []
    for rep in reps:
        made = gpu_executable(rep) if rep.target is not None else executable(rep, embedded=embedded)
        body += ["", *made, "", *call_function(rep), "", *matcher(rep), "", *rewriter(rep)]
    body += ["", *entry(reps)]
    lines = [*map(escape.c_comment, header), *aliases, "", "module attributes {transform.with_named_sequence} {"]
    lines += [f"  {line}" if line else "" for line in body]
    return "\n".join([*lines, "}", ""])


def _renamed_aliases(reps: list[Replacement]) -> list[str]:
    """Aliases of several matchers printed apart clash by name: give each replacement its own."""
    out: list[str] = []
    for k, rep in enumerate(reps):
        names = {a.split(" =", 1)[0]: f"{a.split(' =', 1)[0]}_g{k}" for a in rep.aliases}
        for old in sorted(names, key=len, reverse=True):
            rep.matcher = [_rename(line, old, names[old]) for line in rep.matcher]
        out += [_rename(a, a.split(" =", 1)[0], names[a.split(" =", 1)[0]]) for a in rep.aliases]
    return out


def _rename(line: str, old: str, new: str) -> str:
    return re.sub(rf"{re.escape(old)}(?![\w])", new, line)
