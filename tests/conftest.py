"""Shared fixtures. Every test uses the real tools: iree-compile, iree-run-module, zig/clang, CMake."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Tests share one fresh cache (the subprocesses they start inherit it), never the user's: a
# PYREE_BUILD_CACHE or remote cache the user set is replaced, not used, or the user's entries
# would answer the suite's builds (and the suite's would land in the user's cache). A pytest
# started by a test inherits its parent's cache through the marker.
if "PYREE_TEST_OWN_CACHE" not in os.environ or os.environ["PYREE_TEST_OWN_CACHE"] != os.environ.get("PYREE_BUILD_CACHE"):
    import atexit
    import shutil
    import tempfile

    _TEST_CACHE = tempfile.mkdtemp(prefix="pyree-test-cache.")
    os.environ["PYREE_BUILD_CACHE"] = os.environ["PYREE_TEST_OWN_CACHE"] = _TEST_CACHE
    atexit.register(shutil.rmtree, _TEST_CACHE, True)
for _user_setting in [name for name in os.environ if name.startswith("PYREE_BUILD_REMOTE_CACHE")]:
    del os.environ[_user_setting]

# Every command a test runs is served by the per-user server (`--server on`, the default, as
# users get it) or runs in its own process (`--server off`): pytest_configure sets
# PYREE_BUILD_SERVER, which the commands' subprocesses inherit. The session's server lives in a
# socket directory of its own (never the user's server, nor another pytest's) and is stopped
# when the session ends; its idle timeout ends it should pytest itself be killed.
if not os.environ.get("PYREE_TEST_OWN_RUNTIME"):
    import atexit
    import shutil
    import tempfile

    _RUNTIME = tempfile.mkdtemp(prefix="pyree-rt.", dir="/tmp")  # 0700, short: sun_path holds 108 bytes
    os.environ["XDG_RUNTIME_DIR"] = _RUNTIME
    os.environ["PYREE_TEST_OWN_RUNTIME"] = "1"
    atexit.register(shutil.rmtree, _RUNTIME, True)
os.environ.setdefault("PYREE_BUILD_SERVER_IDLE", "300")

REPO = Path(__file__).resolve().parent.parent

# The tests and every Python they start import one pyree_build: the one the tests import
# (CI: the installed one; `pip install .` is not editable). A child's `python -m` or `-c` would
# put its working directory, often the checkout's root, first on sys.path and import that copy,
# whose identity (its server's socket, cache keys) differs from the tests' own: so no child
# puts its directory on sys.path, and every child finds the tests' copy first on PYTHONPATH.
import pyree_build as _tested  # noqa: E402

PACKAGE_ROOT = Path(_tested.__file__).resolve().parent.parent
os.environ["PYTHONSAFEPATH"] = "1"
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != str(PACKAGE_ROOT):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
SAMPLES = REPO / "samples"
PLUGIN_SAMPLE = SAMPLES / "custom_dispatch" / "cpu" / "plugin"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--server",
        choices=("on", "off"),
        default="on",
        help="run every pyree-build command through the per-user server (on, the default, as users get it) or in its own process (off)",
    )


def pytest_configure(config: pytest.Config) -> None:
    os.environ["PYREE_BUILD_SERVER"] = config.getoption("--server")


def stop_server() -> None:
    """Stop this session's server (if one runs) and wait until it has exited."""
    subprocess.run([sys.executable, "-m", "pyree_build", "server", "stop"], capture_output=True, timeout=60)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_server()


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.output = proc.stdout + proc.stderr

    def __repr__(self) -> str:
        return f"CliResult(rc={self.returncode}, stdout={self.stdout[-2000:]!r}, stderr={self.stderr[-2000:]!r})"


def benchmark_module(name: str) -> Any:
    """benchmarks/NAME.py loaded as a module: the parts of an on-demand benchmark a test checks."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(*args: str | os.PathLike[str], cwd: Path | None = None, timeout: float = 300) -> CliResult:
    """Run `python -m pyree_build ARGS` as a user would, in a separate process."""
    proc = subprocess.run(
        [sys.executable, "-m", "pyree_build", *map(os.fspath, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliResult(proc)


def assert_clean_error(result: CliResult, *fragments: str) -> None:
    """A user error: non-zero exit, one message with each fragment, and no traceback."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.output, result
    assert "error:" in result.stderr, result
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} not in:\n{result.stderr}"


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def system_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's system plugin, built once for the session."""
    out = tmp_path_factory.mktemp("system_plugin") / "system_plugin.so"
    result = run_cli("plugin", "--kind", "system", PLUGIN_SAMPLE / "system_plugin.c", "-o", out)
    assert result.returncode == 0, result
    return out


@pytest.fixture(scope="session")
def system_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("system_module") / "system_example.vmfb"
    result = run_cli("compile", PLUGIN_SAMPLE / "example.mlir", "-o", out, "--target", "llvm-cpu")
    assert result.returncode == 0, result
    return out


def install_backend(root: Path, entry_name: str, module_source: str) -> Path:
    """Make `root`, once on PYTHONPATH, an installed package whose `pyree_build.backends`
    entry point `entry_name` is `toy_backend:BACKEND` (a module written from `module_source`):
    the way another package adds a backend, with no edit to pyree_build."""
    (root / "toy_backend.py").write_text(module_source)
    info = root / "toy_backend-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[pyree_build.backends]\n{entry_name} = toy_backend:BACKEND\n")
    return root
