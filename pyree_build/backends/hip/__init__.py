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
        ),
        Verb(
            "code-objects",
            "list the AMDGPU code objects a .vmfb embeds; --gfx N checks one is there",
            "pyree_build.backends.hip.hsaco:code_objects",
            (
                Option(("module",), {"metavar": "MODULE.vmfb"}),
                Option(("--gfx",), {"dest": "gfxs", "action": "append", "default": [], "help": "fail unless a code object for this gfx is embedded (repeatable)"}),
            ),
        ),
    )
    workflows = (Workflow("HIP code objects", build=("iree-lld", "iree-compile"), run=("iree-run-module",), device="hip"),)

    def target_flags(self, options: Mapping[str, Any]) -> list[str]:
        from pyree_build.backends.hip.hsaco import normalize_gfx

        return ["--iree-hal-target-device=hip", f"--iree-rocm-target={normalize_gfx(options.get('gfx') or DEFAULT_GFX)}"]


BACKEND = HipBackend()
