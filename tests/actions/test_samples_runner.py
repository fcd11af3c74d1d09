"""`samples` trusts only the ctest run it just started, says when -R matches nothing, and a
SIGINT ends cmake, ninja, ctest and every job they started (issue 13, items 5 and 7)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, assert_clean_error, run_cli
from support.watched import Watched, leftovers

from pyree_build.actions.sample_runner import collect_results
from pyree_build.core.errors import PyreeError

pytestmark = pytest.mark.slow

ONE_TEST = "cpu_plugin.system.local-sync"


@pytest.fixture(scope="module")
def samples_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("samples") / "build"
    result = run_cli("samples", "--build-dir", build, "-R", ONE_TEST, timeout=1200)
    assert result.returncode == 0, result
    assert "1 passed, 0 failed" in result.stdout
    return build


def test_a_regex_that_matches_no_test_says_so(samples_build):
    result = run_cli("samples", "--build-dir", samples_build, "-R", "no_such_test_xyz")
    assert_clean_error(result, "no test matches -R 'no_such_test_xyz'", "ctest --test-dir BUILD -N")
    assert "passed" not in result.stdout


def test_a_stale_result_file_is_never_read_as_this_runs_results(samples_build):
    """An earlier all-passed file must not hide a failing test."""
    junit = samples_build / "pyree-samples-junit.xml"
    stale = junit.read_text()
    assert 'status="run"' in stale
    plugin = next(samples_build.rglob("system_plugin.so"))
    good, stamp = plugin.read_bytes(), plugin.stat()
    try:
        plugin.write_bytes(b"not an ELF file")
        os.utime(plugin, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # the same time: ninja keeps it, the test fails
        result = run_cli("samples", "--build-dir", samples_build, "-R", ONE_TEST)
        assert result.returncode == 1, result
        assert "0 passed, 1 failed" in result.stdout, result
        assert "FAILED" in result.stdout
    finally:
        plugin.write_bytes(good)
        os.utime(plugin, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))


def test_a_result_file_that_cannot_be_replaced_is_an_error(samples_build):
    junit = samples_build / "pyree-samples-junit.xml"
    junit.unlink(missing_ok=True)
    junit.mkdir()
    try:
        result = run_cli("samples", "--build-dir", samples_build, "-R", ONE_TEST)
        assert_clean_error(result, "cannot remove the previous result file", str(junit))
        assert "passed" not in result.stdout
    finally:
        junit.rmdir()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("<html><body>not junit</body></html>", "is not JUnit XML (its root element is <html>)"),
        ("<testsuite><testcase", "cannot be read"),
        ("", "cannot be read"),
    ],
)
def test_a_foreign_result_file_is_a_clear_error(tmp_path, content, message):
    junit = tmp_path / "junit.xml"
    junit.write_text(content)
    with pytest.raises(PyreeError, match="result file") as info:
        collect_results(tmp_path, junit, '{"tests": []}')
    assert message in info.value.what


def test_sigint_to_samples_ends_ninja_ctest_and_their_jobs(tmp_path):
    build = tmp_path / "build"
    argv = [sys.executable, "-m", "pyree_build", "samples", "--build-dir", str(build)]
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT), PYREE_BUILD_CACHE="off")
    watched = Watched(argv, env)
    watched.wait_for("ninja")
    # A job of ninja that compiles PTX with NVRTC in worker threads of its own, in process:
    # the slowest to stop, as it must finish that call before it can clean up.
    watched.wait_for("pyree_build ptx")
    code, err = watched.stop(signal.SIGINT)
    assert code == 130, err
    assert "stopped by SIGINT" in err and "Traceback" not in err
    assert watched.survivors() == []
    assert leftovers(build) == []
    again = run_cli("samples", "--build-dir", build, "-R", ONE_TEST, timeout=1200)
    assert again.returncode == 0, again
    assert "1 passed, 0 failed" in again.stdout
