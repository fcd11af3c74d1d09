"""Issue 44, item 8: output the system refuses (a full disk, /dev/full, `ulimit -f`) is an error
in every mode: served, in process, and the native client's run from a plan. One clear error on
stderr, exit 1, no traceback; never exit 0 with the output lost."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import run_cli
from support.plans import plan_files
from support.watched import RUN_ARGS

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists() or not sys.platform.startswith("linux"), reason="writes to /dev/full")

EXPECT = ["--expect", "8xf32=12 12 12 12 12 12 12 12"]


@pytest.fixture
def runtime():
    """A server directory of the test's own: a file size limit is part of a client's context, so gets a server of its own."""
    path = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    yield path
    subprocess.run([sys.executable, "-m", "pyree_build", "server", "stop"], env=dict(os.environ, XDG_RUNTIME_DIR=str(path)), capture_output=True, timeout=60)
    shutil.rmtree(path, ignore_errors=True)


def _command(argv: list[object], env: dict[str, str], stdout: Path, fsize: int | None = None) -> tuple[int, str]:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    with open(stdout, "ab") as out:
        proc = subprocess.run([os.fspath(a) for a in argv], env=env, stdout=out, stderr=subprocess.PIPE, text=True, timeout=300, preexec_fn=limit)
    return proc.returncode, proc.stderr


def _assert_one_clear_error(code: int, err: str, *fragments: str) -> None:
    assert code == 1, err
    assert "Traceback" not in err and err.count("error:") == 1, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize("mode", ["on", "off"])
@pytest.mark.parametrize("verb", ["run", "cache info", "help"])
def test_output_to_a_full_device_is_an_error_in_every_verb(runtime, system_module, system_plugin, mode, verb):
    args = {"run": ["run", system_module, *RUN_ARGS, "--plugin", system_plugin], "cache info": ["cache", "info"], "help": ["--help"]}[verb]
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER=mode)
    code, err = _command([sys.executable, "-m", "pyree_build", *args], env, Path("/dev/full"))
    _assert_one_clear_error(code, err, "cannot write to standard output (/dev/full): No space left on device", "fix:")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_output_past_the_file_size_limit_is_an_error(runtime, system_module, system_plugin, tmp_path, mode):
    out = tmp_path / "out.txt"
    out.write_bytes(b"x" * 3000)  # over the limit already: the next write to it fails with EFBIG
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER=mode)
    code, err = _command([sys.executable, "-m", "pyree_build", "run", system_module, *RUN_ARGS, "--plugin", system_plugin], env, out, fsize=2048)
    _assert_one_clear_error(code, err, f"cannot write to standard output ({out}): File too large", "ulimit -f")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_file_size_limit_of_zero_is_a_clear_error(runtime, system_module, system_plugin, tmp_path, mode):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER=mode)
    code, err = _command([sys.executable, "-m", "pyree_build", "run", system_module, *RUN_ARGS, "--plugin", system_plugin], env, tmp_path / "out", fsize=0)
    _assert_one_clear_error(code, err, "the file size limit (`ulimit -f`) is 0 bytes")


@pytest.mark.parametrize("where", ["full", "limit"])
def test_the_native_clients_plan_run_does_not_pass_with_its_output_lost(runtime, system_module, system_plugin, tmp_path, where):
    client = run_cli("--native-client", tmp_path / "client")
    assert client.returncode == 0, client
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER="on")
    argv = [client.stdout.strip(), "run", system_module, *RUN_ARGS, "--plugin", system_plugin, *EXPECT]
    time.sleep(2.1)  # a plan is written only for files unchanged for two seconds
    for _ in range(2):
        assert _command(argv, env, tmp_path / "ok")[0] == 0
    assert plan_files(runtime), "no plan was written: the client would not run the next one itself"
    if where == "full":
        code, err = _command(argv, env, Path("/dev/full"))
        _assert_one_clear_error(code, err, "cannot write to standard output (/dev/full): No space left on device")
    else:
        out = tmp_path / "out.txt"
        out.write_bytes(b"x" * 3000)
        code, err = _command(argv, env, out, fsize=2048)
        _assert_one_clear_error(code, err, f"cannot write to standard output ({out}): File too large", "ulimit -f")


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 1 << 20])
def test_an_atomic_write_past_the_file_size_limit_leaves_the_old_file_and_no_temporary(tmp_path, size):
    # files.write_atomic is every pyree_build-written file's one write (cache tags and records,
    # manifests, plans, stamps): a write that fails partway leaves the file as it was.
    target = tmp_path / "state.json"
    target.write_text("old", encoding="utf-8")
    child = (
        "import resource, signal, sys\n"
        "from pyree_build.core import files\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))\n"
        "try:\n"
        f"    files.write_atomic(sys.argv[1], b'x' * {size})\n"
        "except OSError as exc:\n"
        "    print('failed', exc.errno)\n"
        "else:\n"
        "    print('written')\n"
    )
    done = subprocess.run([sys.executable, "-c", child, str(target)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if size <= 100:
        assert done.stdout.strip() == "written" and target.read_bytes() == b"x" * size
    else:
        assert done.stdout.startswith("failed") and target.read_text(encoding="utf-8") == "old", done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
