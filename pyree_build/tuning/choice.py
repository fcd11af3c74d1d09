"""The choice among measured variants: an interval of each median (`median_interval`), which
variants are clearly faster than others, the winner (`choose`: the first in order, the kernel as
written first, that none is clearly faster than), the ranking and the table that shows it (`render`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pyree_build.tuning.plan import AS_WRITTEN_ORDER, Variant


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.2f} us" if ms < 1 else f"{ms:.3f} ms"


def ranked(variants: Sequence[Variant]) -> list[Variant]:
    """The chosen variant (choose), the other measured ones by median time, then the rejected in
    their given order."""
    winner, _ = choose(variants)
    good = sorted((v for v in variants if v.status == "ok" and v.samples_ms), key=lambda v: (v is not winner, v.median_ms))
    return good + [v for v in variants if v not in good]


def median_interval(samples: Sequence[float]) -> tuple[float, float]:
    """A distribution-free ~99% interval of the median of `samples`: the order statistics k and
    n + 1 - k with k = (n - 2.58 sqrt(n)) / 2. It narrows as rounds are added (min - max never
    does), and assumes nothing of the noise's shape, which on a loaded machine is anything;
    99%, not 95%: a choice is made among many pairs, and a false "apart" changes the winner."""
    ordered = sorted(samples)
    k = max(0, int((len(ordered) - 2.58 * math.sqrt(len(ordered))) / 2))
    return ordered[k], ordered[len(ordered) - 1 - k]


def clearly_faster(a: Variant, b: Variant) -> bool:
    """`a`'s median is below `b`'s beyond what the rounds' noise allows (the intervals are apart)."""
    return median_interval(a.samples_ms)[1] < median_interval(b.samples_ms)[0]


def choose(variants: Sequence[Variant]) -> tuple[Variant | None, list[Variant]]:
    """The winner and the variants it cannot be told apart from. The winner is the first
    variant, in the order declared (the kernel as written first: variant_checks.as_written_first),
    that no other is clearly faster than: among variants whose times overlap, noise would pick a
    different one each run, the declared order picks the same one. There is always one (the
    variant whose interval starts lowest)."""
    measured = sorted((v for v in variants if v.status == "ok" and v.samples_ms), key=lambda v: v.order)
    for v in measured:
        if not any(clearly_faster(o, v) for o in measured if o is not v):
            return v, [o for o in measured if o is not v and not clearly_faster(v, o)]
    return None, []


def choice_line(variants: Sequence[Variant]) -> str:
    """How sure the choice is, in words."""
    winner, tied = choose(variants)
    if winner is None:
        return "chosen: none"
    if not tied:
        return f"chosen: {winner.label}: clearly faster than every other variant (the intervals of the medians are apart)" + _alternation(winner)
    return (
        f"chosen: {winner.label}: a tie with {', '.join(v.label for v in tied)} (the intervals of their medians overlap, "
        "so noise cannot tell them apart); the kernel as written, else the first declared of them, wins: the same one every run"
    ) + _alternation(winner)


def _alternation(winner: Variant) -> str:
    """What the line adds where the winner's rounds were the confirmation's (benchmarks.confirm),
    so drift in the machine's speed reached it and the variants it was timed in turn with alike."""
    if not winner.alternated:
        return ""
    if winner.order == AS_WRITTEN_ORDER:
        return "; its rounds alternated with those of a variant that had looked faster, which was not, timed so"
    return "; its rounds alternated with the kernel as written's, and it was clearly faster in them"


def render(variants: Sequence[Variant]) -> str:
    """The table: rank, variant, median, min - max, rounds; rejected variants with the reason."""
    rows = ranked(variants)
    width = max([len(v.label) for v in rows] + [7])
    lines = [f"{'rank':<5} {'variant':<{width}} {'median':>11} {'min - max':>25} {'rounds':>6}"]
    for rank, v in enumerate((v for v in rows if v.status == "ok" and v.samples_ms), 1):
        span = f"{_fmt(min(v.samples_ms))} - {_fmt(max(v.samples_ms))}"
        lines.append(f"{rank:<5} {v.label:<{width}} {_fmt(v.median_ms):>11} {span:>25} {len(v.samples_ms):>6}")
    for v in rows:
        if v.status != "ok" or not v.samples_ms:
            lines.append(f"{'-':<5} {v.label:<{width}} {v.status.upper()}: {v.reason.splitlines()[0] if v.reason else 'not measured'}")
    if any(v.status == "ok" and v.samples_ms for v in rows):
        lines.append(choice_line(variants))
    return "\n".join(lines)
