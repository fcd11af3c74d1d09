"""Issue 44 follow-up: a model from a hub never hangs the model verbs. IREE's ONNX lowering
spins forever on a Pad whose mode ONNX does not define; `import`, `ops` and `replace` bound every
tool they start on a model's behalf (--timeout, a default beyond any real model), stop it, say
which model, which step and which limit, and leave nothing behind. Real tools throughout."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import assert_clean_error, run_cli

from pyree_build.core import toolchain
from pyree_build.core.errors import PyreeError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

# Far below the default (600 s): the loop is met in seconds; the margin covers a loaded machine.
LIMIT = "5"
BOUNDED_S = 60


def _pad_model(path: Path, mode: str) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])
    pads = helper.make_tensor("pads", TensorProto.INT64, [4], [0, 1, 0, 1])
    node = helper.make_node("Pad", ["x", "pads"], ["y"], name="pad0", mode=mode)
    graph = helper.make_graph([node], "g", [x], [y], initializer=[pads])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _processes_in(directory: Path) -> list[str]:
    """Command lines of running processes that work in or name `directory` (a tool left behind)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and (cwd.startswith(str(directory)) or str(directory) in cmdline):
            found.append(cmdline)
    return found


def _assert_nothing_left(directory: Path, expected: set[str]) -> None:
    assert {p.name for p in directory.iterdir()} == expected, "an output or a temporary was left"
    deadline = time.monotonic() + 10
    while _processes_in(directory) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_in(directory) == [], "a tool the command started is still running"


def test_import_of_a_model_iree_loops_on_stops_at_its_timeout_with_a_clear_error(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    model = _pad_model(work / "pad_bogus.onnx", "bogus")
    start = time.monotonic()
    try:
        result = run_cli("import", model, "-o", work / "pad.mlir", "--timeout", LIMIT, cwd=work, timeout=BOUNDED_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"import of a Pad with mode='bogus' did not end within {BOUNDED_S} s (--timeout {LIMIT})")
    assert time.monotonic() - start < BOUNDED_S
    assert_clean_error(result, "pad_bogus.onnx", "input conversion", f"timed out after {LIMIT} s", "--timeout", "Pad mode='bogus'", "node 'pad0'")
    assert result.returncode == 1, result
    _assert_nothing_left(work, {"pad_bogus.onnx"})


@pytest.mark.parametrize("verb", [("ops",), ("replace", "--ops", "1", "--import", "padded", "-o", "kernels")], ids=lambda v: v[0])
def test_ops_and_replace_on_a_program_iree_loops_on_stop_at_their_timeout(tmp_path, verb):
    work = tmp_path / "work"
    work.mkdir()
    model = _pad_model(tmp_path / "pad_bogus.onnx", "bogus")
    program = work / "pad.mlir"  # what the importer alone writes: it does not loop, IREE's lowering does
    subprocess.run(toolchain.onnx_importer().command(model, "-o", program), check=True, capture_output=True, timeout=120)
    try:
        result = run_cli(verb[0], program, *verb[1:], "--timeout", LIMIT, cwd=work, timeout=BOUNDED_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{verb[0]} on a program IREE loops on did not end within {BOUNDED_S} s (--timeout {LIMIT})")
    assert_clean_error(result, "pad.mlir", f"timed out after {LIMIT} s", "--timeout")
    _assert_nothing_left(work, {"pad.mlir"})


def test_the_python_api_takes_the_same_bound(tmp_path):
    import pyree_build as pb

    model = _pad_model(tmp_path / "pad_bogus.onnx", "bogus")
    start = time.monotonic()
    with pytest.raises(PyreeError, match=r"timed out after 3 s") as caught:
        pb.import_onnx(model, tmp_path / "pad.mlir", timeout=3)
    assert time.monotonic() - start < BOUNDED_S
    assert "Pad mode='bogus'" in (caught.value.details or "")
    assert not (tmp_path / "pad.mlir").exists()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_is_refused_up_front(tmp_path, value):
    model = _pad_model(tmp_path / "pad.onnx", "constant")
    result = run_cli("import", model, "-o", tmp_path / "pad.mlir", "--timeout", value, timeout=60)
    assert_clean_error(result, "--timeout must be a positive number of seconds")
    assert not (tmp_path / "pad.mlir").exists()


def test_the_default_bound_is_beyond_a_real_model_and_grows_with_its_size(tmp_path):
    from pyree_build.models.ir import limits

    small, large = tmp_path / "small.onnx", tmp_path / "large.onnx"
    small.write_bytes(b"x" * 1000)
    with open(large, "wb") as f:
        f.truncate(400_000_000)  # sparse: the size counts, not the bytes read
    assert limits.time_limit(None, [small]) >= 600
    assert limits.time_limit(None, [large]) >= limits.time_limit(None, [small]) + 90
    assert limits.time_limit(7, [large]) == 7.0


def test_a_valid_pad_imports_within_a_small_bound(tmp_path):
    """The bound does not stop a model that converts: the same Pad with a mode ONNX defines."""
    model = _pad_model(tmp_path / "pad.onnx", "reflect")
    result = run_cli("import", model, "-o", tmp_path / "pad.mlir", "--timeout", "120", timeout=180)
    assert result.returncode == 0, result
    assert "onnx.Pad" in (tmp_path / "pad.mlir").read_text()


def test_ctrl_c_stops_an_import_iree_loops_on_and_leaves_nothing(tmp_path):
    import signal
    import sys

    work = tmp_path / "work"
    work.mkdir()
    model = _pad_model(work / "pad_bogus.onnx", "bogus")
    proc = subprocess.Popen([sys.executable, "-m", "pyree_build", "import", model, "-o", work / "pad.mlir"], cwd=work, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any("iree-compile" in c for c in _processes_in(work)) and time.monotonic() < deadline:
        time.sleep(0.1)  # until the looping tool runs
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=BOUNDED_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("Ctrl-C did not stop the import")
    assert proc.returncode == 130, stderr
    assert "stopped by SIGINT" in stderr and "Traceback" not in stderr, stderr
    _assert_nothing_left(work, {"pad_bogus.onnx"})
