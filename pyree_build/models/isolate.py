"""One op group (or groups merged as `replace`'s 1+2+3 names them) as a program of its own: a
public function of the group's inputs returning its results, the same ops on the same types.
IREE's module of it is what IREE does for exactly those ops, so a kernel that replaces the
group can be timed and tuned against that (benchmarks/kernels.py --groups), not against a
whole model whose other ops drown the difference."""

from __future__ import annotations

import re
from pathlib import Path

from pyree_build.core import files
from pyree_build.core.args import PathLike
from pyree_build.core.errors import PyreeError, as_path
from pyree_build.models import spec
from pyree_build.models.ir import analysis, merge, program


def isolate(source: PathLike, ops: merge.Request, output: PathLike, *, function: str = "group") -> Path:
    """Write group `ops` of the program `source` as a program whose public function `function`
    takes the group's inputs and returns its results; the written path. A group `ops` lists
    as not replaceable is refused with its reason (its ops may not form a function of its inputs)."""
    src = Path(source).resolve()
    with analysis.Analysis.of(program.spec_view_text(src)) as found:
        group = merge.select(found.groups, ops)
        if group.refusal:
            raise PyreeError(
                f"op group {merge.label(ops)} of {src.name} cannot stand alone: {group.refusal}",
                fix="choose a group `pyree-build ops` lists as replaceable",
            )
        text = spec.isolated_program(group, function)
    out = as_path(output, "output")
    out.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(out, text)
    return out


_TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")


def argument_types(text: str, function: str = "group") -> list[tuple[tuple[int, ...], str]]:
    """Each argument of `function` in an isolated program's text (what `isolate` writes) as
    (shape, element type name), in order: what a caller needs to draw inputs for it. The
    program's sizes are all static (the matcher's types), so every dim is a number."""
    start = text.find(f"func.func @{function}(")
    if start < 0:
        raise PyreeError(f"the program has no function @{function}", fix="pass a program that `isolate` wrote, and its function name")
    signature = text[start : text.index(") ->", start)]
    return [(tuple(int(d) for d in dims.split("x") if d), element) for dims, element in _TENSOR.findall(signature)]
