"""What every emitter of a loop nest shares: the base class `NestEmitter` and the nest's own rules.

An emitter writes a group's computation (loopnest.Nest) in one language. The rules of the nest
are the same in every language and live here: which name holds a value at a point (a constant,
the accumulator, a stage's body evaluated there, or a load from an input), the order a stage's
reads are resolved in (deepest first, in the order the body reads them, so the text is the same
from run to run), and a stage's body at a point. A language supplies only its forms: how an
input is loaded (`load`) and how one scalar op is written (`body_op`). The C emitters
(c_tiled, and c_reference's per-op forms), the GPU emitters (gpu_emitter, with glsl's and cuda_c's forms) and
the row-wise C emitter (c_rows, whose reads are per row) share these public names only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pyree_build.models.codegen import c_reference, loopnest


class Unfused(Exception):
    """The nest reads a value the fused form cannot compute where it is read: use the per-op path."""


def coordinate(expr: Any, coords: list[str]) -> str:
    """An operand's coordinate from the stage's loop values; a loop alone is passed as it is
    (so the reduction's result, read through an identity map, is recognised at its point)."""
    loop = loopnest.loop_of(expr)
    return coords[loop] if loop is not None else c_reference.affine_c(expr, coords)


def stage_reads(stage: loopnest.Stage, coords: list[str]) -> list[tuple[Any, list[str]]]:
    """What a stage's body reads: each used operand at its map's point."""
    return [
        (operand, [coordinate(e, coords) for e in stage.maps[n]])
        for n, (operand, arg) in enumerate(zip(stage.op.operands, stage.body.arguments))
        if list(arg.uses)
    ]


class NestEmitter(ABC):
    """One result element's (or one tile's) computation, written into `k` from `nest`."""

    def __init__(self, k: c_reference.Kernel, nest: loopnest.Nest) -> None:
        self.k, self.nest = k, nest

    def line(self, indent: str, text: str) -> None:
        self.k.lines.append(f"{indent}{text}")

    @abstractmethod
    def load(self, value: Any, coords: list[str], indent: str) -> str:
        """The name of `value` (an input's element) read at `coords`, in this language."""

    @abstractmethod
    def body_op(self, op: Any, values: dict[Any, str], indent: str, coords: list[str]) -> None:
        """One scalar op of a stage's body, written in this language; its result's name into `values`."""

    def settled(self, value: Any) -> bool:
        """Whether `value()` answers for `value` before the nest's stage for it is looked for
        (a row's reduction result, a reshape's source)."""
        return False

    def value(self, value: Any, coords: list[str], indent: str, memo: dict[Any, str], acc: str | None, at: list[str]) -> str:
        """The name holding `value` at the point `coords`: a constant, the accumulator (the
        reduction's result where the nest computes it, at `at`), a stage's body evaluated there,
        or what `load` reads from an input."""
        key = (value, tuple(coords))
        if key in memo:
            return memo[key]
        if value in self.k.scalars:
            return self.k.scalars[value]
        reduction = self.nest.reduction
        if reduction is not None and value == reduction.result:
            if acc is None or coords != at:
                raise Unfused("the reduction's result is read at another point than the one being computed")
            return acc
        stage = self.nest.stages.get(value)
        if stage is not None:
            self._resolve_operands(stage, coords, indent, memo, acc, at)
        name = self.stage(stage, coords, indent, memo, acc, at) if stage is not None else self.load(value, coords, indent)
        memo[key] = name
        return name

    def stage(
        self, stage: loopnest.Stage, coords: list[str], indent: str, memo: dict[Any, str], acc: str | None, at: list[str], out_arg: str | None = None
    ) -> str:
        """A stage's body at `coords` (each operand read at its map's point; `out_arg`: what its
        output block argument reads), each scalar op written by `body_op`; the yielded value's name."""
        values: dict[Any, str] = {}
        for n, (operand, arg) in enumerate(zip(stage.op.operands, stage.body.arguments)):
            if not list(arg.uses):
                continue
            if n >= stage.n_ins and out_arg is not None:
                values[arg] = out_arg
            else:
                values[arg] = self.value(operand, [coordinate(e, coords) for e in stage.maps[n]], indent, memo, acc, at)
        yielded = None
        for inner in stage.body.operations:
            op = inner.operation
            if op.name == "linalg.yield":
                yielded = c_reference.operand(self.k, values, op.operands[0], op.name)
            else:
                self.body_op(op, values, indent, coords)
        assert yielded is not None
        return yielded

    def _resolve_operands(self, top: loopnest.Stage, coords: list[str], indent: str, memo: dict[Any, str], acc: str | None, at: list[str]) -> None:
        """Put every value `top`'s body reads, through stages at any depth, into `memo` first,
        deepest first and in the order the body reads them (so the text is the same)."""

        def pending(value: Any, at_coords: list[str]) -> list[loopnest.Read] | None:
            stage = self._stage_to_evaluate(value, at_coords, memo)
            return None if stage is None else stage_reads(stage, at_coords)

        loopnest.deepest_first(stage_reads(top, coords), pending, lambda value, at_coords: self.value(value, at_coords, indent, memo, acc, at))

    def _stage_to_evaluate(self, value: Any, coords: list[str], memo: dict[Any, str]) -> loopnest.Stage | None:
        """The stage value() would evaluate for `value` at `coords`, if it would evaluate one."""
        reduction = self.nest.reduction
        if (value, tuple(coords)) in memo or value in self.k.scalars or (reduction is not None and value == reduction.result):
            return None
        if self.settled(value):
            return None
        stage: loopnest.Stage | None = self.nest.stages.get(value)
        return stage
