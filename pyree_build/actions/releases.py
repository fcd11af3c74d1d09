"""MLIR written for another IREE release: which constructs changed, and how 3.13 writes them.

IREE's MLIR syntax changes between releases, and iree-compile's parser error only says what
it expected. When a compile fails on a line holding one of the older forms below, the error
says the file is written for another release and shows the form of the release installed.
Each rule was checked against iree-compile 3.13: the older form fails to parse, the newer
one compiles (tests/actions/test_releases.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pyree_build.core.records import record


@record(frozen=True)
class Change:
    """A construct whose form changed: how the older form reads, and how 3.13 writes it."""

    older: re.Pattern[str]
    what: str
    now: str


CHANGES = (
    Change(
        re.compile(r"hal\.executable\.source\b[^\n]*\battributes\s*\{\s*objects\b"),
        "`attributes {objects = ...}` on hal.executable.source",
        "hal.executable.source private @NAME <{objects = #hal.executable.objects<{...}>}> { ... }",
    ),
    Change(
        re.compile(r"\}\s*attributes\s*\{\s*workgroup_size\b"),
        "`} attributes {workgroup_size = ...}` after a hal.executable.export's count region",
        "} <workgroup_size = [64 : index, 1 : index, 1 : index]>",
    ),
    Change(
        re.compile(r'#hal\.device\.target<\s*"rocm"'),
        '`#hal.device.target<"rocm", ...>` (the device is now called hip; the executable target stays "rocm")',
        '#hal.device.target<"hip", [#hal.executable.target<"rocm", "rocm-hsaco-fb">]> : !hal.device',
    ),
    Change(
        re.compile(r"tosa\.const_shape\s*\{\s*values\s*="),
        "`tosa.const_shape {values = ...}`",
        "tosa.const_shape values(dense<[2, 2]> : tensor<2xindex>) : () -> !tosa.shape<2>",
    ),
    Change(
        re.compile(r"tosa\.clamp\s+%[\w.#]+\s*\{\s*(?:min|max)_val\s*="),
        "`tosa.clamp %x {min_val = ..., max_val = ...}`",
        "tosa.clamp %x min_val(0.0 : f32) max_val(6.0 : f32) : (tensor<4xf32>) -> tensor<4xf32>",
    ),
    Change(
        # IREE's own Vulkan argmax spec still writes it so; 3.13's parser takes a keyword.
        re.compile(r"transform\.match\.structured\.\w+\s+%[\w.#]+\s*\[[^\]]*\]\s*\{\s*\w+\s*\}"),
        "a unit attribute in braces on a transform.match.structured op (`%op[0] {parallel}`)",
        "transform.match.structured.dim %op[0] parallel : !transform.any_op (the attribute as a bare keyword: parallel, reduction, ...)",
    ),
)


def older_forms(text: str) -> list[tuple[int, Change]]:
    """(line number, change) for each line of `text` written in an older release's form."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        found += [(number, change) for change in CHANGES if change.older.search(line)]
    return found


def explain(texts: Mapping[str, str], version: str, compiler_output: str) -> str | None:
    """The release-mismatch explanation of a failed compile, or None when no older form is in
    its files (`texts`: the program and each spec it read, by name)."""
    lines = []
    for name, text in texts.items():
        found = older_forms(text)
        if found:
            lines.append(f"{name} is written for another IREE release than the iree-compile {version} installed here:")
        lines += [f"  line {number}: {change.what}\n    {version} writes: {change.now}" for number, change in found]
    if not lines:
        return None
    said = [line for line in compiler_output.splitlines() if "error:" in line]
    return "\n".join([*lines, "(iree-compile said:)", *said])
