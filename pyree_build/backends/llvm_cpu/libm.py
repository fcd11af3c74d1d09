"""A freestanding math library per arch, for standalone plugins and embedded objects.

IREE's own ELF loader links no library, so `expf` in a standalone plugin has nothing to bind
to, and an embedded object is linked into the module by iree-lld with no libc either. The
functions of pyree_build's <math.h> (include/freestanding/math.h) therefore come from a
static library built here, once per arch and zig version (kept beside the cache entries),
from what the ziglang wheel ships: compiler_rt (exp, log, sqrt, sin, cos, floor, fmin, ...),
a few musl sources (pow, erf, atan2) and libm.zig (std.math wrappers for the rest).

It is linked only into code that calls one of those functions, and then only the functions
called (archive members, --gc-sections). Everything in it is position independent, hidden
and weak: a plugin exports nothing extra, a function the user defines wins, and two objects
carrying the same function link together. None of it writes errno or uses thread-local data
(musl's math reports through floating-point exceptions only), which the loader could not map.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pyree_build.backends.llvm_cpu.elf import read_elf
from pyree_build.cache import keys
from pyree_build.cache.local import cached_action, work_dir
from pyree_build.core import echo, lazy, processes, toolchain
from pyree_build.core.errors import PyreeError

elffile = lazy.module("elftools.elf.elffile")

HEADER_DIR = toolchain.include_dir() / "freestanding"
ZIG_SOURCE = Path(__file__).with_name("libm.zig")
WEAK_HEADER = Path(__file__).with_name("libm_weak.h")  # see MUSL_SOURCES

# Taken as they are from musl (lib/libc/musl/src/math in the ziglang wheel): the table-driven
# pow and powf (correctly rounded in practice; zig's std.math.pow is a looser port), erf,
# erfc and atan2, and what they call; each with the global symbols it defines. Those are
# made weak in that file only (libm_weak.h, `#pragma weak` before the code): in a file that
# merely refers to one, a weak reference would not pull the member that defines it out of
# the archive. The library check below fails the build if this table falls behind the sources.
MUSL_SOURCES = {
    "pow.c": ("pow",), "pow_data.c": ("__pow_log_data",), "exp_data.c": ("__exp_data",),
    "powf.c": ("powf",), "powf_data.c": ("__powf_log2_data",), "exp2f_data.c": ("__exp2f_data",),
    "erf.c": ("erf", "erfc"), "erff.c": ("erff", "erfcf"), "atan2.c": ("atan2",), "atan2f.c": ("atan2f",),
    **{f"__math_{kind}{suffix}.c": (f"__math_{kind}{suffix}",) for kind in ("oflow", "uflow", "xflow", "invalid", "divzero") for suffix in ("", "f")},
}  # fmt: skip
# musl's own build flags (its Makefile), for code that must not assume the default rounding
# or strict aliasing; hidden so nothing becomes a plugin export.
MUSL_CFLAGS = (
    "-std=c99", "-ffreestanding", "-fno-stack-protector", "-frounding-math", "-fno-strict-aliasing",
    "-fvisibility=hidden", "-D_XOPEN_SOURCE=700", "-w",
)  # fmt: skip
ZIG_FLAGS = ("-OReleaseFast", "-fPIC", "-fstrip", "-fcompiler-rt", "-ffunction-sections", "-fdata-sections")
LIBRARY_NAME = "libpyree_m_{arch}.a"


@functools.cache
def functions() -> frozenset[str]:
    """The functions <math.h> declares: a call to one of them links the library."""
    text = (HEADER_DIR / "math.h").read_text(encoding="utf-8")
    return frozenset(re.findall(r"\b(?:float|double|void) (\w+)\(", text))


def needed(objects: Iterable[Path], provided: Iterable[str] = ()) -> list[str]:
    """The math functions `objects` call and do not define (nor list in `provided`)."""
    undefined = {name for obj in objects for name in read_elf(obj).undefined}
    return sorted(undefined & functions() - set(provided))


def _zig() -> toolchain.Tool:
    zig = toolchain.c_compiler("zig")
    return toolchain.Tool("zig build-lib", (str(zig.path), "build-lib"), zig.path, zig.version, note="from the ziglang wheel")


def _musl_dir(zig: toolchain.Tool) -> Path:
    musl = zig.path.parent / "lib" / "libc" / "musl"
    missing = [s for s in MUSL_SOURCES if not (musl / "src" / "math" / s).is_file()]
    if missing:
        raise PyreeError(
            f"ziglang {zig.version} does not ship the musl sources the freestanding math library is built from ({', '.join(missing)})",
            file=musl / "src" / "math",
            fix="pip install --force-reinstall ziglang (a complete wheel), or use a system plugin (--kind system), which has the system's libm",
        )
    return musl


def library(arch: str, scratch: Path) -> Path:
    """The math library for `arch`: from the cache (built there on a miss), or built in
    `scratch` when caching is off."""
    zig = _zig()
    musl = _musl_dir(zig)
    sources = [musl / "src" / "math" / s for s in MUSL_SOURCES]
    kept = work_dir("libm")
    # One folder per zig and library source: builds with another zig never overwrite it.
    tag = keys.key_of({"zig": zig.identity()}, [ZIG_SOURCE, WEAK_HEADER], length=20)
    out = (kept / tag if kept is not None else scratch) / LIBRARY_NAME.format(arch=arch)
    job = _LibraryBuild(zig, musl, sources, arch, scratch)
    cached_action(
        "math library",
        key=[arch, *ZIG_FLAGS, *MUSL_CFLAGS, *(f"{src}:{','.join(names)}" for src, names in MUSL_SOURCES.items())],
        inputs=[ZIG_SOURCE, WEAK_HEADER, *sources],
        outputs=[out],
        build=job.build,
        tools_used=[zig],
    )
    return out


class _LibraryBuild:
    """One arch's library, planned: what cached_action's build step needs."""

    def __init__(self, zig: toolchain.Tool, musl: Path, sources: list[Path], arch: str, scratch: Path) -> None:
        self.zig, self.musl, self.sources, self.arch, self.scratch = zig, musl, sources, arch, scratch

    def build(self, private: list[Path]) -> list[str]:
        """Build the archive into `private` and check it; the files read."""
        (tmp,) = private
        work = echo.make_dir(self.scratch.resolve() / f"libm-{self.arch}")
        include = self.musl.parent / "include"
        musl_includes = [
            self.musl / "arch" / self.arch, self.musl / "arch" / "generic", self.musl / "src" / "include",
            self.musl / "src" / "internal", include / f"{self.arch}-linux-musl", include / "generic-musl",
        ]  # fmt: skip
        per_source: list[str | Path] = []  # zig's `-cflags ... --` applies to the sources after it
        for src, names in zip(self.sources, MUSL_SOURCES.values()):
            weak = [f"-DPYREE_WEAK_{i}={name}" for i, name in enumerate(names, 1)]
            per_source += ["-cflags", *MUSL_CFLAGS, "-include", WEAK_HEADER, *weak, "--", src]
        with echo.Stopwatch(f"build the freestanding math library for {self.arch}"):
            processes.spawn(
                self.zig.command(
                    "-target",
                    f"{self.arch}-freestanding-none",
                    *ZIG_FLAGS,
                    "--cache-dir",
                    work / "zig-cache",
                    ZIG_SOURCE,
                    *(a for d in musl_includes for a in ("-I", d)),
                    *per_source,
                    f"-femit-bin={tmp.resolve()}",
                ),  # fmt: skip
                cwd=work,  # zig writes nothing into the caller's directory
                what=f"building the freestanding math library for {self.arch} with zig",
                file=ZIG_SOURCE,
                fix=(
                    f"libm.zig is written for ziglang 0.17 (this is {self.zig.version}): pip install -U ziglang; if that is "
                    "current, report the output above; meanwhile a system plugin (--kind system) can use the system's libm"
                ),
            )
        _check_library(tmp, self.arch)
        return [str(ZIG_SOURCE), str(WEAK_HEADER), *map(str, self.sources)]


def _check_library(archive: Path, arch: str) -> None:
    """Every symbol the library defines must be weak, or two embedded objects carrying it
    clash in one module; and none may be referred to weakly, or the linker would not take
    the member defining it from the archive (the reference would silently be 0)."""
    symbols = [sym for member in _members(archive.read_bytes()) for sym in _symbols(member) if sym.name]
    defined = {sym.name for sym in symbols if sym["st_shndx"] != "SHN_UNDEF"}
    strong = sorted({sym.name for sym in symbols if sym["st_info"]["bind"] == "STB_GLOBAL" and sym["st_shndx"] != "SHN_UNDEF"})
    weak_refs = sorted({sym.name for sym in symbols if sym["st_info"]["bind"] == "STB_WEAK" and sym["st_shndx"] == "SHN_UNDEF"} & defined)
    if strong or weak_refs:
        raise PyreeError(
            f"the math library for {arch} defines strong symbols ({', '.join(strong) or 'none'}) "
            f"or refers weakly to its own ({', '.join(weak_refs) or 'none'})",
            file=archive,
            fix="list each musl source's definitions (and only those) in MUSL_SOURCES in pyree_build/backends/llvm_cpu/libm.py",
        )


def _members(data: bytes) -> list[bytes]:
    """The ELF members of a System V / GNU `ar` archive (zig writes that format)."""
    if not data.startswith(b"!<arch>\n"):
        raise PyreeError("not an ar archive", fix="rebuild it")
    members, at = [], 8
    while at + 60 <= len(data):
        size = int(data[at + 48 : at + 58].decode("ascii").strip())
        body = data[at + 60 : at + 60 + size]
        if body.startswith(b"\x7fELF"):
            members.append(body)
        at += 60 + size + (size & 1)
    return members


def _symbols(member: bytes) -> list[Any]:
    """The .symtab entries of one object (pyelftools' Symbol objects)."""
    table = elffile.ELFFile(io.BytesIO(member)).get_section_by_name(".symtab")
    return [] if table is None else list(table.iter_symbols())


def defined_globals(obj: Path) -> list[str]:
    """The global and weak symbols an object defines, whatever their visibility: the functions
    and data the module it is linked into may refer to."""
    return sorted(
        sym.name for sym in _symbols(obj.read_bytes()) if sym.name and sym["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK") and sym["st_shndx"] != "SHN_UNDEF"
    )


def link_into_object(lld: toolchain.Tool, obj: Path, archive: Path, *, label: str) -> None:
    """Make `obj` carry the math functions it calls: a relocatable link (`-r`) of it with the
    library, keeping what its own global symbols reach (`-u` roots; --gc-sections drops the
    rest), so the module that links the object needs nothing else."""
    merged = obj.with_name(obj.name + ".math.o")
    roots = [a for name in defined_globals(obj) for a in ("-u", name)]
    processes.spawn(
        lld.command("-flavor", "gnu", "-r", "--gc-sections", *roots, obj, archive, "-o", merged),
        what=f"linking the math library into {label} with iree-lld",
        file=label,
    )
    echo.echo_command(echo.shell_line(["mv", merged, obj]))
    merged.replace(obj)


def libraries_for(objects: Sequence[Path], arch: str, scratch: Path, provided: Iterable[str] = ()) -> tuple[list[Path], list[str]]:
    """The libraries to link `objects` with for `arch` (the math library when they call one
    of its functions, else none), and the files read for them. The archive itself is not
    one: it is rewritten from the cache while builds run, and what it is made of is in
    every key through key_part()."""
    calls = needed(objects, provided)
    if not calls:
        return [], []
    shown = ", ".join(calls[:6]) + (f" and {len(calls) - 6} more" if len(calls) > 6 else "")
    echo.log_step(f"  {arch}: calls {shown}: links pyree_build's freestanding math library")
    return [library(arch, scratch)], [str(ZIG_SOURCE), str(WEAK_HEADER)]


def key_part() -> str:
    """What the library is made of (zig, libm.zig, libm_weak.h), for the key of a build that
    may link it."""
    try:
        zig = toolchain.c_compiler("zig").version
    except PyreeError:
        zig = "missing"  # then only a build that calls no math function can succeed
    # What pyree_build's own library sources hold (libm.py is a package file, keyed anyway).
    return f"libm=zig-{zig}/{keys.key_of({}, [ZIG_SOURCE, WEAK_HEADER], length=16)}"
