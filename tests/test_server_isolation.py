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
import re
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


SCRIPT = Path(sys.executable).with_name("pyree-build-py")
_TIMES = re.compile(r"\d+(\.\d+)? ?(s|ms|us)\b")


def _native(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.skipif(not _native(TYPED), reason=f"{TYPED} is not the native client (pyree_build was installed where no C compiler or no Linux was at hand)")
def test_the_typed_pyree_build_is_the_native_client_and_answers_as_the_python_client(tmp_path, runtime, system_module, system_plugin):
    from test_stop import RUN_ARGS

    runs = [
        ["--version"],
        ["nosuchverb"],
        ["run", str(system_module), *RUN_ARGS, "--plugin", str(system_plugin), "--expect", "8xf32=12 12 12 12 12 12 12 12"],
        ["run", str(system_module), *RUN_ARGS, "--plugin", str(system_plugin), "--expect", "8xf32=1 1 1 1 1 1 1 1"],
    ]
    for mode in ("on", "off"):
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYREE_BUILD_SERVER": mode}
        for args in runs:
            typed = subprocess.run([str(TYPED), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            python = subprocess.run([str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            seen = [(r.returncode, _TIMES.sub("<time>", r.stdout), _TIMES.sub("<time>", r.stderr)) for r in (typed, python)]
            assert seen[0] == seen[1], (mode, args)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    before = server_protocol.control("status", env)
    assert before is not None, "the typed client started no server"
    assert subprocess.run([str(TYPED), "--version"], env=env, capture_output=True, timeout=60).returncode == 0
    after = server_protocol.control("status", env)
    assert after is not None and after["pid"] == before["pid"] and after["requests"] == int(str(before["requests"])) + 2, (
        "the typed client used another server"
    )  # + its command and this status


@pytest.mark.skipif(not _native(TYPED), reason=f"{TYPED} is not the native client")
@pytest.mark.parametrize("form", ["plain", "sh", "none"])
def test_the_typed_client_takes_its_python_from_the_console_script_beside_it(tmp_path, runtime, form):
    """pip writes the interpreter as `#!PYTHON`, or for a path with spaces as `#!/bin/sh` and an
    `'''exec' "PYTHON"` line; a script the client cannot read it from is run as it is."""
    bin_dir = tmp_path / "my bin"
    bin_dir.mkdir()
    shutil.copy2(TYPED, bin_dir / "pyree-build")
    body = "import sys\nfrom pyree_build.server.client import main\nsys.exit(main())\n"
    head = {
        "plain": f"#!{sys.executable}\n",
        "sh": f"#!/bin/sh\n'''exec' \"{sys.executable}\" \"$0\" \"$@\"\n' '''\n",
        "none": f"#!/usr/bin/env -S {sys.executable}\n",
    }[form]
    script = bin_dir / "pyree-build-py"
    script.write_text(head + body)
    script.chmod(0o755)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYREE_BUILD_SERVER": "on"}
    result = subprocess.run([str(bin_dir / "pyree-build"), "--version"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("pyree_build "), result
    configs = list((runtime / "pyree_build").glob("c-*.conf"))
    assert len(configs) == (0 if form == "none" else 1), configs
    if configs:
        identity, package, boot, _ = configs[0].read_bytes().split(b"\0")
        assert identity.decode() == server_protocol.identity() and package.decode() == os.path.dirname(pyree_build.__file__)
        assert boot.decode() == server_protocol.BOOT
