"""Stopping pyree_build stops everything it started (issue 13, items 4-8).

Each test starts a verb, waits until the tool it runs is really there (found in /proc among
pyree_build's descendants, so the signal never races the tool's start), sends SIGTERM or
SIGINT to pyree_build alone, as `kill PID` or Ctrl-C would, and then checks: the exit code
is 128 + the signal, no process of any session or group the tools ran in survives, nothing
is left in the output directory, and the next build succeeds. Also: untrusted plugin code
(the probe at build time, imports at run time) that crashes, loops or exits is reported
with the signal and the likely causes, bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE, REPO, assert_clean_error, run_cli
from support.watched import RUN_ARGS, Watched, leftovers, plugin_variant, slow_c_source

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the process table from /proc")

ARCH_ARGS = ["--arch", "x86_64", "--arch", "aarch64", "--arch", "riscv64"]
ENV_NO_CACHE = dict(os.environ, PYREE_BUILD_CACHE="off", PYTHONPATH=str(PACKAGE_ROOT))


def _assert_all_gone(watched: Watched) -> None:
    # end_group gives each tool STOP_GRACE_S to clean up, then SIGKILLs its session; pyree_build exits
    # only after that, so nothing may be left now.
    assert watched.survivors() == []


def _argv(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "pyree_build", *map(os.fspath, args)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_compile_ends_iree_compile_and_leaves_nothing(tmp_path, sig):
    out = tmp_path / "out"
    argv = _argv("compile", PLUGIN_SAMPLE / "example.mlir", "-o", out / "e.vmfb")
    watched = Watched(argv, ENV_NO_CACHE)
    watched.wait_for("iree-compile")
    code, err = watched.stop(sig)
    assert code == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err
    _assert_all_gone(watched)
    time.sleep(0.5)  # a surviving iree-compile would write its .tmp now
    assert not out.exists()  # no output, no temporaries, not even the directory the stopped build made
    again = subprocess.run(argv, env=ENV_NO_CACHE, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert [p.name for p in out.iterdir()] == ["e.vmfb"]


def test_stopping_a_standalone_plugin_build_ends_every_per_arch_compiler(tmp_path):
    """Three arches compile in worker threads: a stop must end the tools of all of them."""
    src = slow_c_source(tmp_path / "slow.c")
    out = tmp_path / "out"
    argv = _argv("plugin", "--kind", "standalone", *ARCH_ARGS, src, "-o", out / "p.sos")
    watched = Watched(argv, ENV_NO_CACHE)
    watched.wait_for("zig")
    time.sleep(0.2)  # let every worker thread start its compiler
    watched.wait_for("zig")
    code, err = watched.stop(signal.SIGTERM)
    assert code == 143, err
    _assert_all_gone(watched)
    time.sleep(0.5)
    assert leftovers(tmp_path) == [] and not (out / "p.sos").exists()
    again = subprocess.run(argv, env=ENV_NO_CACHE, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (out / "p.sos").is_file() and leftovers(tmp_path) == []


def test_stopping_run_ends_iree_run_module(tmp_path, system_module):
    looping = plugin_variant(tmp_path, "loop", "  for (;;) {}")
    watched = Watched(_argv("run", system_module, *RUN_ARGS, "--plugin", looping), dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT)))
    watched.wait_for("iree-run-module")
    code, err = watched.stop(signal.SIGTERM)
    assert code == 143, err
    _assert_all_gone(watched)


def test_a_looping_import_times_out_naming_the_plugin_and_the_causes(tmp_path, system_module):
    looping = plugin_variant(tmp_path, "loop", "  for (;;) {}")
    start = time.monotonic()
    result = run_cli("run", system_module, *RUN_ARGS, "--plugin", looping, "--timeout", "2")
    assert time.monotonic() - start < 60
    assert_clean_error(result, "timed out after 2 s", "loop.so", "llvm.bareptr = true", "argument struct", "--timeout")
    result = run_cli("bench", system_module, *RUN_ARGS, "--plugin", looping, "--timeout", "2")
    assert_clean_error(result, "benchmarking", "timed out after 2 s", "loop.so")
    assert_clean_error(run_cli("run", system_module, *RUN_ARGS, "--timeout", "0"), "--timeout must be a positive number")


def test_a_crashing_import_names_the_signal_the_plugin_and_the_causes(tmp_path, system_module):
    crashing = plugin_variant(tmp_path, "segv", "  *(volatile int*)0 = 1;")
    result = run_cli("run", system_module, *RUN_ARGS, "--plugin", crashing)
    assert_clean_error(result, "killed by SIGSEGV", "with plugin(s)", "segv.so", "llvm.bareptr = true", "another ABI")
    assert result.returncode == 1


def test_a_plugin_that_exits_during_run_does_not_pass(tmp_path, system_module):
    exiting = plugin_variant(tmp_path, "exits", "  exit(0);")
    result = run_cli("run", system_module, *RUN_ARGS, "--plugin", exiting)
    assert_clean_error(result, "exited 0 but produced 0 of the 1 results of mixed_invocation", "exits.so", "exit()")


PROBE_PLUGIN = r"""
#include "iree/hal/local/executable_plugin.h"
IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t** iree_hal_executable_plugin_query(
    iree_hal_executable_plugin_version_t max_version, void* reserved) {
  (void)reserved;
  MISBEHAVE;
  return 0;
}
"""


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("*(volatile int*)0 = (int)max_version", "crashed: killed by SIGSEGV"),
        ("for (;;) {}", "did not return within 2 s"),
        ("__builtin_trap()", "crashed: killed by SIGILL"),
    ],
)
def test_a_plugin_query_that_crashes_or_hangs_is_a_clear_error(tmp_path, behaviour, message):
    """The build loads the plugin and calls its query in a child process, bounded in time."""
    src = tmp_path / "q.c"
    src.write_text(PROBE_PLUGIN.replace("MISBEHAVE", behaviour))
    out = tmp_path / "out" / "q.so"
    proc = subprocess.run(_argv("plugin", src, "-o", out), env=dict(ENV_NO_CACHE, PYREE_BUILD_PROBE_TIMEOUT="2"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{out}: the plugin's iree_hal_executable_plugin_query() {message}" in proc.stderr, proc.stderr
    assert not out.parent.exists()  # no output, no temporaries, not even the directory it made


def test_a_probe_timeout_setting_that_is_not_a_number_is_an_error(tmp_path):
    src = tmp_path / "q.c"
    src.write_text(PROBE_PLUGIN.replace("MISBEHAVE", "(void)max_version"))
    proc = subprocess.run(_argv("plugin", src, "-o", tmp_path / "q.so"), env=dict(ENV_NO_CACHE, PYREE_BUILD_PROBE_TIMEOUT="soon"),
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and "PYREE_BUILD_PROBE_TIMEOUT is not a number" in proc.stderr, proc.stderr


def test_the_python_api_ends_its_tools_on_a_stop(tmp_path):
    """`with pb.stop_on_signals():` gives a Python caller what the CLI does: a SIGTERM ends the
    tool and raises a KeyboardInterrupt carrying the exit code 143."""
    out = tmp_path / "e.vmfb"
    script = (
        "import sys, pyree_build as pb\n"
        "try:\n"
        "    with pb.stop_on_signals():\n"
        f"        pb.compile({str(PLUGIN_SAMPLE / 'example.mlir')!r}, {str(out)!r})\n"
        "except KeyboardInterrupt as stop:\n"
        "    print('stopped', stop.exit_code)\n"
        "    sys.exit(stop.exit_code)\n"
    )
    watched = Watched([sys.executable, "-c", script], ENV_NO_CACHE)
    watched.wait_for("iree-compile")
    code, _ = watched.stop(signal.SIGTERM)
    assert code == 143 and "stopped 143" in watched.out
    _assert_all_gone(watched)
    assert list(tmp_path.iterdir()) == []


def test_a_pool_left_by_a_stop_starts_none_of_its_queued_steps():
    # A stopped ptx job with more sm than workers kept compiling the queued ones after SIGTERM,
    # past its parent's grace, and was killed before it removed its scratch directory.
    import threading

    from pyree_build.core import processes

    started: list[int] = []
    release = threading.Event()

    def step(k: int) -> int:
        started.append(k)
        release.wait(10)
        return k

    with pytest.raises(KeyboardInterrupt), processes.thread_pool(1) as pool:
        queued = [pool.submit(step, k) for k in range(5)]
        while not started:
            time.sleep(0.01)
        threading.Timer(0.3, release.set).start()  # step 0 still runs when the block is left
        raise KeyboardInterrupt
    assert started == [0]
    assert [f.cancelled() for f in queued] == [False, True, True, True, True]
    with processes.thread_pool(1) as pool:  # left normally: every step runs
        assert list(pool.map(lambda k: k * 2, range(4))) == [0, 2, 4, 6]


_OUR_TEMP_NAME = re.compile(r"(^|/)\.[^/]+\.\d+-[0-9a-f]{8}")


def _stop_at_each_step(tmp_path: Path, command: str, cache: str, stride: int) -> tuple[dict, list[dict]]:
    """Run stop_anywhere.py: the reference run's row and one row per stopped run."""
    source = REPO / "samples" / "custom_dispatch" / "cuda" / "kernels" / "kernels.cu"
    script = Path(__file__).resolve().parent.parent / "support" / "stop_anywhere.py"
    argv = [sys.executable, script, command, source, tmp_path, cache, str(stride)]
    done = subprocess.run(argv, env=ENV_NO_CACHE, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    reference, *stopped, last = [json.loads(line) for line in done.stdout.splitlines()]
    assert last["event"] is None and last["outcome"] == "finished" and sorted(last["files"]) == sorted(reference["files"])
    assert len(stopped) >= 20 // stride, "the command has fewer file steps than it had: is the hook still reached?"
    for row in stopped:
        where = f"stopped at step {row['at']} ({row['event']})"
        assert row["outcome"] == "stopped 143", where
        temporaries = [n for n in [*row["files"], *row["dirs"], *row["cache"]] if _OUR_TEMP_NAME.search(n)]
        assert temporaries == [], f"{where}: left {temporaries}"
    return reference, stopped


@pytest.mark.parametrize(("cache", "stride"), [("off", 1), ("hit", 1), ("miss", 4)])
def test_a_stop_at_any_file_step_leaves_all_outputs_or_none_and_no_temporaries(tmp_path, cache, stride):
    """A stop raised halfway through removing a scratch directory left it behind, and one raised
    between two renames left one sm's PTX in place and not the other's (the samples SIGINT test's
    leftover in CI). Here SIGTERM comes at each file-system step of a real build in turn (every
    `stride`th: a miss walks ~460 steps), from an audit hook in a process of its own. The
    depfile was written after the outputs' renames, so a stop between them left outputs alone."""
    reference, stopped = _stop_at_each_step(tmp_path, "ptx", cache, stride)
    want = {name: text for name, text in reference["files"].items() if name.endswith(".ptx")}
    assert sorted(want) == ["kernels_sm_75.ptx", "kernels_sm_80.ptx"] and "ptx.d" in reference["files"]
    for row in stopped:
        where, left = f"stopped at step {row['at']} ({row['event']})", row["files"]
        assert set(left) <= {*want, "ptx.d"}, f"{where}: left {sorted(left)}"
        ptx = {name: text for name, text in left.items() if name.endswith(".ptx")}
        assert ptx in ({}, want), f"{where}: a partial set of outputs {sorted(ptx)}"
        # The depfile is one of the set: outputs without it (a stop between the renames and its
        # write) are what Make would trust however their inputs change.
        assert ("ptx.d" in left) == bool(ptx), f"{where}: outputs and depfile apart: left {sorted(left)}"
        if "ptx.d" in left:
            assert left["ptx.d"].replace(f"/at{row['at']}/", "/reference/") == reference["files"]["ptx.d"], f"{where}: another depfile"


def test_a_stop_at_any_file_step_of_new_writes_the_whole_project_or_nothing(tmp_path):
    """`new` stages its files and moves them into the directory with their manifest: a stop
    between two moves left half a project."""
    reference, stopped = _stop_at_each_step(tmp_path, "new", "off", 1)
    assert {"CMakeLists.txt", "plugin.c", "program.mlir", ".pyree_build-written.json"} <= set(reference["files"])
    for row in stopped:
        assert row["files"] in ({}, reference["files"]), f"stopped at step {row['at']} ({row['event']}): left {sorted(row['files'])}"


def test_a_stop_in_a_shielded_block_is_raised_when_the_block_ends():
    from pyree_build.core import processes

    steps: list[str] = []
    with pytest.raises(processes.Stopped) as stop, processes.stop_on_signals():
        with processes.shielded():
            with processes.shielded():
                signal.raise_signal(signal.SIGTERM)
                steps.append("inner")
            steps.append("outer")
        steps.append("after")
    assert steps == ["inner", "outer"] and stop.value.exit_code == 143
    with pytest.raises(processes.Stopped), processes.stop_on_signals():  # unshielded: at once
        signal.raise_signal(signal.SIGINT)
        steps.append("unshielded")
    assert steps == ["inner", "outer"]
