"""`pyree-build doctor`: every tool, where it is, its version, and whether a CUDA GPU is usable."""
from __future__ import annotations

from typing import Callable

from . import tools
from .errors import PyreeError

# (label, finder, required, what it is for, how to install)
CHECKS: list[tuple[str, Callable[[], tools.Tool], bool, str, str]] = [
    ("iree-compile", tools.iree_compile, True, "MLIR -> .vmfb", tools.INSTALL_IREE),
    ("iree-lld", tools.iree_lld, True, "links standalone plugins", tools.INSTALL_IREE),
    ("iree-run-module", tools.iree_run_module, True, "runs modules", tools.INSTALL_IREE),
    ("iree-benchmark-module", tools.iree_benchmark_module, True, "benchmarks modules", tools.INSTALL_IREE),
    ("zig cc", lambda: tools.c_compiler("zig"), True, "default C compiler (every arch)", tools.INSTALL_ZIG),
    ("clang", lambda: tools.c_compiler("clang"), False, "optional C compiler (--cc clang)", tools.INSTALL_CLANG),
    ("gcc", lambda: tools.c_compiler("gcc"), False, "optional C compiler for system plugins (--cc gcc)", tools.INSTALL_GCC),
    ("nvrtc", tools.nvrtc, False, ".cu -> PTX without a CUDA SDK (default)", tools.INSTALL_NVRTC),
    ("nvcc", tools.nvcc, False, ".cu -> PTX (--compiler nvcc)", tools.INSTALL_NVCC),
    ("ptxas", tools.ptxas, False, "checks PTX at build time (--verify)", tools.INSTALL_PTXAS),
    ("glslang", lambda: tools.glsl_compiler("glslang"), False, "GLSL -> SPIR-V (pyree-build spirv)", tools.INSTALL_GLSLANG),
    ("glslc", lambda: tools.glsl_compiler("glslc"), False, "GLSL -> SPIR-V (spirv --compiler glslc)", tools.INSTALL_GLSLC),
    ("spirv-val", tools.spirv_val, False, "validates SPIR-V (pyree-build spirv)", tools.INSTALL_SPIRV_VAL),
    ("cmake", tools.cmake, True, "builds the samples and downstream projects", "pip install cmake"),
    ("ctest", tools.ctest, True, "runs the sample tests", "pip install cmake"),
    ("ninja", tools.ninja, True, "CMake generator", "pip install ninja"),
    ("filecheck", tools.filecheck, True, "--check-file output checks", "pip install filecheck"),
]


def report() -> int:
    """Print one line per tool and the GPU status; exit 1 only when a required tool is missing."""
    from .iree import cuda_status

    missing_required = []
    width = max(len(c[0]) for c in CHECKS)
    for label, finder, required, purpose, install in CHECKS:
        try:
            tool = finder()
            note = f" ({tool.note})" if tool.note else ""
            print(f"ok       {label:<{width}}  {tool.version:<12} {tool.path}{note}")
        except PyreeError as err:
            status = "MISSING " if required else "absent  "
            print(f"{status} {label:<{width}}  {'-':<12} {err.what}")
            print(f"{'':9}{'':<{width}}  for: {purpose}; install: {install}")
            if required:
                missing_required.append(label)
    usable, reason = cuda_status()
    if usable:
        print(f"ok       {'cuda GPU':<{width}}  {'usable':<12} {reason}")
    else:
        print(f"no GPU   {'cuda GPU':<{width}}  {'not usable':<12} {reason}")
        print(f"{'':9}{'':<{width}}  for: running CUDA modules; needs: an NVIDIA GPU and its driver (libcuda.so)")
    from .vulkan import status as vulkan_status

    vk_usable, vk_reason = vulkan_status()
    if vk_usable:
        print(f"ok       {'vulkan':<{width}}  {'usable':<12} {vk_reason}")
    else:
        print(f"absent   {'vulkan':<{width}}  {'-':<12} {vk_reason}")
    if missing_required:
        print(f"\nrequired tools missing: {', '.join(missing_required)} (see the install commands above)")
        return 1
    print("\nall required tools found" + ("" if usable else "; CUDA tests will be skipped (no usable GPU)"))
    return 0
