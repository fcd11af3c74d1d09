"""HIP device code -> AMDGPU code objects (`.co`), one per gfx, without ROCm.

ziglang's clang compiles the `.cu`/`.hip` source to AMDGPU LLVM bitcode against the
stand-in `hip/hip_runtime.h` shipped in pyree_build/include, and the compiler wheel's
iree-lld links it into a code object. iree-compile embeds whatever object it is given
under the generic `rocm-hsaco-fb` key without looking at its GPU, so every object is
checked here: its ELF `e_flags` name the gfx it was built for.
"""

from __future__ import annotations

import functools
import io
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from pyree_build.cache.local import cached_action
from pyree_build.core import echo, lazy, processes, readers, toolchain
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import scratch_dir
from pyree_build.core.inputs import c_includes
from pyree_build.core.outputs import check_outputs, included_files
from pyree_build.core.records import record

elffile = lazy.module("elftools.elf.elffile")  # only to name a code object's kernels

PathLike = str | os.PathLike[str]

EM_AMDGPU = 224
# EF_AMDGPU_MACH_* (the low byte of e_flags) for the gfx names ziglang's clang builds;
# each value is checked against a freshly built object by the tests.
GFX_MACH = {
    "gfx900": 0x2C, "gfx906": 0x2F, "gfx908": 0x30, "gfx90a": 0x3F, "gfx942": 0x4C, "gfx950": 0x4F,
    "gfx1030": 0x36, "gfx1100": 0x41, "gfx1101": 0x46, "gfx1102": 0x47, "gfx1150": 0x43, "gfx1151": 0x4A,
    "gfx1200": 0x48, "gfx1201": 0x4E,
}  # fmt: skip
_MACH_GFX = {v: k for k, v in GFX_MACH.items()}


def normalize_gfx(gfx: str | int) -> str:
    """'942', 'gfx942' and 942 all mean gfx942; the name must be one pyree_build knows."""
    text = str(gfx).strip().lower().removeprefix("gfx")
    name = f"gfx{text}"
    if name not in GFX_MACH:
        raise PyreeError(
            f"'{gfx}' is not a known AMD GPU (gfx) target",
            fix=f"use one of: {', '.join(k.removeprefix('gfx') for k in GFX_MACH)} (e.g. --gfx 942 for MI300)",
        )
    return name


@record(frozen=True)
class CodeObject:
    gfx: str | None  # None: a machine byte pyree_build does not know
    mach: int
    kernels: tuple[str, ...]
    size: int


def read_code_object(data: bytes, *, where: str = "") -> CodeObject:
    """The gfx and kernels of an AMDGPU code object (a 64-bit little-endian ELF)."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise PyreeError("not an ELF file", file=where or None, fix="build code objects with `pyree-build hsaco`")
    machine = struct.unpack_from("<H", data, 18)[0]
    if machine != EM_AMDGPU:
        raise PyreeError(f"an ELF for machine {machine}, not AMDGPU ({EM_AMDGPU})", file=where or None, fix="build code objects with `pyree-build hsaco`")
    flags = struct.unpack_from("<I", data, 48)[0]
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 40)[0], *struct.unpack_from("<HH", data, 58)
    size = max(shoff + shentsize * shnum, 64)
    kernels: list[str] = []
    try:  # pyelftools missing (ImportError, here at first use) lands in the except too
        elf = elffile.ELFFile(io.BytesIO(data[:size]))
        symtab = elf.get_section_by_name(".dynsym") or elf.get_section_by_name(".symtab")
        if symtab is not None:
            kernels = sorted({s.name[: -len(".kd")] for s in symtab.iter_symbols() if s.name.endswith(".kd")})
    except Exception:  # kernel names are informative; the gfx check does not need them
        kernels = []
    mach = flags & 0xFF
    return CodeObject(_MACH_GFX.get(mach), mach, tuple(kernels), size)


def check_code_object(path: PathLike, gfx: str) -> CodeObject:
    """Raise unless the code object at `path` was built for `gfx`."""
    obj = read_code_object(Path(path).read_bytes(), where=str(path))
    if obj.mach != GFX_MACH[gfx]:
        built = obj.gfx or f"machine byte 0x{obj.mach:02x}"
        raise PyreeError(
            f"code object is for {built}, not {gfx}",
            file=path,
            fix=f"rebuild it for {gfx} (`pyree-build hsaco SRC --gfx {gfx.removeprefix('gfx')}`), or compile the module for {built}",
        )
    return obj


def embedded_code_objects(module: PathLike) -> list[CodeObject]:
    """Every AMDGPU code object inside a .vmfb (IREE stores them uncompressed)."""
    data = readers.read_module(module)
    found, at = [], data.find(b"\x7fELF")
    while at >= 0:
        if len(data) >= at + 64 and struct.unpack_from("<H", data, at + 18)[0] == EM_AMDGPU:
            obj = read_code_object(data[at:], where=str(module))
            found.append(obj)
            at = data.find(b"\x7fELF", at + obj.size)
        else:
            at = data.find(b"\x7fELF", at + 4)
    return found


LAYOUTS = ("dirs", "flat")


def hsaco(
    source: PathLike,
    gfxs: Sequence[str | int],
    output_dir: PathLike,
    *,
    include_dirs: Sequence[PathLike] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
    layout: str = "dirs",
) -> list[Path]:
    """Compile one HIP source to a code object per gfx; all are written or none.

    `layout="dirs"` writes `<output_dir>/gfx<N>/<stem>.co`: one directory per gfx, each
    holding objects under the one name the MLIR uses, so a `--target hip --gfx N` compile
    finds the right one. `layout="flat"` writes `<output_dir>/<stem>_gfx<N>.co`, the names
    IREE's own samples reference per target (`kernels_gfx1100.co`).
    """
    src = require_file(source, "HIP source").resolve()
    gfx_list = list(dict.fromkeys(normalize_gfx(g) for g in gfxs))
    if not gfx_list:
        raise PyreeError("no gfx given", fix="pass at least one --gfx, e.g. --gfx 942")
    if layout not in LAYOUTS:
        raise PyreeError(f"unknown layout '{layout}'", fix=f"use one of: {', '.join(LAYOUTS)}")
    out_dir = Path(output_dir)
    outputs = {g: out_dir / g / f"{src.stem}.co" if layout == "dirs" else out_dir / f"{src.stem}_{g}.co" for g in gfx_list}
    check_outputs(outputs.values(), [src, *included_files([src], include_dirs)], depfile=depfile, output_dirs=[out_dir])
    clang, lld = toolchain.zig_clang(), toolchain.iree_lld()
    incs = [Path(d).resolve() for d in include_dirs]
    options = [
        "-x", "hip", "--offload-device-only", "-nogpulib", "-nogpuinc", f"-I{toolchain.include_dir()}", *(f"-I{d}" for d in incs),
        *(f"-D{d}" for d in defines), "-fuse-cuid=none", "-O3", "-mcode-object-version=5", "-emit-llvm", "-c",
    ]  # fmt: skip

    # clang writes no depfile in this mode: the headers are found before it runs.
    headers = c_includes(src, [src.parent, toolchain.include_dir(), *incs])
    job = _HsacoJob(src, gfx_list, out_dir, clang, lld, options, [str(h) for h in headers.files], jobs)
    key = [*gfx_list, *options]
    cached_action("hsaco", key=key, inputs=[src], outputs=[outputs[g] for g in gfx_list], build=job.build, tools_used=[clang, lld], headers=headers,
                  check=functools.partial(_check_objects, gfx_list), depfile=depfile)  # fmt: skip
    return [outputs[g] for g in gfx_list]


@record(frozen=True)
class _HsacoJob:
    """One `hsaco` call, planned: what cached_action's build step needs to make every gfx's object."""

    src: Path
    gfx_list: list[str]
    out_dir: Path
    clang: toolchain.Tool
    lld: toolchain.Tool
    options: list[str]
    deps: list[str]
    jobs: int | None

    def build(self, private: list[Path]) -> list[str]:
        """Build every gfx in a scratch directory, then move them to `private` (in gfx order); the dependencies."""
        with scratch_dir(self.out_dir, self.src.name) as build:
            with echo.Stopwatch(f"zig clang + iree-lld {self.src.name} -> {', '.join(self.gfx_list)}"), processes.thread_pool(self.jobs) as pool:
                built = dict(zip(self.gfx_list, pool.map(functools.partial(self.build_one, build), self.gfx_list)))
            for g, tmp in zip(self.gfx_list, private):  # renamed into place once all are written
                os.replace(built[g], tmp)
        return list(self.deps)

    def build_one(self, build: Path, gfx: str) -> Path:
        """Compile to bitcode, link the code object, and check it is for `gfx` and has kernels."""
        src = self.src
        bc, co = build / f"{gfx}.bc", build / f"{gfx}.co"
        processes.spawn(
            self.clang.command(*self.options, f"--offload-arch={gfx}", src, "-o", bc),
            what=f"compiling {src.name} for {gfx} with zig clang",
            file=src,
            fix="fix the error at the file:line shown above",
        )
        processes.spawn(
            self.lld.command(
                "-flavor",
                "gnu",
                "-m",
                "elf64_amdgpu",
                "--no-undefined",
                "-shared",
                "-plugin-opt=-amdgpu-internalize-symbols",
                f"-plugin-opt=mcpu={gfx}",
                "-plugin-opt=O3",
                bc,
                "-o",
                co,
            ),  # fmt: skip
            what=f"linking the {gfx} code object with iree-lld",
            file=src,
            explain=_explain_link,
            fix="define every __device__ function the kernels call in this source",
        )
        obj = check_code_object(co, gfx)
        if not obj.kernels:
            raise PyreeError(f"the {gfx} code object has no kernels", file=src, fix='declare each kernel as extern "C" __global__')
        return co


def _explain_link(text: str) -> str | None:
    undefined = re.findall(r"undefined (?:hidden )?symbol: (.+?)\s*$", text, flags=re.MULTILINE)
    if undefined:
        return f"the code object would call functions that nothing defines: {', '.join(dict.fromkeys(undefined))}\n" + text
    return None


def _check_objects(gfx_list: Sequence[str], paths: Sequence[Path]) -> None:
    for path, gfx in zip(paths, gfx_list):
        check_code_object(path, gfx)


def check_module_objects(objects: Sequence[Path], gfx: str) -> None:
    """Before a hip compile: every referenced AMDGPU object must be for the target's gfx."""
    for obj in objects:
        with obj.open("rb") as f:
            head = f.read(20)
        if head[:4] == b"\x7fELF" and len(head) >= 20 and struct.unpack_from("<H", head, 18)[0] == EM_AMDGPU:
            check_code_object(obj, gfx)


def describe(objects: Sequence[CodeObject]) -> str:
    lines = [f"{o.gfx or f'machine 0x{o.mach:02x}'}  {o.size:>8} bytes  {', '.join(o.kernels) or '(no kernels)'}" for o in objects]
    return "\n".join(lines) if lines else "(no AMDGPU code objects)"


def code_objects(module: PathLike, gfxs: Sequence[str] = ()) -> str:
    """`code-objects`: the listing of the code objects `module` embeds; a PyreeError when
    one of `gfxs` has none."""
    objects = embedded_code_objects(module)
    have = {o.gfx for o in objects}
    missing = [g for g in dict.fromkeys(normalize_gfx(x) for x in gfxs) if g not in have]
    if missing:
        print(describe(objects))  # what is there, before the error says what is not
        raise PyreeError(
            f"the module embeds no code object for {', '.join(missing)}",
            file=module,
            fix="compile it with --target hip --gfx N for that gfx, with the code objects from `pyree-build hsaco --gfx N`",
        )
    return describe(objects)
