"""llvm-cpu's side of compile and run: how the runtime loads a plugin, what its loader's
errors mean, and imports declared in a way that would compute garbage."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pyree_build.backends.llvm_cpu.elf import ARCH_ALIASES, host_arch, is_standalone_elf
from pyree_build.backends.llvm_cpu.imports import c_parameter_count, memref_imports_without_bareptr
from pyree_build.cache import facts
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import text_or_empty
from pyree_build.core.inputs import resolve_object

PathLike = str | os.PathLike[str]

EMBEDDED_PREFIX = "embedded:"


def plugin_flag(plugin: PathLike) -> str:
    """The --executable_plugin value that makes the runtime use the right loader.

    The runtime picks its own ELF loader only for a `.sos` name or an `embedded:` prefix
    and dlopen otherwise; a standalone plugin (FatELF, or an ELF with no libraries or
    imports) under another name gets the prefix, so users need not remember the rule.
    """
    text = os.fspath(plugin)
    explicit = text.startswith(EMBEDDED_PREFIX)
    # Absolute, or the runtime's dlopen would search the library path instead of the cwd.
    path = require_file(text.removeprefix(EMBEDDED_PREFIX), "plugin").resolve()
    if explicit or path.suffix == ".sos":
        return (EMBEDDED_PREFIX if explicit else "") + str(path)
    embedded = facts.remembered("plugin-loads-embedded", [path], lambda: _loads_embedded(path), keep=lambda _: True)
    return EMBEDDED_PREFIX + str(path) if embedded else str(path)


def _loads_embedded(path: Path) -> bool:
    """A FatELF, or an ELF that IREE's own loader can map (remembered by its bytes: reading the
    headers in Python cost ~70 us of every run)."""
    with path.open("rb") as f:
        head = f.read(4)
    return head == b"\xfa\x70\x0e\x1f" or is_standalone_elf(path)


def warn_without_bareptr(source: Path, text: str, specs: Sequence[Path]) -> None:
    """Warn about each import that takes memrefs without `llvm.bareptr = true`, in the program
    (`text`, read from `source`) and its specs, unless C beside them defines it with one
    parameter per descriptor field: then it takes the descriptors on purpose (IREE's own
    embedded transform sample does)."""
    files = [(source, text), *((f, text_or_empty(f)) for f in specs)]
    c_texts = _c_beside([path for path, _ in files])
    for path, body in files:
        for found in memref_imports_without_bareptr(body):
            if any(c_parameter_count(c, found.name) == found.descriptor_params for c in c_texts):
                continue
            print(  # shown even with -q: the module would compile and then compute garbage
                f"warning: {path.name}: import @{found.name} takes memrefs but is not declared with `llvm.bareptr = true`: "
                f"each memref is then passed as a whole descriptor ({found.descriptor_params} parameters in all), and C "
                "written for pointer + offset reads the wrong fields (wrong results or a crash); add `attributes "
                "{llvm.bareptr = true}` (docs/writing-an-import.md), or define the C function with every descriptor field",
                file=sys.stderr,
            )


_MOST_C_FILES = 64


def _c_beside(paths: Sequence[Path]) -> list[str]:
    """The C files in the directories of `paths` (where an IREE sample keeps its functions.c)."""
    directories = dict.fromkeys(p.resolve().parent for p in paths)
    found = [c for d in directories for c in sorted(d.glob("*.c"))[:_MOST_C_FILES]]
    return [text_or_empty(c) for c in found]


def explain_loader(text: str) -> str | None:
    """The runtime's wording when an executable's imports could not all be resolved."""
    if "no executable loader registered" in text and "embedded-elf" in text:
        return text + (
            "\nhint: the module's executables call imports that no plugin provided; pass the plugin that "
            "exports them with --plugin PATH (plugins given later are searched first)"
        )
    return None


def host_status() -> tuple[bool, str]:
    """(usable, reason) for this host's CPU: usable when pyree_build knows its arch."""
    try:
        return True, f"this {host_arch()} host"
    except PyreeError as err:
        return False, err.what


def arch_spelling_hint(obj: str, search_paths: Sequence[PathLike]) -> str:
    """IREE spells aarch64 `arm_64`: point at an object that exists under another spelling."""
    stem, dot, suffix = obj.rpartition(".")
    for spelling, arch in ARCH_ALIASES.items():
        if not stem.endswith(f"_{spelling}"):
            continue
        for other in (s for s, a in ARCH_ALIASES.items() if a == arch and s != spelling):
            candidate = f"{stem[: -len(spelling)]}{other}{dot}{suffix}"
            if resolve_object(candidate, search_paths)[0] is not None:
                return (
                    f"\n  (found {candidate}: the same arch spelled '{other}'; build the objects with "
                    f"`--arch {spelling}` (CMake: ARCHS {spelling}) to get the name the program uses)"
                )
    return ""
