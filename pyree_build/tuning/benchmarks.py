"""A variant timed: benchmark rounds until they agree within the spread (or the budget or the
rounds are spent), more rounds for the contenders the noise cannot tell apart (`separate`), and
a winner other than the kernel as written timed again in alternation with it (`confirm`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from pyree_build.actions import bench as bench_action
from pyree_build.core import echo
from pyree_build.core.errors import PyreeError
from pyree_build.tuning.choice import choose
from pyree_build.tuning.plan import AS_WRITTEN_ORDER, PathLike, Plan, Variant, classify, runs_with


def spread_of(samples: Sequence[float]) -> float:
    """(max - min) / median of the samples: how far apart the rounds are."""
    middle = statistics.median(samples)
    return (max(samples) - min(samples)) / middle if middle > 0 else float("inf")


def measure(plan: Plan, plugin: PathLike) -> list[float]:
    """Benchmark rounds (each the median of `repetitions`, in ms) until the last three are within
    `spread` of each other, or `budget` seconds or `max_rounds` are spent."""
    samples: list[float] = []
    deadline = time.monotonic() + plan.budget
    while len(samples) < plan.max_rounds:
        samples.append(_one_round(plan, plugin))
        if len(samples) >= 3 and spread_of(samples[-3:]) <= plan.spread:
            break
        if time.monotonic() >= deadline:
            break
    return samples


def _one_round(plan: Plan, plugin: PathLike) -> float:
    """One benchmark round: the median of `repetitions`, in ms (summed over the function's benchmarks)."""
    module, plugins = runs_with(plan, plugin)
    with echo.muted_commands():
        result = bench_action.bench(
            module, plan.function, inputs=plan.inputs, plugins=plugins, device=plan.device,
            repetitions=plan.repetitions, min_time=plan.min_time, timeout=plan.timeout,
        )  # fmt: skip
    return sum(t.median_ms for t in result.timings)


def measure_variant(plan: Plan, variant: Variant) -> Variant:
    assert variant.runs_with is not None
    try:
        variant.samples_ms = measure(plan, variant.runs_with)
    except PyreeError as error:
        _failed(variant, error)
    return variant


def _failed(v: Variant, error: PyreeError) -> None:
    """A benchmark of `v` failed: it is out of the choice, and says why."""
    v.status, v.reason = classify(error), f"in the benchmark: {error.what}"


def separate(plan: Plan, variants: Sequence[Variant]) -> None:
    """More rounds, the contenders in turn, while the winner cannot be told apart from a variant
    whose median is lower (more rounds narrow both intervals), until they separate, or the
    rounds (--max-rounds more) or the budget (--budget seconds) are spent."""
    deadline = time.monotonic() + plan.budget
    for _ in range(plan.max_rounds):
        winner, tied = choose(variants)
        faster = [v for v in tied if winner is not None and v.median_ms < winner.median_ms]
        if winner is None or not faster or time.monotonic() >= deadline:
            return
        for v in (winner, *faster):
            assert v.runs_with is not None
            try:
                v.samples_ms.append(_one_round(plan, v.runs_with))
            except PyreeError as error:
                _failed(v, error)
                return


# Rounds each contender gets in turn with the kernel as written before a winner that is not the
# kernel as written is kept (confirm): at least the first number, up to the second within --budget.
CONFIRM_ROUNDS = (3, 7)


def confirm(plan: Plan, variants: Sequence[Variant], time_round: Callable[[Variant], float] | None = None) -> None:
    """A winner that is not the kernel as written, timed again in turn with it, both their
    rounds replaced by those. Variants are measured one after another, so drift in the machine's
    speed between them reads as a difference between variants; on a 2-core VM a tile measured
    later was "clearly faster", then 1.1x slower than the defaults when the two alternated.
    Rounds in turn share the drift. The winner stays only if it is still clearly faster; if not,
    choose() falls back to the kernel as written, or to another variant clearly faster than it,
    which joins the rounds in turn with every variant confirmed so far (all timed again, so
    their rounds stay comparable). `time_round`: one round of a variant, in ms (default: its
    benchmark, as measure's rounds)."""
    written = next((v for v in variants if v.order == AS_WRITTEN_ORDER and v.status == "ok" and v.samples_ms), None)
    if written is None:
        return
    deadline = time.monotonic() + plan.budget
    in_turn = [written]
    while True:
        winner, _ = choose(variants)
        if winner is None or winner.order == AS_WRITTEN_ORDER or any(winner is v for v in in_turn):
            return
        if len(in_turn) > 1 and time.monotonic() >= deadline:  # the first contender always; more within --budget
            return
        in_turn.append(winner)
        rounds = _rounds_in_turn(in_turn, deadline, time_round or (lambda v: _one_round(plan, _runs_with(v))))
        if rounds is None:
            return
        for v, samples in zip(in_turn, rounds):
            v.samples_ms, v.alternated = samples, True


def _runs_with(v: Variant) -> PathLike:
    assert v.runs_with is not None
    return v.runs_with


def _rounds_in_turn(variants: Sequence[Variant], deadline: float, time_round: Callable[[Variant], float]) -> list[list[float]] | None:
    """Rounds of the variants in turn: CONFIRM_ROUNDS[0], then more up to CONFIRM_ROUNDS[1]
    while the deadline allows; None where a benchmark failed (that variant's status says why)."""
    least, most = CONFIRM_ROUNDS
    samples: list[list[float]] = [[] for _ in variants]
    while len(samples[0]) < most and (len(samples[0]) < least or time.monotonic() < deadline):
        for v, out in zip(variants, samples):
            try:
                out.append(time_round(v))
            except PyreeError as error:
                _failed(v, error)
                return None
    return samples
