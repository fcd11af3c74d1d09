"""One comparison rule: `run --expect-close`, `verify` and `tune` judge the same arrays the same
way (NaN where NaN is expected, infinities, integers exactly, float16 and float64), because all
three go through checks.close_elements with the tolerances checks.computed_tolerance gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyree_build.actions import checks
from pyree_build.core.errors import PyreeError
from pyree_build.models import verify
from pyree_build.tuning import references, variant_checks
from pyree_build.tuning.plan import Plan

DTYPES = st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.bool_])
TOLERANCES = st.sampled_from([0.0, 1e-8, 1e-5, 1e-3, 0.5])


@st.composite
def pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    dtype = np.dtype(draw(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    expected = draw(hnp.arrays(dtype, shape))
    # Actual: the expected values nudged where drawn (by an ulp, a relative step, a sign, a NaN).
    actual = expected.copy()
    if actual.size and draw(st.booleans()):
        flat = actual.reshape(-1)
        for i in draw(st.lists(st.integers(0, flat.size - 1), max_size=4)):
            if dtype.kind == "f":
                flat[i] = draw(
                    st.sampled_from([np.nextafter(flat[i], dtype.type(np.inf)), flat[i] * dtype.type(1.001), -flat[i], dtype.type(np.nan), dtype.type(np.inf)])
                )
            elif dtype.kind == "b":
                flat[i] = not flat[i]
            else:
                flat[i] = flat[i] ^ 1
    return actual, expected


def _run_passes(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> bool:
    try:
        checks.check_close([actual], [expected], rtol=rtol, atol=atol, source="m.vmfb")  # type: ignore[list-item]
    except PyreeError:
        return False
    return True


def _tune_passes(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> bool:
    plan = Plan(sources=["k.c"], kind="system", module="m.vmfb", function="f", inputs=[], rtol=rtol, atol=atol)
    return variant_checks.compare(plan, "k.so", [actual], [expected])[0] == "ok"


@settings(max_examples=400, deadline=None)
@given(pair=pairs(), rtol=TOLERANCES, atol=TOLERANCES)
def test_run_verify_and_tune_agree_on_every_array_at_given_tolerances(pair, rtol, atol):
    actual, expected = pair
    verdicts = {
        "run --expect-close": _run_passes(actual, expected, rtol, atol),
        "verify": verify.compare(0, "y", actual, expected, rtol, atol).passed,
        "tune": _tune_passes(actual, expected, rtol, atol),
    }
    assert len(set(verdicts.values())) == 1, (verdicts, actual, expected)
    # The rule itself, element by element, on what numpy can say plainly.
    if expected.dtype.kind == "f" and expected.size:
        both_nan = np.isnan(actual) & np.isnan(expected)
        assert checks.close_elements(actual, expected, rtol=rtol, atol=atol)[both_nan].all()


@settings(max_examples=200, deadline=None)
@given(pair=pairs())
def test_verify_and_tune_use_the_same_default_tolerance_against_a_computed_reference(pair):
    actual, expected = pair
    rtol, atol = references.tolerance(None, None, [expected], computed=True)
    verified = verify.compare(0, "y", actual, expected, None, None).passed
    if expected.dtype.kind == "f" and expected.size:
        assert (rtol, atol) == checks.computed_tolerance(expected)
        assert _tune_passes(actual, expected, rtol, atol) == verified
    elif expected.dtype.kind in "biu":  # exact in verify; tune's user-value defaults are below one step
        assert verified == bool(np.array_equal(actual, expected))
