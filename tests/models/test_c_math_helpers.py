"""The generated C's own math (no libm in a freestanding kernel) computes what MLIR's math ops
mean: rounding halves to even or away from zero, truncation, and integer powers, checked
against Python's and numpy's definitions over drawn values, compiled with the zig clang the
plugins are built with."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyree_build.core import toolchain
from pyree_build.models.codegen import c_reference

NAMES = ("pyree_roundeven", "pyree_round", "pyree_trunc", "pyree_powi", "pyree_ipowi")


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    """A program reading `op x n` lines and printing each result exactly (%a)."""
    kernel = c_reference.Kernel()
    for name in NAMES:
        c_reference._helper(kernel, name)
    source = tmp_path_factory.mktemp("helpers") / "check.c"
    source.write_text(
        "#include <stdint.h>\n#include <stdio.h>\n"
        + "\n".join(c_reference.helpers_text(kernel))
        + r"""
int main(void) {
  char op[4]; double x; long long n;
  while (scanf("%3s %lf %lld", op, &x, &n) == 3) {
    if (op[0] == 'e') printf("%a\n", pyree_roundeven(x));
    else if (op[0] == 'r') printf("%a\n", pyree_round(x));
    else if (op[0] == 't') printf("%a\n", pyree_trunc(x));
    else if (op[0] == 'p') printf("%a\n", pyree_powi(x, n));
    else printf("%lld\n", (long long)pyree_ipowi((int64_t)x, n));
  }
  return 0;
}
"""
    )
    exe = source.with_suffix("")
    subprocess.run([*toolchain.c_compiler("zig").argv, "-O1", str(source), "-o", str(exe)], check=True)

    def run(lines: list[str]) -> list[str]:
        done = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        return done.stdout.split()

    return run


FLOATS = st.floats(-1e6, 1e6, allow_nan=False) | st.integers(-40, 40).map(lambda k: k / 2) | st.sampled_from([0.0, -0.0, 2.0**53, -(2.0**60)])


@settings(max_examples=25, deadline=None)
@given(st.lists(FLOATS, min_size=1, max_size=40))
def test_rounding_matches_its_definition(helpers, xs):
    out = helpers([f"{op} {x!r} 0" for x in xs for op in "ert"])
    for i, x in enumerate(xs):
        even, away, toward = (float.fromhex(v) for v in out[3 * i : 3 * i + 3])
        assert even == np.round(x), (x, even)  # numpy rounds halves to even
        assert away == float(np.sign(x) * np.floor(abs(x) + 0.5)), (x, away)
        assert toward == np.trunc(x), (x, toward)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(-4, 4).filter(lambda x: abs(x) > 1e-3), st.integers(-12, 12)), min_size=1, max_size=40))
def test_a_float_to_an_integer_power(helpers, pairs):
    out = helpers([f"p {x!r} {n}" for x, n in pairs])
    for (x, n), got in zip(pairs, out):
        want = x**n
        assert float.fromhex(got) == pytest.approx(want, rel=1e-12), (x, n)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(-3, 70)), min_size=1, max_size=40))
def test_an_integer_to_an_integer_power_wraps_as_int64(helpers, pairs):
    out = helpers([f"i {a} {n}" for a, n in pairs])
    for (a, n), got in zip(pairs, out):
        if n < 0:
            want = 1 if a == 1 else ((-1) ** (-n) if a == -1 else 0)
        else:
            want = (a**n + 2**63) % 2**64 - 2**63
        assert int(got) == want, (a, n)
