"""A variant timed: benchmark rounds until they agree within the spread (or the budget or the
rounds are spent), and more rounds for the contenders the noise cannot tell apart (`separate`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from pyree_build.actions import bench as bench_action
from pyree_build.core import echo
from pyree_build.core.errors import PyreeError
from pyree_build.tuning.choice import choose
from pyree_build.tuning.plan import PathLike, Plan, Variant, classify, runs_with


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
        variant.status, variant.reason = classify(error), f"in the benchmark: {error.what}"
    return variant


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
                v.status, v.reason = classify(error), f"in the benchmark: {error.what}"
                return
