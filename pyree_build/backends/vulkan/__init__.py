"""vulkan: Vulkan devices (GPUs, or lavapipe on the CPU). GLSL compute shaders -> validated
SPIR-V, and the --iree-vulkan-target that computes correctly on the device here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyree_build.backends.base import Backend, InlineKernelSource, Option, ToolCheck, Verb, Workflow
from pyree_build.backends.options import SOURCE_OPTIONS
from pyree_build.core import lazy, toolchain

# Loaded on first use: declaring the backend (help, doctor, the registry) reads it not.
_devices = lazy.module("pyree_build.backends.vulkan.devices")
_spirv = lazy.module("pyree_build.backends.vulkan.spirv")
_modules = lazy.module("pyree_build.backends.vulkan.modules")


class VulkanBackend(Backend):
    name = "vulkan"
    description = "Vulkan devices: SPIR-V shaders from GLSL"
    devices = ("vulkan",)
    # IREE's Python runtime cannot read results back on every Vulkan device (lavapipe).
    runs_in_process = False
    # lavapipe compiles each shader with LLVM on its first dispatch in a process: a SqueezeNet
    # module's 29 cost about one run (docs/models-at-scale.md: "Vulkan on lavapipe"); only Mesa's shader cache on
    # disk, where it is on and holds them, spares a later process that.
    pipelines_per_process = True
    compile_options = (Option(("--vulkan-target",), {"default": None, "help": "vulkan: auto (default: the Vulkan device here), llvmpipe, ampere, rdna3, ..."}),)
    verbs = (
        Verb(
            "spirv",
            "GLSL compute shaders -> SPIR-V (.spv), validated with spirv-val",
            "pyree_build.backends.vulkan.spirv:spirv",
            (
                Option(("sources",), {"nargs": "+", "metavar": "SHADER.glsl"}),
                Option(("-o", "--output-dir"), {"required": True, "help": "writes DIR/<stem>.spv"}),
                Option(("--compiler",), {"choices": ("glslang", "glslc"), "default": "glslang", "help": "glslang (default; pip) or glslc (shaderc)"}),
                *SOURCE_OPTIONS,
            ),
            description=(
                "Compile GLSL compute shaders into SPIR-V, one DIR/<stem>.spv per shader, with glslang "
                "(from PyPI, the default) or glslc, and validate each with spirv-val. A module references "
                "them from #hal.executable.objects and finds them on an object search path."
            ),
            examples="pyree-build spirv simple_mul.glsl simple_mul_inplace.glsl -o build/spirv",
        ),
    )
    tools = (
        ToolCheck("glslang", lambda: toolchain.glsl_compiler("glslang"), False, "GLSL -> SPIR-V (pyree-build spirv)", toolchain.INSTALL_GLSLANG),
        ToolCheck("glslc", lambda: toolchain.glsl_compiler("glslc"), False, "GLSL -> SPIR-V (spirv --compiler glslc)", toolchain.INSTALL_GLSLC),
        ToolCheck("spirv-val", toolchain.spirv_val, False, "validates SPIR-V (pyree-build spirv)", toolchain.INSTALL_SPIRV_VAL),
    )
    workflows = (Workflow("Vulkan SPIR-V shaders", build=("glslang|glslc", "spirv-val", "iree-compile"), run=("iree-run-module",), device="vulkan"),)

    def target_flags(self, options: Mapping[str, Any]) -> list[str]:
        return ["--iree-hal-target-device=vulkan", f"--iree-vulkan-target={_devices.resolve_target(options.get('vulkan_target') or 'auto')}"]

    def probe(self, device: str) -> tuple[bool, str]:
        return _devices.status()

    def check_module(self, module: Path, device: str) -> None:
        _modules.check_runs_on(module, device)

    def unusable_fix(self, device: str) -> str:
        return "install a Vulkan driver (CPU-only Debian: apt-get install mesa-vulkan-drivers); `pyree-build doctor` lists Vulkan devices"

    inline_suffixes = (".glsl", ".comp")

    def build_inline_objects(self, kernel: InlineKernelSource) -> list[Path]:
        _spirv.spirv([kernel.source], kernel.build_dir, include_dirs=kernel.include_dirs, defines=kernel.defines)
        return [kernel.build_dir]


BACKEND = VulkanBackend()
