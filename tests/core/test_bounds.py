"""Issue 35: one bound for a whole command. `run --timeout N` bounds everything the run does,
the import check that asks each plugin's resolve in a child included; real tools throughout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import PLUGIN_SAMPLE, assert_clean_error, run_cli

RUN_ARGS = ["--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4"]


def _spinning_resolve(tmp_path):
    anchor = "  ++state->resolve_calls;\n"
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    assert anchor in text
    src = tmp_path / "spin.c"
    src.write_text(text.replace(anchor, anchor + "  for (;;) {}\n"))
    so = tmp_path / "spin.so"
    built = run_cli("plugin", src, "-o", so)
    assert built.returncode == 0, built
    return so


def test_run_timeout_bounds_the_import_check_too(tmp_path, system_module):
    spinning = _spinning_resolve(tmp_path)
    try:  # the import check's own bound was 120 s: a run given 3 s must not take it
        result = run_cli("run", system_module, *RUN_ARGS, "--plugin", spinning, "--timeout", "3", timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("run --timeout 3 was still running after 60 s") from exc
    assert_clean_error(result, "asking its resolve did not return within 3 s, the command's time limit (--timeout)", "spin.so")


def _state(pid: int) -> str | None:
    """A process's state letter (Z: a zombie), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return None


@pytest.mark.parametrize("fds", ["keeps-the-pipes", "closes-every-fd"])
def test_a_grandchild_a_plugin_detaches_with_setsid_does_not_survive_the_run(tmp_path, system_module, fds):
    anchor = "  const mul_args_t* a = (const mul_args_t*)params_ptr;\n"
    pidfile = tmp_path / "grandchild.pid"
    closes = "for (int fd = 0; fd < 1024; ++fd) close(fd);" if fds == "closes-every-fd" else ""
    detach = (
        "  { static int forked; if (!forked) { forked = 1; if (fork() == 0) { setsid();"
        f' FILE* f = fopen("{pidfile}", "w"); fprintf(f, "%d", (int)getpid()); fclose(f); {closes} sleep(600); _exit(0); }} }} }}\n'
    )
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    src = tmp_path / "detach.c"
    src.write_text("#include <stdio.h>\n#include <unistd.h>\n" + text.replace(anchor, anchor + detach))
    so = tmp_path / "detach.so"
    assert run_cli("plugin", src, "-o", so).returncode == 0
    try:
        result = run_cli("run", system_module, *RUN_ARGS, "--plugin", so, "--timeout", "20", timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the run waited on its detached grandchild") from exc
    grandchild = int(pidfile.read_text())
    try:
        assert result.returncode == 0 and "8xf32=12 12 12 12 12 12 12 12" in result.stdout, result.output
        assert _state(grandchild) in (None, "Z"), f"the grandchild {grandchild} survived the run"
    finally:
        with contextlib.suppress(OSError):
            os.kill(grandchild, signal.SIGKILL)


SPINNING_RUN = """
import sys, numpy as np, pyree_build as pb
module, plugin, good, mode = sys.argv[1:]
args = (module, "mixed_invocation", [np.full(8, 2, np.float32), np.full(8, 4, np.float32)])
if mode == "timeout":
    try:
        pb.run(*args, plugins=[plugin], timeout=2)
    except pb.PyreeError as err:
        print("ERROR", str(err).splitlines()[0], flush=True)
    print("AGAIN", pb.run(*args, plugins=[good])[0].tolist(), flush=True)  # the driver is busy: iree-run-module
else:
    print("calling", flush=True)
    if mode == "stop_on_signals":
        with pb.stop_on_signals():
            pb.run(*args, plugins=[plugin])
    else:
        pb.run(*args, plugins=[plugin])
"""


def _looping_plugin(tmp_path):
    anchor = "  const mul_args_t* a = (const mul_args_t*)params_ptr;\n"
    src = tmp_path / "loop.c"
    src.write_text((PLUGIN_SAMPLE / "system_plugin.c").read_text().replace(anchor, anchor + "  for (;;) {}\n"))
    assert run_cli("plugin", src, "-o", tmp_path / "loop.so").returncode == 0
    return tmp_path / "loop.so"


def test_an_in_process_run_that_never_returns_times_out_and_the_next_run_still_works(tmp_path, system_module, system_plugin):
    script = tmp_path / "spin.py"
    script.write_text(SPINNING_RUN)
    looping = _looping_plugin(tmp_path)
    try:
        result = subprocess.run([sys.executable, script, system_module, looping, system_plugin, "timeout"], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("pb.run(timeout=2) did not return") from exc
    assert "ERROR error:" in result.stdout and "did not return within 2 s" in result.stdout, result.stdout + result.stderr
    assert "AGAIN [12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0]" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("mode", ["default_handler", "stop_on_signals"])
def test_sigint_ends_an_in_process_run_that_never_returns(tmp_path, system_module, system_plugin, mode):
    script = tmp_path / "spin.py"
    script.write_text(SPINNING_RUN)
    looping = _looping_plugin(tmp_path)
    proc = subprocess.Popen([sys.executable, script, system_module, looping, system_plugin, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "calling"
        time.sleep(1.5)  # inside the call
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0 and ("KeyboardInterrupt" in err or "Stopped: SIGINT" in err), err[-2000:]


def test_a_grandchild_forked_by_a_plugins_query_does_not_hold_the_build_or_survive_it(tmp_path):
    """The build asks the plugin's query in a forked child; a grandchild it leaves (setsid, still
    holding the child's result pipe) is ended once the child has answered, not waited for."""
    anchor = "  static const iree_hal_executable_plugin_header_t header = {\n"
    pidfile = tmp_path / "grandchild.pid"
    detach = f'  if (fork() == 0) {{ setsid(); FILE* f = fopen("{pidfile}", "w"); fprintf(f, "%d", (int)getpid()); fclose(f); sleep(600); _exit(0); }}\n'
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    assert anchor in text
    src = tmp_path / "q.c"
    src.write_text("#include <stdio.h>\n#include <unistd.h>\n" + text.replace(anchor, detach + anchor))
    env = dict(os.environ, PYREE_BUILD_CACHE="off", PYREE_BUILD_PROBE_TIMEOUT="20")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pyree_build", "plugin", src, "-o", tmp_path / "q.so"], env=env, capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the build waited on the query's grandchild") from exc
    finally:
        pids = [int(p) for p in [pidfile.read_text()] if p] if pidfile.exists() else []
    try:
        assert result.returncode == 0, result.stderr
        assert pids and all(_state(p) in (None, "Z") for p in pids), "the grandchild survived the build"
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
