"""CUDA device code -> NVPTX LLVM bitcode (`<stem>_sm_<N>.bc`) for iree-compile to link
into the kernels it generates (`--iree-link-bitcode`), so they can call `__device__`
microkernels written in CUDA.

ziglang's clang compiles it with no CUDA SDK: `--cuda-path` points at an empty directory
(without it clang silently uses a system CUDA if there is one) and the few definitions
device code expects come from pyree_build's force-included `pyree_build/cuda_device.h`.
NVRTC's LTO output is not LLVM bitcode, so NVRTC cannot do this. The bitcode asks for
PTX ISA 7.6, the ISA of IREE 3.13's own CUDA code, so linking never raises it.

Linked code that leaves a call unresolved still compiles: iree-compile writes PTX with
an `.extern .func` that only fails when the driver loads it. `check_cuda_module` finds
those at build time (and runs ptxas on the PTX where one is found).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from pyree_build.backends.cuda.ptx import normalize_sm
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

PTX_FEATURE = "+ptx76"
_BITCODE_MAGIC = b"BC\xc0\xde"
_EXTERN_FUNC = re.compile(r"^\s*\.extern\s+\.func\s+(?:\([^)]*\)\s*)?([\w$]+)", re.MULTILINE)


def _device_header() -> Path:
    return toolchain.include_dir() / "pyree_build" / "cuda_device.h"


def bitcode(
    source: PathLike,
    sms: Sequence[str | int],
    output_dir: PathLike,
    *,
    include_dirs: Sequence[PathLike] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
) -> list[Path]:
    """Compile CUDA device code to `<output_dir>/<stem>_sm_<N>.bc` per sm; all are written or none."""
    src = require_file(source, "CUDA source").resolve()
    sm_list = list(dict.fromkeys(normalize_sm(s) for s in sms))
    if not sm_list:
        raise PyreeError("no sm given", fix="pass at least one --sm, e.g. --sm 80")
    out_dir = Path(output_dir)
    outputs = {sm: out_dir / f"{src.stem}_sm_{sm}.bc" for sm in sm_list}
    check_outputs(outputs.values(), [src, *included_files([src], include_dirs)], depfile=depfile, output_dirs=[out_dir])
    clang = toolchain.zig_clang()
    incs = [Path(d).resolve() for d in include_dirs]
    options = [
        "-x", "cuda", "--cuda-device-only", "-nocudalib", "-nocudainc", f"--cuda-feature={PTX_FEATURE}",
        "-include", str(_device_header()), *(f"-I{d}" for d in incs), *(f"-D{d}" for d in defines),
        "-O3", "-c", "-emit-llvm",
    ]  # fmt: skip

    job = _BitcodeJob(src, sm_list, out_dir, clang, options, jobs)
    headers = header_lookups([src], incs)
    key = [*map(str, sm_list), *options]
    cached_action(
        "bitcode",
        key=key,
        inputs=[src],
        outputs=[outputs[sm] for sm in sm_list],
        build=job.build,
        tools_used=[clang],
        headers=headers,
        check=formats.magic_check(_BITCODE_MAGIC, "LLVM bitcode"),
        depfile=depfile,
    )
    return [outputs[sm] for sm in sm_list]


@record(frozen=True)
class _BitcodeJob:
    """One `bitcode` call, planned: what cached_action's build step needs to make every sm's bitcode."""

    src: Path
    sm_list: list[int]
    out_dir: Path
    clang: toolchain.Tool
    options: list[str]
    jobs: int | None

    def build(self, private: list[Path]) -> list[str]:
        """Compile every sm in a scratch directory, then move them to `private` (in sm order); the dependencies."""
        with scratch_dir(self.out_dir, self.src.name) as build:
            no_sdk = build / "no-cuda-sdk"  # empty on purpose: see the module docstring
            no_sdk.mkdir()
            with echo.Stopwatch(f"zig clang {self.src.name} -> bitcode sm {', '.join(map(str, self.sm_list))}"), processes.thread_pool(self.jobs) as pool:
                built = dict(zip(self.sm_list, pool.map(functools.partial(self.compile_one, build, no_sdk), self.sm_list)))
            for sm, tmp in zip(self.sm_list, private):  # renamed into place once all are written
                os.replace(built[sm][0], tmp)
        return list(dict.fromkeys(str(Path(d).resolve()) for r in built.values() for d in r[1]))

    def compile_one(self, build: Path, no_sdk: Path, sm: int) -> tuple[Path, list[str]]:
        """One sm's bitcode and the files it read."""
        src = self.src
        bc, dep = build / f"sm_{sm}.bc", build / f"sm_{sm}.d"
        processes.spawn(
            self.clang.command(*self.options, f"--cuda-gpu-arch=sm_{sm}", f"--cuda-path={no_sdk}", "-MD", "-MF", dep, src, "-o", bc),
            what=f"compiling {src.name} to sm_{sm} bitcode with zig clang",
            file=src,
            fix="fix the error at the file:line shown above",
        )
        with bc.open("rb") as f:
            if f.read(4) != _BITCODE_MAGIC:
                raise PyreeError(f"zig clang wrote no LLVM bitcode for sm_{sm}", file=src, fix="run with -v and report the command")
        named = [str(src), *(o[2:] for o in self.options if o.startswith("-I"))]  # zig's clang writes a `\` of them as `/`
        return bc, parse_depfile(dep, named=named) if dep.is_file() else [str(src)]


def unresolved_functions(ptx: str) -> list[str]:
    """Functions a PTX file declares `.extern` (called, never defined): the driver cannot load it."""
    return list(dict.fromkeys(_EXTERN_FUNC.findall(ptx)))


def check_cuda_module(source: Path, ptx_files: Sequence[Path], sm: int, linked: Sequence[Path], build: Path) -> None:
    """After a cuda compile: no generated PTX may call a function nothing defined, and each
    must assemble with ptxas for its sm where a ptxas is found (toolkit or wheel)."""
    for ptx in ptx_files:
        missing = unresolved_functions(ptx.read_text(encoding="utf-8", errors="replace"))
        if missing:
            raise PyreeError(
                f"the generated CUDA code calls {', '.join(missing)}, which no linked bitcode defines",
                file=source,
                details=f"unresolved `.extern .func` in {ptx.name}; linked bitcode: {', '.join(map(str, linked)) or 'none'}",
                fix="link the bitcode that defines it (--link-bitcode FILE.bc, from `pyree-build bitcode`), declared "
                'extern "C" __device__ with exactly that name',
            )
    try:
        ptxas = toolchain.ptxas()
    except PyreeError:
        echo.log_step('  note: no ptxas found (pip install "pyree_build[ptxas]"); the PTX was checked for unresolved calls only')
        return
    for i, ptx in enumerate(ptx_files):
        processes.spawn(
            ptxas.command(f"-arch=sm_{sm}", ptx, "-o", build / f"check{i}.cubin"),
            what=f"assembling the generated sm_{sm} PTX with ptxas",
            file=source,
            fix="the generated code does not assemble for this sm; check the linked bitcode's sm and PTX features",
        )
