"""Issue 35, clear errors: what a user is told is true and names the problem, never a traceback,
a secret or an escaped byte."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyree_build.models import verify

FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)


@given(hnp.arrays(np.float32, hnp.array_shapes(max_dims=3, max_side=4), elements=FLOATS))
@settings(max_examples=200, deadline=None)
def test_an_output_equal_to_the_reference_passes_with_zero_error(values):
    result = verify.compare(0, "y", values.copy(), values, rtol=1e-5, atol=1e-6)
    assert result.passed and result.mismatched == 0
    assert result.max_abs_error == 0.0 and result.max_rel_error == 0.0
    assert "abs error 0, rel error 0 (max abs 0, max rel 0;" in result.render(), result.render()  # then the tolerances used


def test_a_real_difference_beside_an_infinity_is_still_reported():
    result = verify.compare(0, "y", np.array([np.inf, 1.0]), np.array([np.inf, 2.0]), rtol=1e-5, atol=1e-6)
    assert not result.passed and result.max_abs_error == 1.0 and result.worst_index == (1,)
    assert not verify.compare(0, "y", np.array([np.inf]), np.array([-np.inf]), rtol=1e-5, atol=1e-6).passed


@given(
    scheme=st.sampled_from(["ftp:", "http:", "https:", "file:", "", "http:/", "ht tp:"]),
    password=st.text(alphabet="abc:/@?#[]% ", max_size=8),
    rest=st.sampled_from(["h/x", "h:99999/x", "[::1/x", "h:port/x", ""]),
)
@settings(max_examples=200, deadline=None)
def test_a_malformed_remote_url_is_noted_without_its_password(scheme, password, rest):
    import contextlib
    import io
    import os

    from pyree_build.cache import remote

    secret = f"S3cr{password}"
    url = f"{scheme}//alice:{secret}@{rest}"
    remote._CONFIGURED.pop(url, None)
    stderr = io.StringIO()
    old = os.environ.get(remote.URL_ENV)
    os.environ[remote.URL_ENV] = url
    try:
        with contextlib.redirect_stderr(stderr):
            configured = remote.from_env()
    finally:
        os.environ.pop(remote.URL_ENV) if old is None else os.environ.__setitem__(remote.URL_ENV, old)
        remote._CONFIGURED.pop(url, None)
    shown = stderr.getvalue() + (configured.display if configured is not None else "")
    assert "S3cr" not in shown, shown


@functools.cache
def _mlir_context():  # one for every example: creating one costs ~0.1 s
    from pyree_build.models.ir import program

    return program.ir.Context()


# No NUL: MLIR's Python bindings pass a location's name on as a C string, and one made with an
# embedded NUL can come back for a later name in the same context (seen: ' ' printed as NUL).
# No lone surrogate: an ONNX name is UTF-8 (a protobuf string), which cannot hold one.
@given(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20))
@settings(max_examples=300, deadline=None)
def test_a_node_name_reads_back_from_the_location_mlir_printed(name):
    from pyree_build.models.ir import program

    with _mlir_context():
        printed = str(program.ir.Location.name(name))  # MLIR's own printer: bytes outside printable ASCII as \HH
    if name:
        assert program.location_names(printed) == [name], printed


def test_ops_prints_unicode_node_names_as_text(cli, tmp_path):
    onnx = pytest.importorskip("onnx")
    from support import onnx_models as models

    model = models.mlp()
    for i, node in enumerate(model.graph.node):
        node.name = f"câble_{i}_😀"
    onnx.save(model, tmp_path / "m.onnx")
    assert cli("import", tmp_path / "m.onnx", "-o", tmp_path / "m.mlir").returncode == 0
    result = cli("ops", tmp_path / "m.mlir")
    assert result.returncode == 0, result
    assert "câble_0_😀" in result.stdout and "\\C3" not in result.stdout, result.stdout
