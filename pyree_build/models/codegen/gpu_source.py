"""The GPU kernels of a loop nest (loopnest.Nest, loopnest.RowNest): a GLSL compute shader
(Vulkan), CUDA C and HIP C, from the same model the C emitter (c_tiled.py) reads. This module is
the entry: the targets and their files' suffixes, the kernel's buffers (`bindings`), and `emit`,
which picks the concrete emitter (a language's forms over the per-element or the row-wise nest)
and writes the language's file. The language-neutral emitter is gpu_emitter's (`refuse`,
`Binding` and `WORKGROUP_SIZE` are importable from here too); GLSL is glsl's, CUDA and HIP C
cuda_c's.

The ABI IREE uses for a precompiled GPU executable (checked on 3.13, Vulkan on lavapipe,
CUDA and HIP compile-only): the dispatch's tensors are the bindings in order (the inputs,
then the result), each at its own start (the HAL applies a binding's offset); its i32
operands are the push constants in order (GLSL: one push_constant block; CUDA and HIP: the
kernel's parameters after the buffer pointers). The sizes passed are the inputs' sizes, as
the C kernel takes them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pyree_build.core import escape
from pyree_build.models.codegen import c_reference, cuda_c, glsl, loopnest
from pyree_build.models.codegen.cuda_c import CudaForms
from pyree_build.models.codegen.glsl import GlslForms
from pyree_build.models.codegen.gpu_emitter import WORKGROUP_SIZE as WORKGROUP_SIZE
from pyree_build.models.codegen.gpu_emitter import Binding as Binding
from pyree_build.models.codegen.gpu_emitter import GpuEmitter, Parts, RowElements, as_index
from pyree_build.models.codegen.gpu_emitter import refuse as refuse
from pyree_build.models.ir import program

# Each GPU target, the language its kernel is generated in, and that file's suffix.
TARGETS = {"vulkan": "glsl", "cuda": "cuda", "hip": "hip"}
SUFFIXES = {"glsl": ".glsl", "cuda": ".cu", "hip": ".hip"}
# Workgroups a dispatch has at most (Vulkan's guaranteed maxComputeWorkGroupCount[0] is 65535):
# beyond it each invocation computes several elements.
MAX_WORKGROUPS = 65535


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
    if TARGETS[target] == "glsl":
        return glsl.buffer_type(target, value)
    return c_reference.c_type(value.type)


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
    parts = Parts(
        head=[*map(escape.c_comment, header), ""],
        prologue=prologue,
        body=k.lines,
        total=" * ".join(as_index(emitter.nest.sizes[d], index_type) for d in emitter.nest.result_loops) or "1",
        comment=_comment(nest),
    )
    if lang == "glsl":
        return glsl.kernel_file(parts, inputs, out, sizes, emitter.glsl_helpers)
    return cuda_c.kernel_file(parts, lang, name, inputs, out, sizes, c_reference.helpers_text(k))


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


# The concrete emitters: a language's forms over the per-element or the row-wise nest.
class GlslEmitter(GlslForms):
    pass


class CudaEmitter(CudaForms):
    pass


class GlslRowEmitter(RowElements, GlslForms):
    pass


class CudaRowEmitter(RowElements, CudaForms):
    pass
