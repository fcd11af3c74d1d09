"""Several connected op groups as one kernel: `replace --ops 1+2+3 --import NAME`.

Groups stop where IREE's fusion would (a Gemm and the GELU after it are separate groups), but a
kernel writer often wants them together: the classic reason to write a kernel at all. A merged
group is the union of the groups' ops, described afresh as one group: it must have one result
used outside it and every op reachable from that result's op through operands, which holds
exactly when each group but the last feeds only the others (so they are connected).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyree_build.core.errors import PyreeError
from pyree_build.models.ir import groups, program

# A request names one group (3) or groups to merge ((1, 2, 3), written 1+2+3).
Request = int | tuple[int, ...]


def parse(text: str) -> Request:
    """`3` -> 3, `1+2+3` -> (1, 2, 3); anything else is refused naming it."""
    parts = text.split("+")
    if not all(p.isdigit() for p in parts):
        raise PyreeError(
            f"--ops takes op group numbers, got '{text}'",
            fix="pass the numbers `pyree-build ops` prints, e.g. --ops 1 or --ops 1,3, or --ops 1+2+3 to merge groups into one kernel",
        )
    numbers = tuple(int(p) for p in parts)
    return numbers[0] if len(numbers) == 1 else numbers


def numbers(request: Request | Sequence[int]) -> tuple[int, ...]:
    return (request,) if isinstance(request, int) else tuple(request)


def label(request: Request | Sequence[int]) -> str:
    return "+".join(map(str, numbers(request)))


def select(found: list[groups.Group], request: Request | Sequence[int]) -> groups.Group:
    """The group `request` names, or the groups it names merged into one."""
    chosen = numbers(request)
    for index in chosen:
        if not 1 <= index <= len(found):
            raise PyreeError(f"there is no op group {index}: the program has {len(found)}", fix="pyree-build ops MODEL.mlir lists them")
    if len(chosen) == 1:
        return found[chosen[0] - 1]
    if len(set(chosen)) != len(chosen):
        raise PyreeError(f"op groups {label(chosen)}: each group may appear once", fix="name each group once: --ops 1+2+3")
    parts = [found[i - 1] for i in chosen]
    if any(g.function != parts[0].function for g in parts):
        raise PyreeError(
            f"op groups {label(chosen)} are in different functions", fix="merge groups of one function (pyree-build ops names each group's function)"
        )
    members = sorted({op for g in parts for op in g.members}, key=lambda op: program.op_index(op, parts[0].function))
    merged = groups.Group(index=chosen[0], module=parts[0].module, function=parts[0].function, members=members)
    groups.describe(merged)
    if merged.refusal:
        merged.refusal = f"merged, they are not one connected group: {merged.refusal} (merge groups each of whose results only the next ones use, e.g. a Gemm and its activation)"
    return merged
