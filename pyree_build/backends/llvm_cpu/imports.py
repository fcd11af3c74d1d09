"""Which imports a module's executables call, and which plugin resolves each.

A .vmfb built for llvm-cpu carries each executable as an embedded ELF. Its library
struct (what `iree_hal_executable_library_query` returns) begins with a pointer to the
library header and the import table: a count and an array of pointers to the import
names (a `?` prefix marks an optional import). The ELF is read without running it: the
pointers are link-time relocations, so each one's target is its relocation's addend.

Plugins are asked out of process (a crash in a plugin must not take pyree_build down):
the child loads each plugin with dlopen, calls its `load` and `resolve` as the runtime
does, and reports which names it filled in. The runtime asks plugins last registered
first, so the parent walks them in that order.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import struct
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from pyree_build.backends.llvm_cpu import cpus
from pyree_build.backends.llvm_cpu.elf import ELF_MAGIC, ElfHeaders, host_arch
from pyree_build.cache import facts
from pyree_build.core import echo, lazy, processes, readers
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.records import field, record

# The child side (ctypes and the plugin ABI's structures) loads only when a plugin is asked,
# not with every compile and run that reads a module's imports.
plugin_abi = lazy.module("pyree_build.backends.llvm_cpu.plugin_abi")
# Only a FatELF plugin needs it; with it come the output checks (hashlib, json), which `run` never needs.
fatelf = lazy.module("pyree_build.backends.llvm_cpu.fatelf")

PathLike = str | os.PathLike[str]

# IREE's names for the ELF machines it builds executables for.
_MACHINE_NAMES = {"EM_X86_64": "x86_64", "EM_AARCH64": "arm_64", "EM_386": "x86_32", "EM_ARM": "arm_32"}


@record(frozen=True)
class Import:
    name: str
    optional: bool = False


@record
class ExecutableImports:
    """One embedded executable: its library name, its arch and the imports it calls."""

    library: str
    arch: str
    imports: list[Import] = field(default_factory=list)

    @property
    def required(self) -> list[str]:
        return [i.name for i in self.imports if not i.optional]


_EM_NAMES = {62: "EM_X86_64", 183: "EM_AARCH64", 3: "EM_386", 40: "EM_ARM", 243: "EM_RISCV"}
_SHT_RELA, _SHT_NOBITS, _SHT_REL = 4, 8, 9


class _ElfImage:
    """Enough of one ELF to follow relocated pointers in its data."""

    def __init__(self, data: bytes) -> None:
        self.elf = ElfHeaders(data)
        self.data = data
        self.word = self.elf.elfclass // 8
        self.endian = self.elf.endian
        wide = self.word == 8
        self.sections = [
            {"sh_addr": addr, "sh_offset": off, "sh_size": size} for kind, addr, off, size, _, _ in self.elf.sections if addr and kind != _SHT_NOBITS
        ]
        self.pointers: dict[int, int] = {}  # address of a pointer -> address it points to
        sym_format = self.endian + ("IBBHQQ" if wide else "IIIBBH")
        for kind, _, off, size, link, entsize in self.elf.sections:
            if kind not in (_SHT_REL, _SHT_RELA):
                continue
            rela = kind == _SHT_RELA
            rel_format = self.endian + ("QQ" if wide else "II") + (("q" if wide else "i") if rela else "")
            stride = entsize or struct.calcsize(rel_format)
            symbols = self.elf.sections[link] if link else None
            for k in range(size // stride):
                fields = struct.unpack_from(rel_format, data, off + k * stride)
                r_offset, r_info = fields[0], fields[1]
                sym = r_info >> 32 if wide else r_info >> 8
                base = 0
                if sym and symbols is not None:
                    entry = struct.unpack_from(sym_format, data, symbols[2] + sym * (symbols[5] or struct.calcsize(sym_format)))
                    base = entry[4] if wide else entry[1]
                addend = fields[2] if rela else self._raw_word(r_offset)
                if addend is not None:
                    self.pointers[r_offset] = base + addend

    def _offset(self, address: int, size: int) -> int | None:
        for s in self.sections:
            if s["sh_addr"] <= address and address + size <= s["sh_addr"] + s["sh_size"]:
                return s["sh_offset"] + address - s["sh_addr"]
        return None

    def _raw_word(self, address: int) -> int | None:
        at = self._offset(address, self.word)
        if at is None:
            return None
        return struct.unpack_from(self.endian + ("Q" if self.word == 8 else "I"), self.data, at)[0]

    def u32(self, address: int) -> int | None:
        at = self._offset(address, 4)
        return None if at is None else struct.unpack_from(self.endian + "I", self.data, at)[0]

    def string(self, address: int) -> str | None:
        at = self._offset(address, 1)
        if at is None:
            return None
        end = self.data.find(b"\0", at, at + 4096)
        if end < 0:
            return None
        try:
            text = self.data[at:end].decode("ascii")
        except UnicodeDecodeError:
            return None
        return text if text and text.isprintable() else None

    def library(self) -> tuple[str, list[Import]] | None:
        """(library name, imports) of the executable library struct, or None if not found."""
        w = self.word
        for slot, header in self.pointers.items():
            # The library struct: header pointer, then {u32 count; names pointer} for imports,
            # then the export table, whose function pointers are relocated too.
            if header in self.pointers or (self.u32(header) or 0) > 64 or header + w not in self.pointers:
                continue
            name = self.string(self.pointers[header + w])
            count = self.u32(slot + w)
            if name is None or count is None or count > 4096 or slot + 3 * w + w not in self.pointers:
                continue
            imports: list[Import] = []
            if count:
                table = self.pointers.get(slot + 2 * w)
                if table is None:
                    continue
                names = [self.string(self.pointers.get(table + i * w, -1)) for i in range(count)]
                if any(n is None for n in names):
                    continue
                imports = [Import(n.removeprefix("?"), n.startswith("?")) for n in names if n is not None]
            return name, imports
        return None


def _elf_images(data: bytes) -> list[bytes]:
    """Each ELF embedded in a module, in order (the end of one is found from its headers)."""
    images = []
    at = data.find(ELF_MAGIC)
    while at >= 0:
        end = at + 4
        try:
            size = ElfHeaders(data, at).size()
            images.append(data[at : at + size])
            end = at + size
        except (ValueError, struct.error):
            pass
        at = data.find(ELF_MAGIC, end)
    return images


def module_imports(module: PathLike) -> list[ExecutableImports]:
    """The imports each embedded (llvm-cpu) executable of `module` calls."""
    data = readers.read_module(module)
    found: list[ExecutableImports] = []
    for image in _elf_images(data):
        try:
            elf = _ElfImage(image)
            library = elf.library()
        except (ValueError, KeyError, IndexError, struct.error):
            continue
        if library is None:
            continue
        machine = _EM_NAMES.get(elf.elf.machine, f"EM_{elf.elf.machine}")
        arch = f"riscv_{elf.elf.elfclass}" if machine == "EM_RISCV" else _MACHINE_NAMES.get(machine, str(machine))
        found.append(ExecutableImports(library[0], arch, library[1]))
    return found


def _host_arch() -> str:
    return {"aarch64": "arm_64", "riscv64": "riscv_64"}.get(host_arch(), host_arch())


def describe(executables: Sequence[ExecutableImports], resolution: Resolution | None = None) -> str:
    if not executables:
        return "no embedded CPU executables (imports are read from llvm-cpu modules)"
    lines = []
    for e in executables:
        lines.append(f"{e.library} ({e.arch}): " + (f"{len(e.imports)} import(s)" if e.imports else "no imports"))
        for imp in e.imports:
            text = f"  {imp.name}" + (" (optional)" if imp.optional else "")
            if resolution is not None and e.arch == _host_arch():
                by = resolution.provider.get(imp.name)
                text += f"  <- {by}" if by else "  <- NOT RESOLVED"
            lines.append(text)
    if resolution is not None:
        lines.append("plugins, in the order the runtime asks them (last registered first):")
        for answer in resolution.answers:
            lines.append(f"  {answer.path}" + (f" ({answer.name})" if answer.name else "") + (f": {answer.error}" if answer.error else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- plugins


@record
class PluginAnswer:
    path: str
    name: str = ""
    resolves: list[str] = field(default_factory=list)
    error: str | None = None  # the plugin could not be asked (or failed to load)


@record
class Resolution:
    answers: list[PluginAnswer]  # in asking order: last registered first
    provider: dict[str, str]  # import -> the plugin (path) that resolves it


def _loadable_copy(plugin: Path, scratch: Callable[[], Path]) -> tuple[Path | None, str | None]:
    """A file dlopen can load for `plugin`: itself, or the host's ELF out of a FatELF."""
    with plugin.open("rb") as f:
        head = f.read(4)
    if head == b"\xfa\x70\x0e\x1f":
        try:
            data = fatelf.select(plugin)
        except PyreeError as exc:
            return None, exc.what
        out = scratch() / f"{plugin.stem}_host.so"
        out.write_bytes(data)
        return out, None
    return plugin, None


def resolve(names: Sequence[str], plugins: Sequence[PathLike]) -> Resolution:
    """Ask each plugin (in a child process) which of `names` it resolves, in the runtime's order.

    Names are as the runtime passes them: an optional import keeps its `?` prefix.
    """
    paths = [require_file(os.fspath(p).removeprefix("embedded:"), "plugin").resolve() for p in plugins]
    order = list(reversed(paths))
    with contextlib.ExitStack() as cleanup:
        # A directory only for a FatELF's host slice (most plugins load as they are): made on
        # first use, removed on the way out.
        scratch = functools.cache(lambda: Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="pyree-resolve."))))
        requests = []
        answers: list[PluginAnswer] = []
        for path in order:
            loadable, error = _loadable_copy(path, scratch)
            answers.append(PluginAnswer(str(path), error=error))
            if loadable is not None:
                requests.append((len(answers) - 1, str(loadable)))
        ask_quietly = plugin_abi.ask_quietly  # loaded here: the forked child must not import
        for index, copy in requests:
            # A fork of this process, not a new Python (~70 ms less per run): the plugin's
            # code still runs apart from pyree_build, so a crash or hang there is reported.
            # Remembered by the plugin's bytes: the same file answers the same names alike.
            ask = functools.partial(processes.call_in_child, ask_quietly, copy, list(names), what="asking its resolve", file=answers[index].path, timeout=120)
            try:
                reply = facts.remembered("plugin-resolves", [Path(copy)], ask, depends_on=list(names), keep=_answered)
            except PyreeError as err:
                answers[index].error = err.what
                continue
            reply_fields = reply if isinstance(reply, dict) else {}
            answers[index].name = reply_fields.get("name", "")
            answers[index].resolves = reply_fields.get("resolves", [])
            answers[index].error = reply_fields.get("error")
    provider: dict[str, str] = {}
    for answer in answers:
        for name in answer.resolves:
            provider.setdefault(name.removeprefix("?"), answer.path)
    return Resolution(answers, provider)


def _answered(reply: object) -> bool:
    """A plugin's answer, not a reason it could not answer here (that depends on this machine:
    a library it needs, its load's environment), which is asked again next time."""
    return isinstance(reply, dict) and "error" not in reply


def check_resolved(module: PathLike, plugins: Sequence[PathLike], *, ask_without_imports: bool = True) -> tuple[list[ExecutableImports], Resolution]:
    """Every required import of the module's host executables is resolved by one of `plugins`,
    or a PyreeError naming the missing imports and the plugins asked. When a plugin cannot be
    asked here (it does not load in this process), a missing import is only noted."""
    executables = module_imports(module)
    host = [e for e in executables if e.arch == _host_arch()]
    names = sorted({("?" if i.optional else "") + i.name for e in host for i in e.imports})
    if not names and not ask_without_imports:  # nothing to check: spare the child process
        return executables, Resolution([], {})
    resolution = resolve(names, plugins)
    cpus.note_mismatches(module, sorted(set(resolution.provider.values())))
    missing = sorted({n for e in host for n in e.required if n not in resolution.provider})
    if missing:
        asked = "\n".join(
            f"  {a.path}"
            + (f" ({a.name})" if a.name else "")
            + (f": could not be asked: {a.error}" if a.error else f": resolves {', '.join(a.resolves) or 'none of them'}")
            for a in resolution.answers
        )
        unasked = [a for a in resolution.answers if a.error]
        if unasked:  # one of those may provide it: leave the verdict to the runtime
            echo.log_step(f"  note: could not check imports {', '.join(missing)}: some plugins could not be asked\n" + asked)
            return executables, resolution
        raise PyreeError(
            f"no plugin resolves import{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}, which the module calls",
            file=module,
            details="plugins asked (last registered first):\n" + asked,
            fix=(
                "pass the plugin that exports "
                + ", ".join(missing)
                + " with --plugin, or check that the name in the plugin's resolve matches the MLIR declaration exactly"
            ),
        )
    return executables, resolution


def require_resolved(module: PathLike, plugins: Sequence[PathLike]) -> list[str]:
    """check_resolved(ask_without_imports=False) for a run, its verdict remembered by the bytes
    of the module and of each plugin, in order (cache.facts): the next run of the same files
    reads no ELF and asks no plugin (~0.2 ms of every served run). Only a clean verdict is
    remembered (every plugin asked, every required import resolved), as the positions of the
    plugins that provide imports; the CPU notes are said as check_resolved says them. Returns
    each plugin that could not be asked, with why (its resolve timed out or crashed in the
    child, or it does not load here): none when the verdict is clean."""
    paths = [require_file(os.fspath(p).removeprefix("embedded:"), "plugin").resolve() for p in plugins]

    def verdict() -> dict[str, object]:
        _, resolution = check_resolved(module, plugins, ask_without_imports=False)
        providing = set(resolution.provider.values())
        unasked = [f"{a.path}: {a.error}" for a in resolution.answers if a.error is not None]
        return {"providers": [i for i, path in enumerate(paths) if str(path) in providing], "clean": not unasked, "unasked": unasked}

    answer = facts.remembered("imports-resolved", [Path(module), *paths], verdict, depends_on=[_host_arch()], keep=lambda a: a["clean"] is True)
    positions = answer["providers"] if isinstance(answer, dict) and isinstance(answer["providers"], list) else []
    cpus.note_mismatches(module, sorted({str(paths[i]) for i in positions}))  # said once per process: a no-op after check_resolved's
    unasked = answer.get("unasked") if isinstance(answer, dict) else None
    return [str(u) for u in unasked] if isinstance(unasked, list) else []


def require_imports(module: PathLike, expected: Sequence[str], *, what: str = "module") -> list[ExecutableImports]:
    """Each name in `expected` is called by some executable of the module, or a PyreeError."""
    executables = module_imports(module)
    called = {i.name for e in executables for i in e.imports}
    missing = [n for n in expected if n not in called]
    if missing:
        raise PyreeError(
            f"the {what} does not call import{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}",
            file=module,
            details="imports it calls:\n" + describe(executables),
            fix=(
                "if a transform/PDL spec should have put the call there, it matched nothing: compare its matcher with the "
                "program (`pyree-build dump IN.mlir -o DIR --transform-spec SPEC` shows the executables it makes); "
                "otherwise check the import's name in the MLIR declaration"
            ),
        )
    return executables


# ---------------------------------------------------------------------------- declarations

_PRIVATE_DECL = re.compile(r"func\.func\s+private\s+@([\w$.\-]+)\s*\(", re.MULTILINE)


@record(frozen=True)
class MemrefImport:
    """An import declared with memref operands and without `llvm.bareptr = true`."""

    name: str
    #: how many C parameters the module passes: each memref as a whole descriptor (allocated
    #: and aligned pointers, offset, then a size and a stride per dimension), one per other operand.
    descriptor_params: int


def memref_imports_without_bareptr(mlir_text: str) -> list[MemrefImport]:
    """Imports declared with memref operands but without `llvm.bareptr = true`.

    Without it each memref becomes a whole descriptor (pointers, offset, sizes, strides)
    in the argument block, while C code written for base pointer + offset reads the
    wrong fields: the module compiles and then computes garbage or crashes.
    """
    found = []
    for m in _PRIVATE_DECL.finditer(mlir_text):
        depth, i = 1, m.end()
        while i < len(mlir_text) and depth:
            depth += {"(": 1, ")": -1}.get(mlir_text[i], 0)
            i += 1
        params = mlir_text[m.end() : i - 1]
        rest = mlir_text[i : i + 400]
        attrs = ""
        head = re.match(r"\s*(?:->\s*[^{\n]*)?\s*attributes\s*\{", rest)
        if head:
            close = rest.find("}", head.end())
            attrs = rest[head.end() : close if close >= 0 else len(rest)]
        if "memref<" in params and "llvm.bareptr" not in attrs:
            found.append(MemrefImport(m.group(1), sum(_descriptor_words(p) for p in _top_level_split(params))))
    return found


def _top_level_split(text: str) -> list[str]:
    """`text` split at the commas outside any (), <>, [] or {}."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += 1 if char in "(<[{" else -1 if char in ")>]}" else 0
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _descriptor_words(param: str) -> int:
    shape = re.search(r"memref<([^,>]*)", param)
    if shape is None:
        return 1
    rank = len(re.findall(r"(?:\?|\d+)x", shape.group(1)))
    return 3 + 2 * rank


def c_parameter_count(c_text: str, name: str) -> int | None:
    """How many parameters the C definition of `name` in `c_text` takes; None where it has none."""
    for m in re.finditer(rf"\b{re.escape(name)}\s*\(", c_text):
        depth, i = 1, m.end()
        while i < len(c_text) and depth:
            depth += {"(": 1, ")": -1}.get(c_text[i], 0)
            i += 1
        if re.match(r"\s*\{", c_text[i : i + 64]):
            params = _top_level_split(re.sub(r"/\*.*?\*/|//[^\n]*", "", c_text[m.end() : i - 1], flags=re.DOTALL))
            return 0 if params in ([], ["void"]) else len(params)
    return None


def listing(module: PathLike, plugins: Sequence[PathLike] = ()) -> str:
    """`imports`: each executable's imports, and with `plugins` which one resolves each."""
    if plugins:
        found, resolution = check_resolved(module, plugins)
        return describe(found, resolution)
    return describe(module_imports(module))
