"""`ops`: the op groups of a program as a transform spec will see them, numbered for `replace`.

Each group says whether `replace` can generate it, and if not, why: the same check
`replace` makes (it runs the generators), so the list never promises what replace refuses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pyree_build.core import escape, processes
from pyree_build.core.errors import PyreeError
from pyree_build.models import kernel_source, replace
from pyree_build.models.ir import analysis, groups, limits, program

PathLike = str | os.PathLike[str]


@dataclass
class TensorInfo:
    """A tensor a group reads or writes: its type, shape, element type and where it comes from."""

    type: str
    shape: list[int | None]
    element_type: str
    origin: str


@dataclass
class OpGroup:
    """One group of ops a transform spec can match, as `ops` lists it."""

    index: int
    function: str
    root: str
    ops: list[str]
    operands: list[TensorInfo]
    results: list[TensorInfo]
    source: list[str]
    replaceable: bool
    reason: str | None
    # ops whose bodies use a constant from outside them: the spec matches them by name only
    matched_by_name: list[str]
    # an earlier group with the same ops on the same types: one kernel fits both (each is
    # replaced only where listed: a spec's matcher is tried on its own group alone)
    same_as: int | None = None
    # per GPU target asked for (ops --target): None where `replace --target` generates the
    # group's kernel, else why not
    targets: dict[str, str | None] = field(default_factory=dict)

    def render(self) -> str:
        mark = "yes" if self.replaceable else f"no: {self.reason}"
        if self.replaceable and self.same_as is not None:
            mark += f" (same ops and types as #{self.same_as}: the same kernel fits both; list each group to replace it)"
        if self.replaceable and self.matched_by_name:
            mark += f" (matched by name only: {', '.join(self.matched_by_name)}, whose bodies use outside constants)"
        lines = [
            f"#{self.index}  {self.root}  (in @{escape.name(self.function)})",
            f"    ops:      {', '.join(self.ops)}",
            f"    operands: {', '.join(f'{t.type} ({t.origin})' for t in self.operands) or '-'}",
            f"    results:  {', '.join(t.type for t in self.results) or '-'}",
            f"    source:   {', '.join(map(escape.name, self.source)) or 'unknown'}",
            f"    replace:  {mark}",
        ]
        for target, reason in self.targets.items():
            lines.append(f"    {target + ':':<9} {'yes' if reason is None else f'no: {reason}'}")
        return escape.terminal("\n".join(lines))  # a reason may quote the IR's names too


def _tensor(value: Any) -> TensorInfo:
    owner = program.defining_op(value)
    if owner is None:
        origin = "argument"
    elif owner.operation.name == "arith.constant":
        origin = "constant"
    elif owner.operation.name == "hal.tensor.import":
        origin = "input"
    else:
        origin = owner.operation.name
    shape = program.shape(value.type) if program.is_tensor(value.type) else []
    return TensorInfo(str(value.type), shape, program.element_type(value.type), origin)


def _reason(e: PyreeError) -> str:
    return e.what.split(": ", 1)[-1] + (f" ({e.details})" if e.details else "")


def target_reason(group: groups.Group, found: analysis.Analysis, target: str) -> str | None:
    """None where `replace --target` generates the group's kernel for `target`, else why not:
    the same call replace makes, so the two never disagree."""
    if group.refusal:
        return group.refusal
    try:
        replace.generate(found, group.index, "check", target=target)
    except PyreeError as e:
        return _reason(e)
    return None


def _listed(group: groups.Group, found: analysis.Analysis, seen: dict[Any, int], targets: Sequence[str] = ()) -> OpGroup:
    reason = group.refusal
    same_as = None
    if reason is None:
        try:
            key = replace.matcher_key(replace.generate(found, group.index, "check"))
            same_as = seen.setdefault(key, group.index)
            same_as = None if same_as == group.index else same_as
        except PyreeError as e:
            reason = _reason(e)
    root = group.root.name if group.root is not None else group.members[-1].name
    outputs = list(group.root.results) if group.root is not None else group.outputs
    return OpGroup(
        index=group.index,
        function=program.symbol_name(group.function),
        root=root,
        ops=kernel_source.describe_ops(group),
        operands=[_tensor(v) for v in group.inputs],
        results=[_tensor(v) for v in outputs],
        source=kernel_source.source_names(group),
        replaceable=reason is None,
        reason=reason,
        matched_by_name=[d for op, d in zip(group.members, kernel_source.describe_ops(group)) if op in group.by_name],
        same_as=same_as,
        targets={t: target_reason(group, found, t) for t in targets},
    )


def ops(source: PathLike, *, targets: Sequence[str] = (), timeout: float | None = None) -> list[OpGroup]:
    """The op groups of program `source` (an MLIR file, e.g. from `pyree-build import`),
    numbered as `replace --ops` takes them; `targets` (vulkan, cuda, hip): also whether each
    group's kernel can be generated for each of them, and if not, why.
    `timeout`: the seconds IREE's input conversion may take (default: limits.time_limit's).

    Example: [g.root for g in pb.ops("mlp.mlir")] -> ['linalg.generic', 'linalg.matmul', 'linalg.generic']
    """
    gpu = [t for t in replace.TARGETS if t != "llvm-cpu"]
    for target in targets:
        if target not in gpu:
            raise PyreeError(f"unknown GPU target '{target}' for ops --target", fix=f"use one of: {', '.join(gpu)}")
    with processes.time_limit(limits.time_limit(timeout, [source])):
        text = program.spec_view_text(source)
    seen: dict[Any, int] = {}
    with analysis.Analysis.of(text) as found:
        return [_listed(group, found, seen, list(dict.fromkeys(targets))) for group in found.groups]


def render(found: list[OpGroup], *, as_json: bool = False) -> str:
    if as_json:
        return json.dumps([asdict(g) for g in found], indent=1)
    if not found:
        return "no op groups: the program has no linalg ops after input conversion"
    return "\n".join(g.render() for g in found)
