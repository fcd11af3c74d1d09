"""hip: AMD GPUs. AMDGPU code objects per gfx from HIP sources (zig clang + iree-lld, no ROCm)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyree_build.backends.base import Backend, CompileJob, InlineKernelSource, Option, Verb, Workflow
from pyree_build.backends.options import SOURCE_OPTIONS
from pyree_build.core import lazy
from pyree_build.core import toolchain as _toolchain

# Loaded on first use: declaring the backend (help, doctor, the registry) reads neither.
_hsaco = lazy.module("pyree_build.backends.hip.hsaco")
# Every command loads the built-in backends' declarations: what only a hip compile needs loads then.
_inputs = lazy.module("pyree_build.core.inputs")
_devices = lazy.module("pyree_build.backends.hip.devices")

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
                Option(("-o", "--output-dir"), {"required": True, "help": "writes DIR/gfx<N>/<stem>.co (--layout flat: DIR/<stem>_gfx<N>.co)"}),
                Option(
                    ("--layout",),
                    {
                        "choices": ("dirs", "flat"),
                        "default": "dirs",
                        "help": "dirs: DIR/gfx<N>/<stem>.co (default); flat: DIR/<stem>_gfx<N>.co, IREE's sample names",
                    },
                ),
                *SOURCE_OPTIONS,
            ),
            description=(
                "Compile a HIP source into an AMDGPU code object per gfx (DIR/gfx<N>/<stem>.co, or with "
                "--layout flat DIR/<stem>_gfx<N>.co as IREE's samples name them) with zig's clang and iree-lld, "
                "no ROCm needed; each object's ELF flags are checked against its gfx, since iree-compile embeds "
                "an object of any gfx without a word."
            ),
            examples="pyree-build hsaco kernels.cu --gfx 942 --gfx 1100 -o build/hsaco\npyree-build hsaco kernels.cu --gfx 1100 --layout flat -o build/hip  # build/hip/kernels_gfx1100.co",
        ),
        Verb(
            "code-objects",
            "list the AMDGPU code objects a .vmfb embeds; --gfx N checks one is there",
            "pyree_build.backends.hip.hsaco:code_objects",
            (
                Option(("module",), {"metavar": "MODULE.vmfb"}),
                Option(
                    ("--gfx",), {"dest": "gfxs", "action": "append", "default": [], "help": "fail unless a code object for this gfx is embedded (repeatable)"}
                ),
            ),
            description=("List the AMDGPU code objects a .vmfb embeds, with the gfx each was built for; with --gfx, fail unless one for that gfx is there."),
            examples="pyree-build code-objects build/hip_example.vmfb --gfx 942",
        ),
    )
    workflows = (Workflow("HIP code objects", build=("iree-lld", "iree-compile"), run=("iree-run-module",), device="hip"),)

    def target_flags(self, options: Mapping[str, Any]) -> list[str]:
        return ["--iree-hal-target-device=hip", f"--iree-rocm-target={_gfx(options)}"]

    def search_paths(self, job: CompileJob) -> list[Path]:
        # `pyree-build hsaco` writes DIR/gfx<N>/<stem>.co: search the target's own first.
        gfx_dir = _gfx(job.options)
        return [*(s / gfx_dir for s in job.search_paths if (s / gfx_dir).is_dir()), *job.search_paths]

    def before_compile(self, job: CompileJob) -> None:
        # iree-compile embeds an object for any gfx: refuse one built for another here.
        objects = [found for obj in _inputs.referenced_objects(job.text) if (found := _inputs.resolve_object(obj, job.search_paths)[0])]
        _hsaco.check_module_objects(objects, _gfx(job.options))

    def explain(self, job: CompileJob, compiler_output: str) -> str | None:
        if "no objects defined for external variant" not in compiler_output:
            return None
        keyed = sorted({m["config"].strip() for m in _KEYED_TARGET.finditer(job.text) if m["config"] and "iree_codegen.target_info" not in m["config"]})
        if not keyed:
            return None
        errors = "\n".join(line for line in compiler_output.splitlines() if "error:" in line)
        return (
            f"{job.source.name} keys its objects with a hip/rocm target that has a configuration ({'; '.join('{' + k + '}' for k in keyed)}); "
            f"iree-compile {_toolchain.iree_compile().version} matches such a key only against the whole target it compiles for "
            f"(its GPU description for {_gfx(job.options)}), so it matches nothing.\n"
            'Key the objects with the bare `#hal.executable.target<"rocm", "rocm-hsaco-fb">`: it matches every gfx, and '
            "compile picks the code object of the --gfx it targets from the search path (`pyree-build hsaco -o DIR` writes "
            "DIR/gfxN/NAME.co).\n(iree-compile said:)\n" + errors
        )

    def probe(self, device: str) -> tuple[bool, str]:
        return _devices.hip_status()

    def unusable_fix(self, device: str) -> str:
        return "run on a machine with an AMD GPU and ROCm; `pyree-build doctor` shows what is found"

    inline_suffixes = (".hip", ".cu")  # IREE's HIP samples name their kernels .cu too

    def build_inline_objects(self, kernel: InlineKernelSource) -> list[Path]:
        gfx = _gfx(kernel.options)
        _hsaco.hsaco(kernel.source, [gfx], kernel.build_dir, include_dirs=kernel.include_dirs, defines=kernel.defines)
        return [kernel.build_dir / gfx]


# An object key as a program writes it: `#hal.executable.target<"rocm", "FORMAT", {...}>`.
_KEYED_TARGET = re.compile(r'#hal\.executable\.target<\s*"(?:rocm|hip)"\s*,\s*"[^"]*"\s*(?:,\s*\{(?P<config>.*?)\})?\s*>', re.DOTALL)


def _gfx(options: Mapping[str, Any]) -> str:
    return _hsaco.normalize_gfx(options.get("gfx") or DEFAULT_GFX)


BACKEND = HipBackend()
