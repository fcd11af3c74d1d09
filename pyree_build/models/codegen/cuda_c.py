"""CUDA C and HIP C kernels from the GPU emitter: C's types, expressions and helpers with
buffers as pointers (`CudaForms`), and the kernel file around the element loop (NVRTC's
fixed-width types for CUDA, hip_runtime.h for HIP; c_reference's helpers as device functions).
"""

from __future__ import annotations

from typing import Any

from pyree_build.models.codegen import c_reference
from pyree_build.models.codegen.gpu_emitter import WORKGROUP_SIZE, Binding, GpuEmitter, Parts, knob_lines


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


def kernel_file(parts: Parts, lang: str, name: str, inputs: list[Binding], out: Binding, sizes: list[str], helpers: list[str]) -> str:
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
        *knob_lines(WORKGROUP_SIZE),
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
