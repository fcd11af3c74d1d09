"""Runs the native client makes itself (client/plans.py): a `run` command line that passed
is run again by the client from its plan, printing what pyree_build printed, while every file
it read is unchanged; whatever the tool does otherwise is reported by pyree_build exactly as
without the client, from that one run of the tool.
"""

from __future__ import annotations

import io
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import PLUGIN_SAMPLE, run_cli
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import watched as watched_module
from support.cmake_projects import build, configure, write_downstream
from support.plans import plan_files
from support.watched import RUN_ARGS, Watched

from pyree_build.client import plans
from pyree_build.core import toolchain

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the native client is built for Linux")

EXPECT = ["--expect", "8xf32=12 12 12 12 12 12 12 12"]
_TIMES = re.compile(r"\d+(\.\d+)? ?(s|ms|us)\b")
_RESULTS_DIR = re.compile(r"pyree-run\.\w+")

# The sample's import, first doing what the mode file says: p pass, w a wrong result, f fail,
# c crash, l loop, d leave a daemon that holds the tool's stdout, b fail saying 2.4 MB; each call appends to the count file.
_MODES = r"""
  {
    FILE* count = fopen("@DIR@/calls", "a");
    if (count) { fputc('x', count); fclose(count); }
    FILE* mode_file = fopen("@DIR@/mode", "r");
    int mode = mode_file ? fgetc(mode_file) : 'p';
    if (mode_file) fclose(mode_file);
    if (mode == 'w') { for (size_t i = 0; i < a->count; ++i) a->out[a->out_offset + i] = 5.0f; return 0; }
    if (mode == 'f') { fprintf(stderr, "the plugin refuses\n"); return 1; }
    if (mode == 'c') abort();
    if (mode == 'l') for (;;) {}
    if (mode == 'd' && fork() == 0) { setsid(); sleep(60); _exit(0); }
    if (mode == 'b') { for (int i = 0; i < 40000; ++i) fputs("a line of what a plugin says, over and over, to fill a pipe\n", stderr); return 1; }
  }
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = run_cli("--native-client", tmp_path_factory.mktemp("client"))
    assert built.returncode == 0, built
    return Path(built.stdout.strip())


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A server directory (so a plans directory) of the test's own, its server stopped at the end."""
    path = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    yield path
    subprocess.run([sys.executable, "-m", "pyree_build", "server", "stop"], env=dict(os.environ, XDG_RUNTIME_DIR=str(path)), capture_output=True, timeout=60)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def moody(tmp_path: Path) -> Path:
    """A system plugin whose import does what `tmp_path/mode` says, and counts its calls."""
    anchor = "  const mul_args_t* a = (const mul_args_t*)params_ptr;\n"
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    assert anchor in text
    src = tmp_path / "moody.c"
    src.write_text("#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n" + text.replace(anchor, anchor + _MODES.replace("@DIR@", str(tmp_path))))
    built = run_cli("plugin", src, "-o", tmp_path / "moody.so")
    assert built.returncode == 0, built
    return tmp_path / "moody.so"


def _env(runtime: Path, mode: str = "on", **extra: str) -> dict[str, str]:
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYREE_BUILD_SERVER": mode, **extra}


def _run(client: Path, args: list[str | os.PathLike[str]], env: dict[str, str], cwd: Path, **kw: object) -> tuple[int, str, str]:
    got = subprocess.run([client, *map(os.fspath, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    return got.returncode, _normal(got.stdout), _normal(got.stderr)


def _normal(text: str) -> str:
    """Without the seconds a run took and the name of its results directory."""
    return _TIMES.sub("<time>", _RESULTS_DIR.sub("<results>", text))


def _served(runtime: Path) -> int:
    """How many requests this test's server has answered (a status request counts after its answer)."""
    code = "import json, os; from pyree_build.client import protocol as p; print(json.dumps(p.control('status', dict(os.environ))))"
    asked = subprocess.run([sys.executable, "-c", code], env=_env(runtime), capture_output=True, text=True, timeout=60)
    report = __import__("json").loads(asked.stdout)
    return int(report["requests"]) if report else 0


def _settled() -> None:
    time.sleep(2.1)  # a plan is written only for files unchanged for two seconds


@pytest.mark.parametrize("extra", [EXPECT, ["-q", *EXPECT], [], ["--expect-close", "8xf32=12"]], ids=["expect", "quiet", "no-check", "close"])
def test_a_passing_run_is_run_by_the_client_and_prints_what_pyree_build_printed(client, runtime, system_module, moody, tmp_path, extra):
    _settled()
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, *extra]
    reference = _run(client, args, _env(runtime, "off"), tmp_path)
    assert reference[0] == 0, reference
    calls = _calls(tmp_path)
    assert _run(client, args, _env(runtime), tmp_path) == reference  # served: the plan is written
    assert len(plan_files(runtime)) == 1
    per_run = _calls(tmp_path) - calls
    before = _served(runtime)
    for _ in range(3):
        assert _run(client, args, _env(runtime), tmp_path) == reference
    assert _served(runtime) == before + 1, "the client asked the server although the plan was current"
    assert _calls(tmp_path) == calls + 4 * per_run, "the tool did not run once for each command"


def _calls(directory: Path) -> int:
    """How many times the plugin's import was called (client runs included)."""
    return (directory / "calls").stat().st_size if (directory / "calls").exists() else 0


@pytest.mark.parametrize("mode", ["w", "f", "c", "l"], ids=["wrong-result", "failing-import", "crash", "time-limit"])
def test_a_run_unlike_its_plan_is_reported_as_without_the_client_from_one_run(client, runtime, system_module, moody, tmp_path, mode):
    """The plan was written when the run passed; now the tool does something else (the files
    unchanged). pyree_build reports what the client's one run of the tool did, as it reports
    that run without the client: a failure is never run again until it passes."""
    _settled()
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, *EXPECT, "--timeout", "3"]
    # A temporary directory of this test's own: whatever else runs on the machine, what is left
    # in it was left by these runs.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    assert _run(client, args, _env(runtime, TMPDIR=str(tmp)), tmp_path)[0] == 0
    assert len(plan_files(runtime)) == 1
    (tmp_path / "mode").write_text(mode)
    calls = _calls(tmp_path)
    reference = _run(client, args, _env(runtime, "off", TMPDIR=str(tmp)), tmp_path)
    assert reference[0] != 0, reference
    once = _calls(tmp_path) - calls
    assert _run(client, args, _env(runtime, TMPDIR=str(tmp)), tmp_path) == reference
    assert _calls(tmp_path) == calls + 2 * once, "the tool did not run exactly once"
    assert list(tmp.iterdir()) == [], "a results directory was left behind"
    (tmp_path / "mode").write_text("p")
    assert _run(client, args, _env(runtime, TMPDIR=str(tmp)), tmp_path)[0] == 0


def test_a_changed_file_or_environment_runs_through_the_server(client, runtime, system_module, moody, tmp_path):
    _settled()
    module = tmp_path / "m.vmfb"
    shutil.copy(system_module, module)
    link = tmp_path / "plugin.so"
    link.symlink_to(moody)
    args = ["run", module, *RUN_ARGS, "--plugin", link, *EXPECT]
    time.sleep(2.1)
    assert _run(client, args, _env(runtime), tmp_path)[0] == 0
    other = tmp_path / "other.so"
    shutil.copy(moody, other)

    def edits() -> Iterator[dict[str, str]]:
        os.utime(module)  # the same bytes, touched
        yield _env(runtime)
        link.unlink()
        link.symlink_to(other)  # the same name leads to another file
        yield _env(runtime)
        yield _env(runtime, PYREE_TEST_SOMETHING="else")  # another environment

    for env in edits():
        before = _served(runtime)
        assert _run(client, args, env, tmp_path)[0] == 0
        assert _served(runtime) == before + 2, "a run whose plan no longer holds was not served"


@pytest.mark.parametrize(
    ("extra", "env"),
    [(["-v"], {}), (["--check-file", "check.txt"], {}), ([], {"PYREE_BUILD_CACHE": "off"}), ([], {"PYREE_BUILD_SERVER": "off"})],
    ids=["verbose", "check-file", "cache-off", "server-off"],
)
def test_no_plan_is_written_where_the_client_could_not_print_the_same(client, runtime, system_module, moody, tmp_path, extra, env):
    _settled()
    (tmp_path / "check.txt").write_text("CHECK: 8xf32=12\n")
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, *extra]
    got = _run(client, args, {**_env(runtime), **env}, tmp_path)
    assert got[0] == 0, got
    assert plan_files(runtime) == []


def test_a_stopped_client_ends_its_tool_and_says_so(client, runtime, system_module, moody, tmp_path, monkeypatch):
    _settled()
    args = [str(client), *(os.fspath(a) for a in ("run", system_module, *RUN_ARGS, "--plugin", moody, *EXPECT))]
    monkeypatch.setattr(watched_module.random, "random", lambda: 0.5)  # one environment (Watched's marker) for both runs
    assert Watched(args, _env(runtime)).proc.wait(timeout=300) == 0
    (tmp_path / "mode").write_text("l")
    before = _served(runtime)
    watched = Watched(args, _env(runtime))
    watched.wait_for("iree-run-module")
    code, err = watched.stop(signal.SIGTERM)
    assert (code, err) == (143, "stopped by SIGTERM: every tool pyree_build started was ended\n")
    assert watched.survivors() == []
    assert _served(runtime) == before + 1  # the client ran the tool itself


def test_what_the_tool_left_running_is_ended_when_it_exits(client, runtime, system_module, moody, tmp_path):
    _settled()
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, *EXPECT]
    reference = _run(client, args, _env(runtime), tmp_path)
    (tmp_path / "mode").write_text("d")
    start = time.monotonic()
    assert _run(client, args, _env(runtime), tmp_path) == reference
    assert time.monotonic() - start < 30, "the client waited for the daemon holding the tool's stdout"
    daemons = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(b"/") and b"moody.so" in _cmdline(p)]
    assert daemons == []


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_stray_handover_variable_is_ignored_and_deletes_nothing(runtime, system_module, moody, tmp_path):
    """PYREE_BUILD_RAN (what the client sets for the Python CLI it hands a run to) naming a
    directory the client did not make: the run is run as usual, the directory left alone."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "stdout").write_text("EXEC @mixed_invocation\n")
    (victim / "keep.txt").write_text("mine")
    env = _env(runtime, "off", PYREE_BUILD_RAN=f"v2 0 0 0.5 -1 -1 {victim} {tmp_path / 'plan'}")
    calls = _calls(tmp_path)
    got = subprocess.run(
        [sys.executable, "-m", "pyree_build", "run", system_module, *RUN_ARGS, "--plugin", moody, *EXPECT], env=env, capture_output=True, text=True, timeout=300
    )
    assert got.returncode == 0, got.stderr
    assert _calls(tmp_path) > calls, "the tool did not run"
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt", "stdout"]


def test_cache_clear_forgets_the_plans(client, runtime, system_module, moody, tmp_path):
    _settled()
    cache = tmp_path / "cache"
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, *EXPECT]
    assert _run(client, args, _env(runtime, PYREE_BUILD_CACHE=str(cache)), tmp_path)[0] == 0
    assert len(plan_files(runtime)) == 1
    cleared = subprocess.run([client, "cache", "clear"], env=_env(runtime, PYREE_BUILD_CACHE=str(cache)), capture_output=True, text=True, timeout=300)
    assert cleared.returncode == 0, cleared.stderr
    assert plan_files(runtime) == []


_STEPS = st.lists(st.sampled_from(["run", "run", "mode p", "mode w", "mode f", "touch", "environment"]), min_size=2, max_size=7)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None)
@given(steps=_STEPS)
@example(steps=["mode w", "run", "mode p", "run", "environment", "run"])
@example(steps=["run", "mode f", "run", "touch", "run", "mode p"])
def test_any_sequence_of_edits_and_runs_reports_what_pyree_build_reports_without_the_client(client, runtime, system_module, moody, tmp_path, steps):
    """Property: after any sequence of plugin behaviours, touched modules and environments,
    each run through the client (from a plan or served) gives the exit code and output the
    same run gives in its own process without the client, and runs the tool exactly as often."""
    module = tmp_path / "m.vmfb"
    if not module.exists():
        shutil.copy(system_module, module)
        _settled()
    (tmp_path / "mode").write_text("p")
    args = ["run", module, *RUN_ARGS, "--plugin", moody, *EXPECT]
    env = _env(runtime)
    for step in ["run", *steps, "run"]:
        if step.startswith("mode"):
            (tmp_path / "mode").write_text(step[-1])
        elif step == "touch":
            os.utime(module)
        elif step == "environment":
            env = {**env, "PYREE_TEST_STEP": str(time.monotonic_ns())}
        else:
            calls = _calls(tmp_path)
            reference = _run(client, args, {**env, "PYREE_BUILD_SERVER": "off"}, tmp_path)
            once = _calls(tmp_path) - calls
            assert _run(client, args, env, tmp_path) == reference, steps
            assert _calls(tmp_path) - calls == 2 * once, steps


def test_a_plan_of_other_pyree_build_code_runs_through_the_server(client, runtime, system_module, moody, tmp_path):
    """plans/code-* names the code that wrote the plans (its digest, then its files' stats): a
    pyree_build edited or upgraded in place names other code, and no older plan applies."""
    _settled()
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, *EXPECT]
    assert _run(client, args, _env(runtime), tmp_path)[0] == 0
    (code,) = (runtime / "pyree_build" / plans.PLANS_DIR).glob(f"{plans.CODE_FILE}-*")
    written = code.read_bytes()
    assert written[4:36].isalnum(), "plans/code begins with the code's digest"
    for other in (written[:4] + b"0" * 32 + written[36:], written[:-1] + bytes([written[-1] ^ 1])):  # other code; a file changed
        code.write_bytes(other)
        before = _served(runtime)
        assert _run(client, args, _env(runtime), tmp_path)[0] == 0
        assert _served(runtime) == before + 2, "a plan of other code was used"
        assert code.read_bytes() == written, "the served run did not name this code again"
        before = _served(runtime)
        assert _run(client, args, _env(runtime), tmp_path)[0] == 0
        assert _served(runtime) == before + 1, "the plan of this code was not used"


def _file_limit(blocks: int) -> Callable[[], None]:
    """`ulimit -f BLOCKS` for a child (blocks of 1024 bytes, as bash counts them)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (blocks * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.parametrize("mode", ["p", "w", "f"], ids=["pass", "wrong-result", "failing-import"])
def test_under_ulimit_f_a_run_from_its_plan_gives_what_the_run_in_process_gives(client, runtime, system_module, moody, tmp_path, mode):
    _settled()
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, *EXPECT]
    assert _run(client, args, _env(runtime), tmp_path)[0] == 0
    assert len(plan_files(runtime)) == 1
    (tmp_path / "mode").write_text(mode)
    limited = _file_limit(20)
    reference = _run(client, args, _env(runtime, "off"), tmp_path, preexec_fn=limited)
    before = _served(runtime)
    assert _run(client, args, _env(runtime), tmp_path, preexec_fn=limited) == reference
    assert _served(runtime) == before + 1  # run by the client, from the plan


def test_what_the_client_cannot_hand_over_is_an_error_that_says_where(client, runtime, system_module, moody, tmp_path):
    """The tool failed saying 2.4 MB (more than a pipe holds) under `ulimit -f 100`: its output
    cannot be kept for pyree_build to report, and the client says so rather than run it again."""
    _settled()
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, *EXPECT]
    tmp = tmp_path / "tmp"  # this test's own: what is left in it, these runs left
    tmp.mkdir()
    assert _run(client, args, _env(runtime, TMPDIR=str(tmp)), tmp_path)[0] == 0
    (tmp_path / "mode").write_text("b")
    calls = _calls(tmp_path)
    code, _, err = _run(client, args, _env(runtime, TMPDIR=str(tmp)), tmp_path, preexec_fn=_file_limit(100))
    assert code == 1, err
    assert re.fullmatch(r"error: cannot keep what iree-run-module printed in /\S+/<results>: File too large\n", err), err
    assert _calls(tmp_path) == calls + 1, "the tool ran again"
    assert list(tmp.iterdir()) == [], "a results directory was left behind"


def _same_size_edit(path: Path, data: bytes) -> None:
    """`data` written over `path` (as long as it was), its modification time put back."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _f32(value: float, suffix: str) -> bytes:
    """8 float32 of `value`: raw (.bin) or as numpy saves them (.npy)."""
    array = np.full(8, value, np.float32)
    if suffix == ".bin":
        return array.tobytes()
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("spec", "name"),
    [("8xf32=@ref.bin", "ref.bin"), (" @ref.npy", "ref.npy"), ("@ref.npy", "ref.npy"), ("8xf32= @ref.bin", "ref.bin")],
    ids=["shape-at-bin", "space-at-npy", "at-npy", "shape-space-at-bin"],
)
def test_an_edited_reference_of_expect_close_voids_the_plan(client, runtime, system_module, moody, tmp_path, spec, name):
    """Issue 44 item 2: the reference --expect-close reads (in any form of its spec) is read
    after the tool, by pyree_build: a plan stands for it as for the files the tool reads."""
    ref = tmp_path / name
    ref.write_bytes(_f32(12, ref.suffix))
    _settled()
    args = ["run", system_module, *RUN_ARGS, "--plugin", moody, "--expect-close", spec]
    for _ in range(2):
        assert _run(client, args, _env(runtime), tmp_path)[0] == 0
    assert len(plan_files(runtime)) == 1
    _same_size_edit(ref, _f32(99, ref.suffix))
    reference = _run(client, args, _env(runtime, "off"), tmp_path)
    assert reference[0] == 1 and "expected 99.0" in reference[2], reference
    assert _run(client, args, _env(runtime), tmp_path) == reference


# Every form of a `run` option that names a file, for input a (b is 4) and the check; the
# files hold a = 2 and the result a * b + b = 12 until an edit makes them 3 or 16.
_INPUT_FORMS = ["8xf32=2", "@a.npy", " @a.npy", "8xf32=@a.bin", "8xf32= @a.bin"]
_CHECK_FORMS = [
    [], ["-q"], ["--expect", "8xf32=12 12 12 12 12 12 12 12"], ["--expect-close", "8xf32=12"], ["--expect-close", "@r.npy"],
    ["--expect-close", " @r.npy"], ["--expect-close", "8xf32=@r.bin"], ["--expect-close", "8xf32= @r.bin", "--atol", "0.5"],
    ["--check-file", "c.txt"], ["-q", "--expect-close", "@r.npy"],
]  # fmt: skip
_EDITS = [f"edit {name} {value}" for name in ("a.npy", "a.bin") for value in (2, 3)] + [
    f"edit {name} {value}" for name in ("r.npy", "r.bin", "c.txt") for value in (12, 16)
]


def _contents(name: str, value: int) -> bytes:
    if name == "c.txt":
        return f"CHECK: 8xf32={value}\n".encode()
    return _f32(value, Path(name).suffix)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None)
@given(
    input_form=st.sampled_from(_INPUT_FORMS),
    check=st.sampled_from(_CHECK_FORMS),
    steps=st.lists(st.sampled_from(["run", "wait", *_EDITS]), min_size=1, max_size=5),
)
@example(input_form="8xf32=2", check=["--expect-close", "8xf32=@r.bin"], steps=["edit r.bin 16", "run"])
@example(input_form=" @a.npy", check=["--expect-close", " @r.npy"], steps=["edit a.npy 3", "run", "edit r.npy 16", "wait", "run", "edit a.npy 2", "run"])
def test_any_run_line_and_edits_of_its_files_give_the_verdict_of_a_run_without_the_client(
    client, runtime, system_module, moody, tmp_path, input_form, check, steps
):
    """Property (issue 44, item 2): whatever form names the files a run reads (inputs and
    references: @, leading space, SHAPE=@, .bin or .npy) and however they are edited (same
    size, modification time put back), the client with the server (plans written and used)
    gives the exit code and output of the same line with PYREE_BUILD_SERVER=off."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    for name, value in (("a.npy", 2), ("a.bin", 2), ("r.npy", 12), ("r.bin", 12), ("c.txt", 12)):
        (work / name).write_bytes(_contents(name, value))
    _settled()
    args = ["run", system_module, "--function", "mixed_invocation", "--input", input_form, "--input", "8xf32=4", "--plugin", moody, *check]
    for step in ["run", "run", *steps, "run"]:
        if step == "wait":
            _settled()
        elif step.startswith("edit"):
            _, name, value = step.split()
            _same_size_edit(work / name, _contents(name, int(value)))
        else:
            reference = _run(client, args, _env(runtime, "off"), work)
            assert _run(client, args, _env(runtime), work) == reference, (input_form, check, steps)


@pytest.mark.slow
def test_a_ctest_whose_expect_close_reference_was_edited_fails(client, runtime, tmp_path):
    """Issue 44, item 2, as ctest meets it: pyree_add_run_test(... EXPECT_CLOSE "8xf32=@ref.bin")
    passed twice (a plan is written); ref.bin edited in place, the test fails as it does with
    PYREE_BUILD_SERVER=off."""
    src, out = tmp_path / "src", tmp_path / "build"
    write_downstream(src)  # the plugin scales by 3: 2 * 4 * 3 + 4 = 28
    cmake = (src / "CMakeLists.txt").read_text()
    assert 'EXPECT "8xf32=28' in cmake
    (src / "CMakeLists.txt").write_text(re.sub(r'EXPECT "8xf32=[0-9 ]+"', 'EXPECT_CLOSE "8xf32=@ref.bin"', cmake))
    configure(src, out)
    build(out)
    (out / "ref.bin").write_bytes(_f32(28, ".bin"))
    _settled()

    def ctest(mode: str) -> subprocess.CompletedProcess[str]:
        ctest_argv = [*toolchain.ctest().argv, "--test-dir", str(out), "--output-on-failure"]
        return subprocess.run(ctest_argv, env=_env(runtime, mode), capture_output=True, text=True, timeout=300)

    for _ in range(2):
        passed = ctest("on")
        assert passed.returncode == 0, passed.stdout
    assert len(plan_files(runtime)) == 1
    _same_size_edit(out / "ref.bin", _f32(99, ".bin"))
    without = ctest("off")
    assert without.returncode != 0 and "expected 99.0" in without.stdout, without.stdout
    served = ctest("on")
    assert served.returncode != 0 and "expected 99.0" in served.stdout, served.stdout
