"""cuda: NVIDIA GPUs. PTX per sm from .cu sources (NVRTC or nvcc), NVPTX bitcode linked into
IREE's generated code, and the `#hal.executable.target` that keys objects for an sm."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyree_build.backends.base import Backend, CompileJob, InlineKernelSource, Option, ToolCheck, Verb, Workflow
from pyree_build.backends.options import SOURCE_OPTIONS
from pyree_build.core import lazy, toolchain

# Loaded on first use: declaring the backend (help, doctor, the registry) reads none of them.
_target = lazy.module("pyree_build.backends.cuda.target")
_ptx = lazy.module("pyree_build.backends.cuda.ptx")
_bitcode = lazy.module("pyree_build.backends.cuda.bitcode")

DEFAULT_SM = "80"
_SM_OPTION = Option(("--sm",), {"default": None, "help": "cuda target sm (default 80)"})


class CudaBackend(Backend):
    name = "cuda"
    description = "NVIDIA GPUs: PTX objects per sm, NVPTX bitcode microkernels"
    devices = ("cuda",)
    dumps = True
    compile_options = (_SM_OPTION,)
    verbs = (
        Verb(
            "ptx",
            ".cu -> one PTX per sm (NVRTC by default, or nvcc)",
            "pyree_build.backends.cuda.ptx:ptx",
            (
                Option(("source",), {"metavar": "SRC.cu"}),
                Option(("--sm",), {"dest": "sms", "action": "append", "required": True, "help": "e.g. 80 or sm_80 (repeatable)"}),
                Option(("--compiler",), {"choices": ("nvrtc", "nvcc"), "default": "nvrtc"}),
                Option(("--verify",), {"action": "store_true", "help": "assemble each PTX with ptxas for its sm"}),
                Option(
                    ("--ptx-isa",),
                    {
                        "default": "auto",
                        "metavar": "auto|native|X.Y",
                        "help": "PTX ISA version to mark the PTX with; auto (default): the newest the driver here and ptxas accept",
                    },
                ),
                Option(("-o", "--output-dir"), {"required": True, "help": "writes DIR/<stem>_sm_<N>.ptx"}),
                *SOURCE_OPTIONS,
            ),
            description=(
                "Compile a CUDA .cu file into one PTX file per sm, written as DIR/<stem>_sm_<N>.ptx, with "
                "NVRTC from PyPI (no CUDA SDK needed) or nvcc. All outputs are written or none."
            ),
            examples="pyree-build ptx kernels.cu --sm 75 --sm 80 -o build/ptx\npyree-build ptx kernels.cu --sm 80 --ptx-isa 9.0 -o build/ptx",
        ),
        Verb(
            "bitcode",
            "CUDA device code -> NVPTX LLVM bitcode per sm (zig clang, no CUDA SDK), for compile --link-bitcode",
            "pyree_build.backends.cuda.bitcode:bitcode",
            (
                Option(("source",), {"metavar": "SRC.cu"}),
                Option(("--sm",), {"dest": "sms", "action": "append", "required": True, "help": "e.g. 80 or sm_80 (repeatable)"}),
                Option(("-o", "--output-dir"), {"required": True, "help": "writes DIR/<stem>_sm_<N>.bc"}),
                *SOURCE_OPTIONS,
            ),
            description=(
                "Compile CUDA device code into NVPTX LLVM bitcode per sm (DIR/<stem>_sm_<N>.bc) with zig's "
                "clang and no CUDA SDK, for `compile --link-bitcode`: kernels IREE generates can then call "
                "its __device__ functions."
            ),
            examples="pyree-build bitcode ukernel.cu --sm 80 -o build/bitcode",
        ),
        Verb(
            "cuda-target",
            "print the #hal.executable.target that keys an sm's objects in MLIR",
            "pyree_build.backends.cuda.target:cuda_target_attr",
            (Option(("--sm",), {"required": True, "help": "e.g. 80"}),),
            description=(
                "Print the #hal.executable.target attribute that iree-compile uses for an sm; paste it as the key of that sm's PTX in #hal.executable.objects."
            ),
            examples="pyree-build cuda-target --sm 80",
        ),
    )
    tools = (
        ToolCheck("nvrtc", toolchain.nvrtc, False, ".cu -> PTX without a CUDA SDK (default)", toolchain.INSTALL_NVRTC),
        ToolCheck("nvcc", toolchain.nvcc, False, ".cu -> PTX (--compiler nvcc)", toolchain.INSTALL_NVCC),
        ToolCheck("ptxas", toolchain.ptxas, False, "checks PTX at build time (--verify)", toolchain.INSTALL_PTXAS),
    )
    workflows = (
        Workflow("CUDA PTX", build=("nvrtc|nvcc", "iree-compile"), run=("iree-run-module",), device="cuda"),
        Workflow("CUDA bitcode microkernels", build=("iree-compile",), run=("iree-run-module",), device="cuda"),
    )

    def target_flags(self, options: Mapping[str, Any]) -> list[str]:
        return _target.target_flags(options.get("sm"))

    def wants_binaries(self, job: CompileJob) -> bool:
        # Generated code that calls into bitcode compiles even when a call stays unresolved
        # (only the driver would fail): its PTX is checked at build time instead.
        return bool(job.link_bitcode or "iree_codegen.ukernel" in job.text)

    def after_compile(self, job: CompileJob, binaries: Path | None) -> None:
        if binaries is not None:
            sm = _ptx.normalize_sm(job.options.get("sm") or DEFAULT_SM)
            _bitcode.check_cuda_module(job.source, sorted(binaries.glob("*.ptx")), sm, job.link_bitcode, binaries)

    def explain(self, job: CompileJob, compiler_output: str) -> str | None:
        return _target.explain_cuda_target(job.source, job.options.get("sm"), compiler_output)

    def probe(self, device: str) -> tuple[bool, str]:
        return _target.cuda_status()

    def unusable_fix(self, device: str) -> str:
        return "run on a machine with an NVIDIA GPU and driver; `pyree-build doctor` shows what is found"

    def explain_run(self, run_output: str) -> str | None:
        return _target.explain_ptx_version(run_output)

    inline_suffixes = (".cu",)

    def build_inline_objects(self, kernel: InlineKernelSource) -> list[Path]:
        # One PTX per sm the program names (`<stem>_sm_80.ptx`), else for the sm compiled for.
        named = re.findall(rf'"{re.escape(kernel.source.stem)}_sm_(\d+)\.ptx"', kernel.program)
        sms = list(dict.fromkeys(named)) or [str(kernel.options.get("sm") or DEFAULT_SM)]
        _ptx.ptx(kernel.source, sms, kernel.build_dir, include_dirs=kernel.include_dirs, defines=kernel.defines)
        return [kernel.build_dir]


BACKEND = CudaBackend()
