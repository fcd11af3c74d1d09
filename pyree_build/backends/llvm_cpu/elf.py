"""Checks on built plugins and objects, by reading them (pyelftools) and by loading them (ctypes).

These run after a build and before any IREE runtime sees the file, so a missing export or
an undefined symbol is reported with the file and the fix, not as a runtime load failure.
"""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

from pyree_build.core import lazy, processes
from pyree_build.core.errors import PyreeError
from pyree_build.core.records import record

elffile = lazy.module("elftools.elf.elffile")
elf_errors = lazy.module("elftools.common.exceptions")
# The plugin ABI's structures, as ctypes declares them: only a plugin probe needs them.
platform = lazy.module("platform")
plugin_abi = lazy.module("pyree_build.backends.llvm_cpu.plugin_abi")

QUERY_EXPORT = "iree_hal_executable_plugin_query"
PLUGIN_VERSION_LATEST = 1

# One spelling per concept: LLVM's arch names are used throughout pyree_build;
# IREE's spellings (arm_64, riscv_64) are accepted and mapped here.
ARCH_ALIASES = {
    "x86_64": "x86_64", "aarch64": "aarch64", "arm_64": "aarch64", "arm64": "aarch64", "riscv64": "riscv64", "riscv_64": "riscv64",
}  # fmt: skip
ELF_MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "riscv64": "EM_RISCV"}


def normalize_arch(arch: str) -> str:
    try:
        return ARCH_ALIASES[arch]
    except KeyError:
        raise PyreeError(
            f"unknown architecture '{arch}'",
            fix=f"use one of: {', '.join(sorted(set(ARCH_ALIASES.values())))}",
        ) from None


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@record(frozen=True)
class ElfSummary:
    path: Path
    machine: str  # pyelftools' e_machine name, e.g. EM_X86_64
    elf_class: int  # 32 or 64
    little_endian: bool
    elf_type: str  # ET_DYN, ET_REL, ...
    defined_exports: frozenset[str]
    undefined: tuple[str, ...]


def read_elf(path: str | os.PathLike[str], data: bytes | None = None) -> ElfSummary:
    p = Path(path)
    raw = data if data is not None else p.read_bytes()
    try:
        elf = elffile.ELFFile(io.BytesIO(raw))
        exports: set[str] = set()
        undefined: list[str] = []
        for section_name in (".dynsym", ".symtab"):
            table = elf.get_section_by_name(section_name)
            if table is None:
                continue
            for sym in table.iter_symbols():
                if not sym.name:
                    continue
                bind = sym["st_info"]["bind"]
                if sym["st_shndx"] == "SHN_UNDEF":
                    if bind != "STB_WEAK" or section_name == ".dynsym":
                        undefined.append(sym.name)
                elif bind in ("STB_GLOBAL", "STB_WEAK") and (section_name == ".dynsym" or sym["st_other"]["visibility"] == "STV_DEFAULT"):
                    exports.add(sym.name)
            if section_name == ".dynsym" and elf["e_type"] == "ET_DYN":
                break  # a shared object's interface is its dynamic symbol table
        return ElfSummary(
            path=p,
            machine=elf["e_machine"],
            elf_class=elf.elfclass,
            little_endian=elf.little_endian,
            elf_type=elf["e_type"],
            defined_exports=frozenset(exports),
            undefined=tuple(sorted(set(undefined))),
        )
    except (elf_errors.ELFError, ValueError, KeyError, IndexError, AssertionError) as exc:
        raise PyreeError(f"not a readable ELF file ({exc})", file=p, fix="rebuild it; the file may be truncated") from None


ELF_MAGIC = b"\x7fELF"
_ET_DYN, _SHT_DYNAMIC, _SHT_DYNSYM, _DT_NEEDED = 3, 6, 11, 1


class ElfHeaders:
    """An ELF's header and section headers, read with struct (pyelftools' import alone costs
    ~27 ms, a quarter of a `run`). Raises struct.error or ValueError on a malformed file."""

    def __init__(self, data: bytes | memoryview, at: int = 0) -> None:
        if bytes(data[at : at + 4]) != ELF_MAGIC or data[at + 4] not in (1, 2) or data[at + 5] not in (1, 2):
            raise ValueError("not an ELF header")
        self.elfclass = 64 if data[at + 4] == 2 else 32
        self.endian = "<" if data[at + 5] == 1 else ">"
        wide = self.elfclass == 64
        e = self.endian
        (self.type, self.machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, _) = struct.unpack_from(
            e + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"), data, at + 16
        )
        shdr = e + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
        if shentsize < struct.calcsize(shdr) and shnum:
            raise ValueError("section headers too small")
        if shnum == 0 and shoff:  # more sections than e_shnum holds: the count is in section 0
            shnum = struct.unpack_from(shdr, data, at + shoff)[5]
        self.header_end = shoff + shnum * shentsize
        # (type, addr, offset, size, link, entsize) of each section, offsets relative to the ELF
        self.sections = [(f[1], f[3], f[4], f[5], f[6], f[9]) for f in (struct.unpack_from(shdr, data, at + shoff + i * shentsize) for i in range(shnum))]

    def size(self) -> int:
        return max([self.header_end, *(off + size for kind, _, off, size, _, _ in self.sections if kind != 8)])


def _standalone_by_headers(data: bytes) -> bool | None:
    """is_standalone_elf read with struct; None when these headers cannot decide."""
    try:
        elf = ElfHeaders(data)
        if elf.type != _ET_DYN:
            return False
        wide = elf.elfclass == 64
        dyn = elf.endian + ("qQ" if wide else "iI")
        for kind, _, off, size, _, _ in elf.sections:
            if kind == _SHT_DYNAMIC:
                for k in range(size // struct.calcsize(dyn)):
                    tag = struct.unpack_from(dyn, data, off + k * struct.calcsize(dyn))[0]
                    if tag == 0:
                        break
                    if tag == _DT_NEEDED:
                        return False
        dynsyms = [s for s in elf.sections if s[0] == _SHT_DYNSYM]
        if len(dynsyms) != 1:
            return None  # read_elf's rules for .symtab apply: leave them to it
        _, _, off, size, link, entsize = dynsyms[0]
        strings = elf.sections[link][2]
        sym = elf.endian + ("IBBHQQ" if wide else "IIIBBH")
        step = entsize or struct.calcsize(sym)
        for k in range(size // step):
            fields = struct.unpack_from(sym, data, off + k * step)
            name_at, shndx = fields[0], (fields[3] if wide else fields[5])
            if shndx == 0 and name_at and data[strings + name_at] != 0:
                return False  # an undefined, named dynamic symbol: an import
        return True
    except (ValueError, IndexError, struct.error):
        return None


def is_standalone_elf(path: str | os.PathLike[str]) -> bool:
    """A shared object that needs no library and imports nothing: IREE's ELF loader can map it."""
    try:
        decided = _standalone_by_headers(Path(path).read_bytes())
    except OSError:
        return False
    if decided is not None:
        return decided
    try:
        with open(path, "rb") as f:
            elf = elffile.ELFFile(f)
            if elf["e_type"] != "ET_DYN":
                return False
            dynamic = elf.get_section_by_name(".dynamic")
            if dynamic is not None and any(tag.entry.d_tag == "DT_NEEDED" for tag in dynamic.iter_tags()):
                return False
    except (elf_errors.ELFError, OSError, ValueError):
        return False
    return not read_elf(path).undefined


def check_plugin_elf(path: str | os.PathLike[str], *, arch: str | None = None, standalone: bool = False) -> ElfSummary:
    """A plugin must be a shared object of the asked arch exporting the query function.

    A standalone plugin is loaded by IREE's own ELF loader, which rejects every import,
    so it must have no undefined dynamic symbols at all.
    """
    info = read_elf(path)
    if arch is not None:
        want = ELF_MACHINES[normalize_arch(arch)]
        if info.machine != want or info.elf_class != 64 or not info.little_endian:
            raise PyreeError(
                f"built for {info.machine} ({info.elf_class}-bit, {'little' if info.little_endian else 'big'}-endian), expected {want} 64-bit little-endian",
                file=path,
                fix="check the --arch/--target flags passed to the compiler",
            )
    if info.elf_type != "ET_DYN":
        raise PyreeError(f"is {info.elf_type}, but a plugin must be a shared object (ET_DYN)", file=path, fix="link with -shared")
    if QUERY_EXPORT not in info.defined_exports:
        raise PyreeError(
            f"does not export '{QUERY_EXPORT}', so IREE cannot load it as a plugin",
            file=path,
            fix=(
                "define `IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t** "
                "iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version, void* reserved)` "
                "in one of the sources (#include <iree/hal/local/executable_plugin.h>), not static, with default visibility"
            ),
        )
    if standalone and info.undefined:
        raise PyreeError(
            "has undefined symbols, which IREE's embedded ELF loader rejects: " + ", ".join(info.undefined),
            file=path,
            details=explain_undefined(info.undefined),
            fix="remove the calls, or provide the functions in the plugin itself (freestanding code has no libc)",
        )
    return info


_LIBC_MEM = {"memcpy", "memset", "memmove", "memcmp", "bcmp"}


def explain_undefined(names: tuple[str, ...], what: str = "a standalone plugin") -> str:
    lines = []
    for name in names:
        if name in _LIBC_MEM:
            lines.append(
                f"{name}: usually emitted by the compiler for a struct copy, an array initializer or a "
                f"loop it recognises as a copy/fill; write the loop with a volatile index, use "
                f"__builtin_{name} with a small constant size, or define {name} yourself"
            )
        elif name.startswith("__"):
            lines.append(f"{name}: a compiler runtime helper (e.g. 128-bit or soft-float arithmetic); avoid the operation or implement the helper")
        else:
            lines.append(f"{name}: a libc or external function; {what} can only call code it contains (or the runtime's import table)")
    return "\n".join(lines)


# A query function does almost nothing; one that takes this long is stuck.
PROBE_TIMEOUT_S = 30.0
PROBE_TIMEOUT_ENV = "PYREE_BUILD_PROBE_TIMEOUT"


def probe_plugin(path: str | os.PathLike[str], *, label: str | os.PathLike[str] | None = None, timeout: float | None = None) -> tuple[str, int]:
    """Load a host plugin and call its query function like the runtime does, in a child process.

    The plugin's code is the user's, not ours: a query that crashes or loops must not take
    pyree_build down or hang it, so it runs in a forked child with a time bound. `label`
    names the plugin in messages (the file probed may be a temporary). Returns (plugin name,
    header version). A NULL return means the plugin does not implement the runtime's ABI
    version; say so before the runtime does.
    """
    shown = label if label is not None else path
    if timeout is None:
        try:
            timeout = float(os.environ.get(PROBE_TIMEOUT_ENV, PROBE_TIMEOUT_S))
        except ValueError:
            raise PyreeError(f"{PROBE_TIMEOUT_ENV} is not a number of seconds", fix=f"unset it, or set e.g. {PROBE_TIMEOUT_ENV}=30") from None
    try:
        return processes.call_in_child(  # type: ignore[return-value]
            _query_plugin, os.fspath(Path(path).resolve()), what=f"the plugin's {QUERY_EXPORT}()", file=shown, timeout=timeout
        )
    except PyreeError as err:
        err.file = str(shown)
        if "crashed" in err.what or "did not return" in err.what or "without returning" in err.what:
            err.fix = (
                f"pyree_build loads each system plugin and calls {QUERY_EXPORT} once to check it; make that function "
                "only return the plugin struct (do the work in load/resolve), and check it under a debugger"
            )
        raise


def _query_plugin(path: str) -> tuple[str, int]:
    # ctypes, not cffi: cffi's cdef parse alone costs ~65 ms per probe.
    C, Header = plugin_abi.C, plugin_abi.Header
    try:
        query = C.CDLL(path).iree_hal_executable_plugin_query
    except OSError as exc:
        raise PyreeError(f"cannot be loaded: {exc}", file=path, fix="check the libraries it links against (ldd)") from None
    query.restype = C.POINTER(C.POINTER(Header))
    query.argtypes = [C.c_uint32, C.c_void_p]
    result = query(PLUGIN_VERSION_LATEST, None)
    if not result:
        raise PyreeError(
            f"{QUERY_EXPORT}(max_version={PLUGIN_VERSION_LATEST}) returned NULL: the plugin does not support "
            f"the runtime's plugin ABI version {PLUGIN_VERSION_LATEST}",
            file=path,
            fix="return the plugin struct when max_version >= IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1",
        )
    header = result[0]
    if not header:
        raise PyreeError("the query function returned a plugin with a NULL header", file=path, fix="set the .header field of the plugin struct")
    raw_name = header.contents.name
    name = raw_name.decode("utf-8", "replace") if raw_name else ""
    return name, int(header.contents.version)
