"""Which CPU a module's code and a plugin's code are built for, and a note when they differ.

A module compiled for this host (`compile --cpu host`) uses every vector extension of this
CPU; a plugin built for the arch's baseline (the default, so it runs on any CPU) uses none,
so a generated kernel there is measured with a hand tied behind its back (SSE2 against
AVX-512). The other way round, a plugin built for this host with a module for any CPU runs
only on CPUs like this one. Either is allowed, and said once per pair.

The module says its CPU itself: the device target iree-compile writes into the module holds
`cpu = "..."` ("generic", or the host's name). A plugin's CPU is what pyree_build built it
for, remembered by its bytes (cache.facts); a plugin built elsewhere has no known CPU and no note.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from pyree_build.cache import facts
from pyree_build.core import echo

PathLike = str | os.PathLike[str]
_FACT = "plugin-built-for-cpu"
_TARGET_CPU = re.compile(rb'#hal\.executable\.target<"llvm-cpu", "embedded-elf-\w+", \{cpu = "([^"]*)"')
_SAID: set[tuple[str, ...]] = set()


def remember_plugin_cpu(plugin: Path, cpu: str) -> None:
    """Record that pyree_build built these bytes for `cpu` (baseline or host)."""
    facts.remembered(_FACT, [plugin], lambda: cpu)


def plugin_cpu(plugin: PathLike) -> str | None:
    """The CPU pyree_build built this plugin for, or None when it did not build these bytes."""
    answer = facts.remembered(_FACT, [Path(plugin)], lambda: None)
    return answer if isinstance(answer, str) else None


def module_cpu(module: PathLike) -> str | None:
    """The CPU the module's host code is compiled for ("generic", or a CPU's name), or None
    for a module with no llvm-cpu code."""
    try:
        data = Path(module).read_bytes()
    except OSError:
        return None
    found = _TARGET_CPU.search(data)
    return found.group(1).decode("ascii", "replace") if found else None


def mismatch(module: PathLike, plugin: PathLike) -> str | None:
    """What differs between the CPU the module targets and the one the plugin was built for."""
    module_target, plugin_target = module_cpu(module), plugin_cpu(plugin)
    if module_target is None or plugin_target is None:
        return None
    if module_target != "generic" and plugin_target == "baseline":
        return (
            f"{Path(module).name} is compiled for this CPU ({module_target}) but plugin {Path(plugin).name} for the arch's baseline: "
            "its kernels use none of the vector extensions the module's own code uses. Build it for this CPU "
            "(`pyree-build plugin --cpu host`, CMake `CPU host`) to compare like with like"
        )
    if module_target == "generic" and plugin_target == "host":
        return (
            f"plugin {Path(plugin).name} is built for this CPU only, while {Path(module).name} is compiled for any CPU: "
            "the pair runs only on CPUs like this one. Build the plugin with `--cpu baseline`, or compile the module with `--cpu host`"
        )
    return None


def note_mismatches(module: PathLike, plugins: Sequence[PathLike]) -> list[str]:
    """Print each module/plugin CPU difference once per process; the notes printed."""
    notes = []
    for plugin in plugins:
        text = mismatch(module, plugin)
        key = (os.fspath(module), os.fspath(plugin), text or "")
        if text and key not in _SAID:
            _SAID.add(key)
            echo.log_step(f"note: {text}")
            notes.append(text)
    return notes
