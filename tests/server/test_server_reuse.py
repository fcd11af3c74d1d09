"""A worker serves another command only once it is what a fresh worker would be
(server/reuse.py): whatever the commands before it changed, each command's output, exit code
and files are those of the same command in a process of its own."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.served import normal_output
from support.watched import RUN_ARGS

from pyree_build.client import protocol
from pyree_build.server import reuse, startup

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the server is tested on Linux (/proc, SCM_RIGHTS)")

_RUN = ["run", "e.vmfb", *RUN_ARGS, "--plugin", "p.so"]
# Each step changes what a worker could carry to the next one: verbosity (a module global),
# cwd (relative paths), umask (a written file's mode), the environment (the cache off or on),
# an exit code, and a build's cache hit against a real build.
STEPS = {
    "run": [*_RUN, "--expect", "8xf32=12 12 12 12 12 12 12 12"],
    "run-wrong": [*_RUN, "--expect", "8xf32=1 1 1 1 1 1 1 1"],
    "run-quiet": ["-q", *_RUN],
    "run-verbose": ["-v", *_RUN],
    # A module for this host's CPU with the baseline plugin: a note said once per process.
    "run-host": ["run", "host.vmfb", *RUN_ARGS, "--plugin", "p.so"],
    "plugin": ["plugin", "--kind", "system", str(PLUGIN_SAMPLE / "system_plugin.c"), "-o", "out.so"],
    "version": ["--version"],
}


def _stop(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "pyree_build", "server", "stop"], env=env, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, system_module: Path, system_plugin: Path) -> Path:
    """Two directories holding the module and plugin under the same relative names."""
    root = tmp_path_factory.mktemp("reuse")
    host = root / "host.vmfb"
    built = subprocess.run([sys.executable, "-m", "pyree_build", "compile", str(PLUGIN_SAMPLE / "example.mlir"), "--cpu", "host", "-o", host],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr
    for name in ("a", "b"):
        (root / name).mkdir()
        shutil.copy(system_module, root / name / "e.vmfb")
        shutil.copy(host, root / name / "host.vmfb")
        shutil.copy(system_plugin, root / name / "p.so")
    return root


def _step(step: tuple[str, str, int, bool], root: Path, env: dict[str, str]) -> tuple[object, ...]:
    """One command; the cache on is each mode's own, so both see the same history of builds."""
    verb, where, umask, cache = step
    cwd = root / where
    run_env = dict(env, PYREE_BUILD_CACHE=str(root / f"cache-{env['PYREE_BUILD_SERVER']}") if cache else "off")
    script = f'umask {umask:03o}; exec "$0" -m pyree_build "$@"'
    done = subprocess.run(["sh", "-c", script, sys.executable, *STEPS[verb]], env=run_env, cwd=cwd, capture_output=True, text=True, timeout=300)
    mode = None
    written = cwd / "out.so"
    if written.exists():
        mode = stat.S_IMODE(written.stat().st_mode)
        written.unlink()
    return done.returncode, normal_output(done.stdout, root), normal_output(done.stderr, root), mode


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example([("run-host", "a", 0o022, True)] * 4)  # however the pool's workers take turns, one of them serves it twice
@example([("plugin", "a", 0o022, False)] + [("run-host", "a", 0o077, False)] * 3)  # a fact recorded with the cache off
@given(st.lists(st.tuples(st.sampled_from(sorted(STEPS)), st.sampled_from(["a", "b"]), st.sampled_from([0o022, 0o077]), st.booleans()), min_size=2, max_size=6))
def test_a_sequence_of_commands_gives_what_each_gives_in_its_own_process(work, steps):
    runtime = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    served = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER="on")
    try:
        on = [_step(s, work, served) for s in steps]
    finally:
        _stop(served)
        shutil.rmtree(runtime, ignore_errors=True)
    off = [_step(s, work, dict(os.environ, PYREE_BUILD_SERVER="off")) for s in steps]
    for step, got, alone in zip(steps, on, off):
        assert got == alone, f"{step}: served (left) differs from its own process (right) after {steps}"


def test_three_runs_in_a_row_are_served_by_a_worker_that_served_before(work):
    # Two spares wait; the first run's worker comes back as one (the pool is then full, so
    # nothing is forked), so by the third run both spares have served a command.
    runtime = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER="on")
    try:
        outputs = [subprocess.run([sys.executable, "-m", "pyree_build", *_RUN], env=env, cwd=work / "a", capture_output=True, text=True, timeout=300)
                   for _ in range(3)]  # fmt: skip
        assert [o.returncode for o in outputs] == [0, 0, 0] and len({o.stdout for o in outputs}) == 1, outputs
        report = protocol.control("status", env)
        assert report is not None and int(str(report["served_again"])) >= 1, report
    finally:
        _stop(env)
        shutil.rmtree(runtime, ignore_errors=True)


def _server_log(env: dict[str, str]) -> str:
    return Path(protocol.socket_path(env)).with_suffix(".log").read_text()


def test_a_worker_that_imported_modules_exits_and_the_log_says_why(work):
    runtime = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER="on")
    try:
        first = subprocess.run([sys.executable, "-m", "pyree_build", *_RUN], env=env, cwd=work / "a", capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stderr
        # doctor loads what the server does not preload (the GPU drivers' bindings).
        doctor = subprocess.run([sys.executable, "-m", "pyree_build", "doctor"], env=env, capture_output=True, text=True, timeout=300)
        assert "module(s) imported" not in doctor.stdout + doctor.stderr, "the reason went to the client, not the log"
        # The worker decides after its client has the answer: its line may come a moment later.
        deadline = time.monotonic() + 30
        while "module(s) imported" not in _server_log(env) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "exits after its command:" in _server_log(env) and "module(s) imported" in _server_log(env)
        again = subprocess.run([sys.executable, "-m", "pyree_build", *_RUN], env=env, cwd=work / "a", capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    finally:
        _stop(env)
        shutil.rmtree(runtime, ignore_errors=True)


_PROBE = textwrap.dedent(
    """
    import json, os, resource, signal, sys, tempfile, threading, warnings
    import numpy
    from pyree_build.server import daemon, reuse
    from pyree_build.core import echo, toolchain
    from pyree_build.backends.llvm_cpu import cpus

    out = os.dup(1)  # where the probe reports, before the baseline
    plan = reuse.Plan.of_loaded()
    base = reuse.Baseline.capture(plan, but=-1)
    case = sys.argv[1]
    if case == "restore":
        os.environ["PYREE_PROBE"] = "1"
        os.umask(0o077)
        os.chdir(tempfile.gettempdir())
        signal.signal(signal.SIGUSR1, lambda *_: None)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
        echo.set_verbosity(2)
        toolchain._probe_version(("true",), "x")
        tempfile.tempdir = "/nonexistent"
        warnings.simplefilter("ignore")
        numpy.set_printoptions(precision=2)
        sys.argv.append("extra")
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)  # the client's stdout, as a worker has it
        os.close(null)
        why = base.why_not()
        base.restore()
        found = {
            "why": why, "env": "PYREE_PROBE" in os.environ, "umask": os.umask(0o022) == base.umask, "cwd": os.getcwd(),
            "usr1": signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL,
            "mask": signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, []),
            "verbosity": echo.VERBOSITY, "cache": toolchain._probe_version.cache_info().currsize,
            "tempdir": tempfile.tempdir == base.tempdir, "filters": warnings.filters == base.filters,
            "precision": numpy.get_printoptions()["precision"], "argv": sys.argv == base.argv,
            "stdout": os.path.samestat(os.fstat(1), os.fstat(base.std[1])),
        }
        os.write(out, json.dumps(found).encode())
        sys.exit(0)
    if case == "thread":
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    elif case == "fd":
        os.open(os.devnull, os.O_RDONLY)
    elif case == "module":
        import wave
    elif case == "limit":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))
    elif case == "container":
        cpus._SAID.add(("a note said once per process",))
    elif case == "child":
        import subprocess
        subprocess.Popen(["sleep", "30"])
    elif case == "priority":
        os.nice(1)
    print(json.dumps({"why": base.why_not()}))
    """
)


def _probe(case: str) -> dict[str, object]:
    # As the server imports: numpy's BLAS held to one thread (a baseline has none but the main one).
    env = {**os.environ, **dict.fromkeys(startup.ONE_THREAD, "1")}
    done = subprocess.run([sys.executable, "-c", _PROBE, case], capture_output=True, text=True, timeout=120, cwd="/", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_what_a_command_changed_is_put_back_as_the_worker_was_forked():
    found = _probe("restore")
    assert found["why"] is None, found
    assert found == {
        "why": None, "env": False, "umask": True, "cwd": "/", "usr1": True, "mask": False, "verbosity": 1, "cache": 0,
        "tempdir": True, "filters": True, "precision": 8, "argv": True, "stdout": True,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("thread", "thread(s) still running"),
        ("fd", "opened or closed"),
        ("module", "module(s) imported"),
        ("limit", "a resource limit changed"),
        ("container", "pyree_build.backends.llvm_cpu.cpus._SAID changed"),
        ("child", "a child process is still running"),
        ("priority", "its priority"),
    ],
)
def test_what_cannot_be_put_back_ends_the_worker_with_the_reason(case, reason):
    why = _probe(case)["why"]
    assert isinstance(why, str) and reason in why, why


def test_with_nothing_changed_a_worker_may_serve_again():
    assert _probe("nothing")["why"] is None


@settings(max_examples=60, deadline=None)
@given(
    keep=st.sets(st.integers(min_value=0, max_value=200)),
    changed=st.dictionaries(st.text("ABCXYZ_é", min_size=1, max_size=4), st.text("abc =:/-é", max_size=6), max_size=6),
)
def test_the_environment_a_worker_takes_on_is_exactly_the_one_given(keep, changed):
    """become_environment changes only what differs, yet leaves os.environ (what putenv gives
    the tools) equal to the client's: variables dropped, added and changed in any mix."""
    saved = dict(os.environ)
    target = {**{k: v for i, (k, v) in enumerate(sorted(saved.items())) if i in keep}, **changed}
    try:
        reuse.become_environment(target)
        assert dict(os.environ) == target
        seen = subprocess.run(["env", "-0"], capture_output=True, check=True).stdout
        child = dict(entry.split(b"=", 1) for entry in seen.split(b"\0") if entry)
        # Each variable either side names (a library may have set others with C's setenv alone).
        assert {k: child.get(os.fsencode(k)) for k in {*saved, *target}} == {k: os.fsencode(target[k]) if k in target else None for k in {*saved, *target}}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_globals_compared_after_a_command_are_those_pyree_build_code_can_rebind():
    """Plan.of_loaded compares only the module globals some pyree_build code stores or deletes
    (a `global` in its module, or an attribute of that name anywhere), found by scanning the
    bytecode in C: the scan finds exactly what dis finds, and the plan keeps the globals the
    CLI and the server do rebind."""
    import dis
    import types

    modules = {n: m for n, m in list(sys.modules.items()) if m is not None and (n == "pyree_build" or n.startswith("pyree_build."))}
    per_module, anywhere = reuse._rebindable(modules)
    want_here, want_anywhere = {}, set()
    for name, module in modules.items():
        here, pending = set(), [module.__spec__.loader.get_code(name)]
        while pending:
            code = pending.pop()
            for op in dis.get_instructions(code):
                if op.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                    here.add(op.argval)
                elif op.opname in ("STORE_ATTR", "DELETE_ATTR"):
                    want_anywhere.add(op.argval)
            pending += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        want_here[name] = here
    assert per_module == want_here and anywhere == want_anywhere
    compared = {f"{d['__name__']}.{k}" for d, k in reuse.Plan.of_loaded().globals}
    assert {
        "pyree_build.core.echo.VERBOSITY",
        "pyree_build.core.processes.stops._STOP_SIGNAL",
        "pyree_build.core.processes.tools._PARENT_ENDS_TOOLS",
    } <= compared


_FIELD = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)) | st.sampled_from(["\udcff", "\udc80"]), max_size=8)


@settings(max_examples=200, deadline=None)
@given(argv=st.lists(_FIELD, max_size=5), env=st.dictionaries(_FIELD.filter(lambda k: k and "=" not in k), _FIELD, max_size=6), cwd=_FIELD)
def test_a_request_decodes_to_what_the_client_encoded(argv, env, cwd):
    """The worker decodes a request whole (one call, not one per field): arguments, variables
    and directories of any characters, undecodable bytes (surrogate escapes) included, come
    out as the client put them in."""
    decoded = protocol.decode(protocol.encode("run", argv, env, cwd)[4:])
    decoded.pop("umask")
    assert decoded == {"kind": "run", "identity": protocol.identity(), "cwd": cwd, "argv": argv, "env": env}
