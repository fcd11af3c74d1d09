"""The server serves only callers it is equal to (issue 34): it never imports from the caller's
directory, and `server status|stop` answer whatever pyree_build the server runs.

The typed `pyree-build` (the console script beside this Python) is what a new user runs. From a
checkout's root a server started with `python -m` imported the checkout's `pyree_build/` and
refused every later command; a worker put the caller's directory first on sys.path, so a
module there named like a dependency ran in place of it. (Under an editable install the
environment maps `pyree_build` to the checkout itself, so the refusal shows only with a normal
install, as CI's; the shadowing dependency shows under both.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import pyree_build
from pyree_build.core import server_protocol

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the server is tested on Linux (/proc, SCM_RIGHTS)")

TYPED = Path(sys.executable).with_name("pyree-build")
SHADOWED = ("onnx", "onnxruntime", "numpy", "elftools")


@pytest.fixture
def runtime() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    yield path
    subprocess.run([sys.executable, "-m", "pyree_build", "server", "stop"], env={**os.environ, "XDG_RUNTIME_DIR": str(path)}, capture_output=True, timeout=60)
    shutil.rmtree(path, ignore_errors=True)


def _checkout(root: Path) -> Path:
    """A directory like a checkout's root: a copy of pyree_build and modules named like its
    dependencies, each of which leaves a mark when imported and then fails to import."""
    root.mkdir()
    package = root / "pyree_build"
    shutil.copytree(Path(pyree_build.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    mark = "import pathlib; pathlib.Path(__file__).with_suffix('.imported').write_text('x')\n"
    init = package / "__init__.py"
    init.write_text(mark + init.read_text())
    for name in SHADOWED:
        (root / f"{name}.py").write_text(mark + f"raise ImportError('the caller directory copy of {name} was imported')\n")
    return root


def _marks(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.imported"))


def _typed(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TYPED), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not TYPED.is_file(), reason=f"no console script {TYPED} (pyree_build is not installed into this Python's environment)")
def test_from_a_checkouts_root_nothing_is_refused_and_nothing_there_is_imported(tmp_path, runtime):
    onnx_models = pytest.importorskip("onnx_models", reason="onnx is not installed (pip install 'pyree_build[onnx]')")
    root = _checkout(tmp_path / "checkout")
    onnx_models.save(onnx_models.mlp(), root / "m.onnx")
    results = {}
    for mode in ("on", "off"):
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYREE_BUILD_SERVER": mode}
        first, second = _typed("--version", cwd=root, env=env), _typed("--version", cwd=root, env=env)
        imported = _typed("import", "m.onnx", "-o", f"m-{mode}.mlir", cwd=root, env=env)
        for result in (first, second, imported):
            assert result.returncode == 0 and "refused" not in result.stderr and "running in this process" not in result.stderr, result
        results[mode] = (first.stdout, imported.stdout.replace(mode, "MODE"))
        assert _marks(root) == [], f"the command imported the caller's directory's files ({mode})"
    assert results["on"] == results["off"]
    assert (root / "m-on.mlir").read_bytes() == (root / "m-off.mlir").read_bytes()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    status = _typed("server", "status", cwd=root, env=env)
    assert status.returncode == 0 and "server: running" in status.stdout, status
    stopped = _typed("server", "stop", cwd=root, env=env)
    assert stopped.returncode == 0 and "server: stopped" in stopped.stdout, stopped
    assert "server: not running" in _typed("server", "status", cwd=root, env=env).stdout


def test_the_boot_command_imports_the_clients_package_and_nothing_from_the_directory(tmp_path):
    """What starts a server, or the native client's in-process CLI: from a directory with a copy
    of pyree_build and shadowing modules, it runs the client's own package."""
    root = _checkout(tmp_path / "checkout")
    code = "import numpy, elftools, pyree_build; print(pyree_build.__file__); print(numpy.__file__)"
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            server_protocol.BOOT.replace("from pyree_build.cli import main", "main = lambda a: print(*a)"),
            os.path.dirname(pyree_build.__file__),
            "cli",
            "x",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0 and probe.stdout.strip() == "x", probe
    loader = server_protocol.BOOT.split("what, sys.argv")[0]
    shown = subprocess.run([sys.executable, "-c", loader + code, os.path.dirname(pyree_build.__file__)], cwd=root, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and _marks(root) == [], shown
    assert str(root) not in shown.stdout


def test_server_stop_answers_a_client_of_another_identity(runtime):
    """`server stop` stops this user's server on this socket whatever pyree_build either runs."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYREE_BUILD_SERVER": "on"}
    assert subprocess.run([sys.executable, "-m", "pyree_build", "--version"], env=env, capture_output=True, timeout=120).returncode == 0
    path = server_protocol.socket_path(env, create=False)
    replies = []
    for kind in ("status", "stop"):
        frame = server_protocol.encode(kind, [], {}, "/").replace(server_protocol.identity().encode(), b"/other/python|/other/env|/other/pyree_build")
        frame = len(frame[4:]).to_bytes(4, "little") + frame[4:]
        with server_protocol.connect(path, timeout=30) as sock:
            server_protocol.send_request(sock, frame, [])
            replies.append(json.loads(server_protocol.read_line(sock)))
    assert replies[0]["pid"] == replies[1]["pid"]
    assert replies[0]["identity"] == server_protocol.identity()
    deadline = time.monotonic() + 30
    while server_protocol.alive(int(replies[1]["pid"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server_protocol.alive(int(replies[1]["pid"]))
    assert server_protocol.control("status", env) is None
