"""tune's choice survives noise (issue 36): variants whose rounds cannot be told apart are a
tie, won by the first declared; a variant clearly faster wins whatever its place; the choice
depends on the rounds' values, not on their order or on which tied variant happened to
measure lowest. Properties over drawn round times (the tool runs are tests/tuning/test_tune.py's)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyree_build.tuning import benchmarks, choice
from pyree_build.tuning.plan import AS_WRITTEN_ORDER, Variant

TIMES = st.lists(st.floats(1.0, 2.0), min_size=3, max_size=20)


def _variants(samples: list[list[float]]) -> list[Variant]:
    return [Variant({"K": str(k)}, status="ok", samples_ms=list(s)) for k, s in enumerate(samples)]


@settings(max_examples=200, deadline=None)
@given(st.lists(TIMES, min_size=2, max_size=6), st.randoms(use_true_random=False))
def test_the_choice_does_not_depend_on_the_order_of_rounds(samples, rnd):
    winner, tied = choice.choose(_variants(samples))
    shuffled = [rnd.sample(s, len(s)) for s in samples]
    again, tied_again = choice.choose(_variants(shuffled))
    assert winner is not None and again is not None
    assert winner.label == again.label and [v.label for v in tied] == [v.label for v in tied_again]


@settings(max_examples=200, deadline=None)
@given(st.lists(TIMES, min_size=2, max_size=6))
def test_no_variant_is_clearly_faster_than_the_winner(samples):
    variants = _variants(samples)
    winner, tied = choice.choose(variants)
    assert winner is not None
    assert not any(choice.clearly_faster(v, winner) for v in variants if v is not winner)
    earlier = variants[: variants.index(winner)]
    assert all(any(choice.clearly_faster(o, v) for o in variants if o is not v) for v in earlier)
    assert all(not choice.clearly_faster(winner, v) for v in tied)


@pytest.mark.parametrize("seed", range(20))
def test_the_same_noise_gives_the_same_choice_and_a_clear_winner_wins_anywhere(seed):
    """Variants equal up to noise (15%, uniform): the first declared, run after run (the leader
    by median changes between runs; the choice does not). One variant 30% faster: it, wherever
    it is. Fixed seeds: the noise is random, the property is what a sweep sees run after run."""
    rng = random.Random(seed)
    n, fast = 2 + seed % 5, seed % (2 + seed % 5)

    def run(speedup: bool) -> str:
        samples = [[(0.7 if speedup and k == fast else 1.0) * rng.uniform(1.0, 1.15) for _ in range(12)] for k in range(n)]
        winner, _ = choice.choose(_variants(samples))
        assert winner is not None
        return winner.label

    assert {run(False) for _ in range(5)} == {"K=0"}
    assert {run(True) for _ in range(5)} == {f"K={fast}"}


def test_the_medians_interval_narrows_with_rounds_and_holds_the_median():
    rng = random.Random(7)
    few = [rng.uniform(1, 2) for _ in range(5)]
    many = few + [rng.uniform(1, 2) for _ in range(45)]
    lo, hi = choice.median_interval(few)
    assert (lo, hi) == (min(few), max(few))
    lo_many, hi_many = choice.median_interval(many)
    assert lo_many <= sorted(many)[25] <= hi_many and hi_many - lo_many < hi - lo


def test_the_report_says_whether_the_choice_is_a_tie():
    tied = _variants([[1.0, 1.1, 1.2], [1.05, 1.15, 1.0]])
    assert "a tie with K=1" in choice.choice_line(tied) and "chosen: K=0" in choice.choice_line(tied)
    clear = _variants([[2.0, 2.1, 2.2], [1.0, 1.01, 1.02]])
    assert choice.choice_line(clear).startswith("chosen: K=1: clearly faster")


def test_the_table_puts_the_choice_first_and_says_the_same_in_any_order():
    """The table's first row is the variant best.json names, and its `chosen:` line agrees,
    whatever order the variants are handed over in (the table's own order is by median)."""
    variants = _variants([[1.1, 1.2, 1.15], [1.0, 1.25, 1.05]])  # K=1 has the lower median; they overlap
    for k, v in enumerate(variants):
        v.order = k
    for handed in (variants, variants[::-1], choice.ranked(variants)):
        assert [v.label for v in choice.ranked(handed)] == ["K=0", "K=1"]
        assert choice.choice_line(handed).startswith("chosen: K=0: a tie with K=1")
        assert choice.render(handed).splitlines()[1].split()[:2] == ["1", "K=0"]


def _confirmed(sequential: list[list[float]], true_ms: list[float], drift: list[float]) -> tuple[Variant | None, list[Variant]]:
    """benchmarks.confirm over variants whose own rounds are `sequential` (K=0 the kernel as
    written), each later round of variant k taking true_ms[k] times the machine's speed at that
    moment (drift, one factor per round in the order they run); the winner, and the variants."""
    variants = _variants(sequential)
    variants[0].order = AS_WRITTEN_ORDER
    clock = iter(drift)
    benchmarks.confirm(SimpleNamespace(budget=0.0), variants, time_round=lambda v: true_ms[variants.index(v)] * next(clock))  # type: ignore[arg-type]
    return choice.choose(variants)[0], variants


# A machine whose speed only rises or only falls while it runs, by up to 30% over the rounds.
DRIFT = st.tuples(st.lists(st.floats(0.0, 0.3 / 64), min_size=64, max_size=64), st.booleans()).map(
    lambda steps_up: [1.0 + (1 if steps_up[1] else -1) * sum(steps_up[0][:k]) for k in range(len(steps_up[0]))]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(TIMES, min_size=2, max_size=6), DRIFT)
def test_variants_equal_in_truth_leave_the_kernel_as_written_whatever_the_drift(sequential, drift):
    """However the variants' own rounds came out (drift between them can make any one clearly
    faster), variants that are equal in truth, timed in turn while the machine's speed drifts
    one way, are not told apart: the kernel as written stays the choice."""
    winner, variants = _confirmed(sequential, [1.0] * len(sequential), drift)
    assert winner is variants[0], [(v.label, v.samples_ms) for v in variants]


@settings(max_examples=200, deadline=None)
@given(st.lists(TIMES, min_size=2, max_size=6), st.data())
def test_a_variant_faster_in_truth_than_the_drift_is_kept_and_said_so(sequential, data):
    """A variant 1.5x faster in truth than the others is chosen after the rounds in turn,
    with drift under 1.3x, and the report says its rounds alternated with the kernel as written."""
    fast = data.draw(st.integers(1, len(sequential) - 1))
    sequential[fast] = [t / 4 for t in sequential[fast]]  # its own rounds show it clearly faster
    truth = [1.0 / 1.5 if k == fast else 1.0 for k in range(len(sequential))]
    winner, variants = _confirmed(sequential, truth, data.draw(DRIFT))
    assert winner is variants[fast]
    assert winner.alternated and variants[0].alternated and len(winner.samples_ms) == benchmarks.CONFIRM_ROUNDS[0]
    assert "alternated with the kernel as written" in choice.choice_line(variants)


def test_the_kernel_as_written_winning_outright_is_not_timed_again():
    variants = _variants([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    variants[0].order = AS_WRITTEN_ORDER
    benchmarks.confirm(SimpleNamespace(budget=0.0), variants, time_round=lambda v: pytest.fail("timed again"))  # type: ignore[arg-type]
    assert not any(v.alternated for v in variants)


@settings(max_examples=200, deadline=None)
@given(st.lists(TIMES, min_size=2, max_size=6), DRIFT, st.booleans())
def test_the_chosen_line_says_when_the_winners_rounds_alternated_tie_or_not(sequential, drift, faster):
    """Whatever the winner after the rounds in turn (the kernel as written kept, or a variant
    kept, clearly or in a tie with one never timed in turn), the chosen line says its rounds
    alternated exactly when they did, and which side it was on."""
    truth = [1.0 / 1.5 if faster and k == 1 else 1.0 for k in range(len(sequential))]
    winner, variants = _confirmed(sequential, truth, drift)
    line = choice.choice_line(variants)
    assert winner is not None
    assert ("alternated" in line) == winner.alternated, line
    if winner.alternated:
        side = "with the kernel as written's" if winner.order != AS_WRITTEN_ORDER else "a variant that had looked faster"
        assert side in line, line
