"""Property tests of the user-input parsers: `--input` specs, `--expect` texts and the
printed-output reader. Each either accepts or gives a clear PyreeError; nothing else.

The example counts are bounded for CI; PYREE_FUZZ_EXAMPLES raises them for a longer run.
"""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyree_build.actions import checks
from pyree_build.core.errors import PyreeError

EXAMPLES = int(os.environ.get("PYREE_FUZZ_EXAMPLES", "3000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SPEC_ALPHABET = st.sampled_from(list("0123456789x=.,-+[] eE@fuisibnatrl") + ["f32", "i8", "xf16", "bf16", "nan", "inf", "\t", "\n", "ü"])
spec_like = st.lists(SPEC_ALPHABET, max_size=40).map("".join)


@FUZZ
@given(st.one_of(st.text(max_size=60), spec_like))
def test_input_spec_parser_accepts_or_explains(spec):
    try:
        parsed = checks.parse_input(spec)
    except PyreeError as err:
        assert err.what.startswith("malformed input spec") or "not found" in err.what
        assert err.fix
        return
    if parsed.shape is not None and parsed.values:
        assert len(parsed.values) in (1, math.prod(parsed.shape))
        assert parsed.element_type in checks.ELEMENT_TYPES


@FUZZ
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=3),
    st.sampled_from(["f32", "i32", "i8", "f16", "i1"]),
    st.data(),
)
def test_valid_specs_are_accepted_with_their_shape(dims, etype, data):
    count = math.prod(dims)
    values = data.draw(st.lists(st.integers(-100, 100), min_size=count, max_size=count)) if count else []
    spec = f"{'x'.join(map(str, dims))}x{etype}=" + (" ".join(map(str, values)) if values else "")
    parsed = checks.parse_input(spec)
    assert parsed.shape == tuple(dims)
    assert parsed.element_type == etype


@FUZZ
@given(st.text(max_size=200), st.lists(st.text(max_size=30), max_size=4))
def test_expect_check_passes_or_reports_what_is_missing(output, expected):
    try:
        checks.check_expected(output, expected, source="m.vmfb")
    except PyreeError as err:
        assert err.what == "output does not match what was expected"
        assert "expected (not found)" in (err.details or "")
        return
    lines = [" ".join(line.split()) for line in output.splitlines()] or [""]
    for e in expected:
        assert any(" ".join(e.split()) in line for line in lines)


@FUZZ
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=12))
def test_a_printed_result_reads_back_as_the_same_array(values):
    line = f"{len(values)}xf32=" + " ".join(repr(float(v)) for v in values)
    (array,) = checks.parse_outputs("EXEC @f\nresult[0]: hal.buffer_view\n" + line + "\n")
    assert array.shape == (len(values),)
    assert np.allclose(array, np.asarray(values, dtype=np.float32))


@FUZZ
@given(st.text(max_size=300))
def test_the_output_reader_never_fails_on_arbitrary_text(text):
    for array in checks.parse_outputs(text):
        assert isinstance(array, np.ndarray)
