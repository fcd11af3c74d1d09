"""Issue 44, items 5, 6 and 15: every process a command starts ends with it, in every mode.

A plugin's constructor runs in every process that loads it (the build's load check, the run's
import check, iree-run-module): one that forks, setsid()s, sleeps and only then forks again
must leave nothing running, and no zombie, whether the command is served, runs in process, or
is the native client's run from a plan. And `pb.run` in process bounds a plugin's resolve that
never returns, as it bounds a kernel that never returns, without leak noise at exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, run_cli
from support.plans import plan_files
from support.watched import RUN_ARGS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers and /proc are Linux's")

# Forks from the constructor; the fork leaves its session, sleeps, then forks `sleep` and
# appends that pid to $PYREE_TEST_FORK_PIDS (after the command has long returned, if nothing ends it).
_CONSTRUCTOR = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
__attribute__((constructor)) static void pyree_test_detach(void) {
  const char* pids = getenv("PYREE_TEST_FORK_PIDS");
  if (!pids || fork() != 0) return;
  setsid();
  struct timespec t = {0, 200000000};
  nanosleep(&t, 0);
  pid_t pid = fork();
  if (pid == 0) { execlp("sleep", "sleep", "600", (char*)0); _exit(1); }
  FILE* f = fopen(pids, "a");
  if (f) { fprintf(f, "%d\n", (int)pid); fclose(f); }
  _exit(0);
}
"""


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return None


def _left(pids_file: Path) -> list[str]:
    """The forked processes still there (running or a zombie nobody reaps), 2 s after the command."""
    time.sleep(2)
    pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    left = [f"{pid} ({state})" for pid in pids if (state := _state(pid)) is not None]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


def _command(argv: list[object], env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    """Exit code and stderr; the output goes to files, not pipes, which a fork that survives
    would hold open (as long as it lives)."""
    with open(tmp_path / "out", "w+b") as out, open(tmp_path / "err", "w+b") as err:
        code = subprocess.run([os.fspath(a) for a in argv], env=env, stdout=out, stderr=err, timeout=300).returncode
        return code, (tmp_path / "err").read_text(errors="replace")


@pytest.fixture(scope="module")
def forking_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("forking") / "forking.c"
    src.write_text(_CONSTRUCTOR + (PLUGIN_SAMPLE / "system_plugin.c").read_text())
    return src


def _env(runtime: Path, mode: str, pids: Path) -> dict[str, str]:
    return dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER=mode, PYREE_BUILD_CACHE="off", PYREE_TEST_FORK_PIDS=str(pids))


@pytest.fixture
def runtime():
    path = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    yield path
    subprocess.run([sys.executable, "-m", "pyree_build", "server", "stop"], env=dict(os.environ, XDG_RUNTIME_DIR=str(path)), capture_output=True, timeout=60)
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_constructor_that_forks_late_leaves_nothing_after_the_build_or_the_run(tmp_path, runtime, forking_source, system_module, mode):
    pids = tmp_path / "pids"
    env = _env(runtime, mode, pids)
    so = tmp_path / "forking.so"
    code, err = _command([sys.executable, "-m", "pyree_build", "plugin", forking_source, "-o", so], env, tmp_path)
    assert code == 0, err
    assert _left(pids) == [], "the build's load check left its plugin's fork running"
    code, err = _command([sys.executable, "-m", "pyree_build", "run", system_module, *RUN_ARGS, "--plugin", so], env, tmp_path)
    assert code == 0, err
    assert _left(pids) == [], "the run left its plugin's fork running"


def test_a_constructor_that_forks_late_leaves_nothing_after_the_native_clients_plan_run(tmp_path, runtime, forking_source, system_module):
    client = run_cli("--native-client", tmp_path / "client")
    assert client.returncode == 0, client
    pids = tmp_path / "pids"
    so = tmp_path / "forking.so"
    env = {**_env(runtime, "on", pids), "PYREE_BUILD_CACHE": os.environ["PYREE_BUILD_CACHE"]}  # plans are kept beside the cache's facts
    assert _command([sys.executable, "-m", "pyree_build", "plugin", forking_source, "-o", so], env, tmp_path)[0] == 0
    time.sleep(2.1)  # a plan is written only for files unchanged for two seconds
    argv = [client.stdout.strip(), "run", system_module, *RUN_ARGS, "--plugin", so, "--expect", "8xf32=12 12 12 12 12 12 12 12"]
    for _ in range(3):  # the first run writes the plan, the next ones run from it
        code, err = _command(argv, env, tmp_path)
        assert code == 0, err
    assert plan_files(runtime), "no plan was written: the client ran nothing itself"
    assert _left(pids) == []


IN_PROCESS = """
import sys, time, numpy as np, pyree_build as pb
module, plugin, good, mode = sys.argv[1:]
args = (module, "mixed_invocation", [np.full(8, 2, np.float32), np.full(8, 4, np.float32)])
if mode == "timeout":
    start = time.monotonic()
    try:
        pb.run(*args, plugins=[plugin], timeout=3)
    except pb.PyreeError as err:
        print("ERROR", str(err), flush=True)
    print("TOOK", round(time.monotonic() - start), flush=True)
    print("AGAIN", pb.run(*args, plugins=[good])[0].tolist(), flush=True)
else:
    print("calling", flush=True)
    pb.run(*args, plugins=[plugin])
"""


def _plugin(tmp_path: Path, anchor: str, name: str) -> Path:
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    assert anchor in text
    src = tmp_path / f"{name}.c"
    src.write_text(text.replace(anchor, anchor + "  for (;;) {}\n"))
    built = run_cli("plugin", src, "-o", tmp_path / f"{name}.so")
    assert built.returncode == 0, built
    return tmp_path / f"{name}.so"


def _spinning_resolve(tmp_path: Path) -> Path:
    return _plugin(tmp_path, "  ++state->resolve_calls;\n", "spin_resolve")


def test_pb_run_timeout_bounds_a_resolve_that_never_returns(tmp_path, system_module, system_plugin):
    script = tmp_path / "run.py"
    script.write_text(IN_PROCESS)
    spinning = _spinning_resolve(tmp_path)
    try:
        result = subprocess.run([sys.executable, script, system_module, spinning, system_plugin, "timeout"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("pb.run(timeout=3) with a spinning resolve was still running after 60 s") from exc
    out = result.stdout + result.stderr
    assert "ERROR error:" in result.stdout and "spin_resolve.so: asking its resolve did not return within 3 s" in result.stdout, out
    took = int(result.stdout.split("TOOK ")[1].split()[0])
    assert took <= 10, out
    assert "AGAIN [12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0]" in result.stdout, out  # the good plugin still runs in process


def test_sigint_ends_pb_run_in_a_resolve_that_never_returns(tmp_path, system_module, system_plugin):
    script = tmp_path / "run.py"
    script.write_text(IN_PROCESS)
    spinning = _spinning_resolve(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, script, system_module, spinning, system_plugin, "sigint"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "calling"
        time.sleep(2)  # inside the resolve
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError("SIGINT did not end pb.run in a spinning resolve within 30 s") from exc
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]


def test_a_timed_out_in_process_run_leaves_no_leak_noise_at_exit(tmp_path, system_module, system_plugin):
    script = tmp_path / "run.py"
    script.write_text(IN_PROCESS)
    looping = _plugin(tmp_path, "  const mul_args_t* a = (const mul_args_t*)params_ptr;\n", "loop")
    result = subprocess.run([sys.executable, script, system_module, looping, system_plugin, "timeout"], capture_output=True, text=True, timeout=120)
    assert "ERROR error:" in result.stdout and "did not return within 3 s" in result.stdout, result.stdout + result.stderr
    assert "leaked" not in result.stderr and "nanobind" not in result.stderr, result.stderr[:2000]


SERVER_REAPS = """
import os, subprocess, sys, time
from pyree_build.core import processes
from pyree_build.core.processes import reaping
from pyree_build.server.pool import Pool
from pyree_build.server.state import State
assert processes.become_subreaper()
worker = subprocess.Popen(["sleep", "30"])  # stands for a worker: the pool's own child, left alone
# What a worker left, reparented here: one still running (it forked again after a pause), one that ended by itself.
subprocess.run(["sh", "-c", "setsid sh -c 'sleep 0.3; sleep 30' & setsid sleep 0.1 & exit 0"], check=True,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a survivor holds no pipe of the test's
time.sleep(0.8)
state = State(path="", idle_s=1.0, watch=None, reaps=True)
pool = Pool(None, state, -1, -1)
pool.children[worker.pid] = 0
pool.reap()
left = sorted(p for p in reaping._children() or [] if p != worker.pid)
print("left:", left, "worker running:", worker.poll() is None)
worker.kill()
"""


def test_the_server_ends_and_reaps_every_child_that_is_no_worker_of_its_own():
    """A subreaper, the server adopts what a worker leaves: whether the worker failed or not,
    its pool ends each such child that still runs and reaps each that ended (no zombie)."""
    done = subprocess.run([sys.executable, "-c", SERVER_REAPS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "left: [] worker running: True" in done.stdout, done.stdout
