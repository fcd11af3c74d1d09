"""hip: AMD GPUs. AMDGPU code objects per gfx from HIP sources (zig clang + iree-lld, no ROCm)."""
from __future__ import annotations

from typing import Any, Mapping

from pyree_build.backends.base import Backend, Option, Verb, Workflow
from pyree_build.backends.options import SOURCE_OPTIONS

DEFAULT_GFX = "942"


class HipBackend(Backend):
    name = "hip"
    description = "AMD GPUs: AMDGPU code objects per gfx"
    devices = ("hip",)
    compile_options = (Option(("--gfx",), {"default": None, "help": "hip target gfx (default 942)"}),)
    verbs = (
        Verb(
            "hsaco",
            "HIP source -> one AMDGPU code object per gfx (zig clang + iree-lld, no ROCm)",
            "pyree_build.backends.hip.hsaco:hsaco",
            (
                Option(("source",), {"metavar": "SRC.cu|SRC.hip"}),
                Option(("--gfx",), {"dest": "gfxs", "action": "append", "required": True, "help": "e.g. 942 or gfx942 (repeatable)"}),
                Option(("-o", "--output-dir"), {"required": True, "help": "writes DIR/gfx<N>/<stem>.co"}),
                *SOURCE_OPTIONS,
            ),
            description=(
                "Compile a HIP source into an AMDGPU code object per gfx (DIR/gfx<N>/<stem>.co) with zig's "
                "clang and iree-lld, no ROCm needed; each object's ELF flags are checked against its gfx, "
                "since iree-compile embeds an object of any gfx without a word."
            ),
            examples="pyree-build hsaco kernels.cu --gfx 942 --gfx 1100 -o build/hsaco",
        ),
        Verb(
            "code-objects",
            "list the AMDGPU code objects a .vmfb embeds; --gfx N checks one is there",
            "pyree_build.backends.hip.hsaco:code_objects",
            (
                Option(("module",), {"metavar": "MODULE.vmfb"}),
                Option(("--gfx",), {"dest": "gfxs", "action": "append", "default": [], "help": "fail unless a code object for this gfx is embedded (repeatable)"}),
            ),
            description=(
                "List the AMDGPU code objects a .vmfb embeds, with the gfx each was built for; with --gfx, "
                "fail unless one for that gfx is there."
            ),
            examples="pyree-build code-objects build/hip_example.vmfb --gfx 942",
        ),
    )
    workflows = (Workflow("HIP code objects", build=("iree-lld", "iree-compile"), run=("iree-run-module",), device="hip"),)

    def target_flags(self, options: Mapping[str, Any]) -> list[str]:
        from pyree_build.backends.hip.hsaco import normalize_gfx

        return ["--iree-hal-target-device=hip", f"--iree-rocm-target={normalize_gfx(options.get('gfx') or DEFAULT_GFX)}"]


BACKEND = HipBackend()
