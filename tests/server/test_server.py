"""The per-user server (issue 23, items 1-3): every command gives the same output and exit code
with it and without it; signals reach the work; the socket is safe; a dead or stale server is
replaced; clients are served in parallel; the native client speaks the same protocol.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE, install_backend
from hypothesis import given, settings
from hypothesis import strategies as st
from support.served import normal_output
from support.watched import RUN_ARGS, Watched, is_server_process, leftovers, plugin_variant, process_table, slow_c_source

from pyree_build.client import protocol
from pyree_build.server import prefault, watch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the server is tested on Linux (/proc, SCM_RIGHTS)")

TOY = """
import sys

from pyree_build.backends.base import Backend, Option, Verb


class EchoBackend(Backend):
    name = "echo"
    description = "a backend whose verb reads stdin"
    verbs = (
        Verb("echo-lines", "print stdin's lines to stdout and stderr in turn", "toy_backend:echo_lines", (),
             description="Print each line of stdin, alternately to stdout and stderr.", examples="pyree-build echo-lines < FILE"),
    )

    def target_flags(self, options):
        return []


def echo_lines():
    for i, line in enumerate(sys.stdin):
        print(f"{i} {line.rstrip()}", file=sys.stdout if i % 2 == 0 else sys.stderr, flush=True)
    print(f"tty={sys.stdout.isatty()}", flush=True)


BACKEND = EchoBackend()
"""


def _env(mode: str, **extra: str) -> dict[str, str]:
    """The test's environment (so the session's server, whose key includes PYTHONPATH) in `mode`."""
    return {**os.environ, "PYREE_BUILD_SERVER": mode, **extra}


def _cli(*args: str | os.PathLike[str], env: dict[str, str], cwd: Path | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyree_build", *map(os.fspath, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A socket directory of the test's own ($XDG_RUNTIME_DIR, short: sun_path holds 107 bytes),
    its server stopped at the end."""
    path = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    yield path
    subprocess.run([sys.executable, "-m", "pyree_build", "server", "stop"], env=_env("on", XDG_RUNTIME_DIR=str(path)), capture_output=True, timeout=60)
    shutil.rmtree(path, ignore_errors=True)


def _status(env: dict[str, str] | None = None) -> dict[str, object] | None:
    """The server's status, asked from a process that imports pyree_build as the commands do
    (`python -m` from this directory takes a checkout's copy before an installed one, and the
    server's identity names the package directory)."""
    code = "import json, os; from pyree_build.client import protocol as p; print(json.dumps(p.control('status', dict(os.environ))))"
    asked = subprocess.run([sys.executable, "-c", code], env=env if env is not None else os.environ, capture_output=True, text=True, timeout=60)
    assert asked.returncode == 0, asked.stderr
    return json.loads(asked.stdout)  # type: ignore[no-any-return]


def _ensure_server() -> dict[str, object]:
    assert _cli("--version", env=_env("on")).returncode == 0
    report = _status()
    assert report is not None, "no server after a command with PYREE_BUILD_SERVER=on"
    return report


# One representative command of every verb: errors, help, a build, its cache hit, run passing
# and failing its check, doctor. Paths are relative to each mode's own directory.
_SRC = PLUGIN_SAMPLE / "system_plugin.c"
_MLIR = PLUGIN_SAMPLE / "example.mlir"
_RUN = ["run", "e.vmfb", *RUN_ARGS, "--plugin", "p.so"]
COMMANDS: list[list[str]] = [
    ["--version"],
    ["--help"],
    [],
    ["nosuchverb"],
    ["plugin", "--kind", "system", str(_SRC), "-o", "p.so"],
    ["plugin", "--kind", "system", str(_SRC), "-o", "p.so"],
    ["compile", str(_MLIR), "-o", "e.vmfb", "--target", "llvm-cpu"],
    ["compile", "missing.mlir", "-o", "x.vmfb"],
    [*_RUN, "--expect", "8xf32=12 12 12 12 12 12 12 12"],
    [*_RUN, "--expect", "8xf32=1 1 1 1 1 1 1 1"],
    ["run", "e.vmfb"],
    ["bench", "--help"],
    ["dump", "missing.mlir", "-o", "d"],
    *[[verb] for verb in ("objects", "fatelf", "imports", "ptx", "bitcode", "cuda-target", "spirv", "hsaco", "code-objects", "tune")],
    *[[verb] for verb in ("import", "ops", "replace", "verify", "new")],
    ["samples", "--help"],
    ["cache", "info"],
    ["cache", "nosuchaction"],
    ["server", "--help"],
    ["doctor"],
]


def test_every_verb_gives_the_same_output_and_exit_code_with_and_without_the_server(tmp_path):
    results: dict[str, list[tuple[int, str, str]]] = {}
    for mode in ("on", "off"):
        root = tmp_path / mode
        root.mkdir()
        env = _env(mode, PYREE_BUILD_CACHE=str(root / "cache"))
        results[mode] = []
        for args in COMMANDS:
            r = _cli(*args, env=env, cwd=root)
            results[mode].append((r.returncode, normal_output(r.stdout, root), normal_output(r.stderr, root)))
    for args, on, off in zip(COMMANDS, results["on"], results["off"]):
        assert on == off, f"pyree-build {' '.join(args)}: differs with the server (left) and without (right)"
    codes = dict(zip(map(tuple, COMMANDS), (r[0] for r in results["on"])))
    assert codes[tuple(COMMANDS[8])] == 0 and codes[tuple(COMMANDS[9])] == 1 and codes[("nosuchverb",)] == 2


def test_the_python_client_imports_none_of_the_cli():
    """Its imports are its whole start-up: the socket and the protocol, not argparse or a verb."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "pyree_build", "--version"], env=_env("on"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("pyree_build "), proc.stderr[-2000:]
    names = {line.split("|")[2].strip() for line in proc.stderr.splitlines() if line.startswith("import time:") and line.count("|") == 2}
    assert "pyree_build.server.client" in names and "pyree_build.client.protocol" in names
    heavy = ("pyree_build.cli", "pyree_build.actions", "pyree_build.backends", "argparse", "subprocess")  # not pyree_build.client
    loaded = sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in heavy))
    assert loaded == [], loaded


def test_stdin_is_passed_and_interleaved_output_keeps_its_order(tmp_path):
    (tmp_path / "toy").mkdir()
    toy = install_backend(tmp_path / "toy", "echo", TOY)
    lines = "".join(f"line {i}\n" for i in range(40))
    expected = "".join(f"{i} line {i}\n" for i in range(40)) + "tty=False\n"
    for mode in ("on", "off"):
        env = _env(mode, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), str(toy)]))
        proc = subprocess.run(
            [sys.executable, "-m", "pyree_build", "echo-lines"], input=lines, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120
        )
        assert (proc.returncode, proc.stdout) == (0, expected), mode


def test_a_killed_client_stops_its_work(tmp_path):
    """SIGKILL of the client (nothing can forward it): its worker sees the connection close and
    stops as on SIGTERM, so the compiler ends and its temporaries are removed."""
    src = slow_c_source(tmp_path / "slow.c")
    out = tmp_path / "out"
    watched = Watched([sys.executable, "-m", "pyree_build", "plugin", "--kind", "standalone", src, "-o", out / "p.sos"], _env("on", PYREE_BUILD_CACHE="off"))
    watched.wait_for("zig")
    os.kill(watched.proc.pid, signal.SIGKILL)
    watched.proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while watched.survivors() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watched.survivors() == []
    time.sleep(0.5)
    assert leftovers(tmp_path) == [] and not (out / "p.sos").exists()


def test_a_killed_worker_is_reported_by_its_client_and_in_the_log(tmp_path):
    """SIGKILL of the worker serving a command (the OOM killer, a crash): its client says so,
    naming the server's log, and exits 1; the log names the signal; the worker's tools die
    with it (the server ends them: see the next test); the server goes on serving."""
    before = _ensure_server()
    src = slow_c_source(tmp_path / "slow.c")
    watched = Watched(
        [sys.executable, "-m", "pyree_build", "plugin", "--kind", "standalone", src, "-o", tmp_path / "p.sos"], _env("on", PYREE_BUILD_CACHE="off")
    )
    workers: set[int] = set()
    deadline = time.monotonic() + 60
    while not workers and time.monotonic() < deadline:  # a zig seen may end before the table is read (a quick probe)
        watched.wait_for("zig")
        table = process_table()
        tools = [pid for pid in watched.pids if pid in table and "zig" in table[pid][4] and table[pid][3] not in "ZX"]
        workers = {table[pid][0] for pid in tools if is_server_process(table.get(table[pid][0], (0, 0, 0, "", ""))[4])}  # the tools' parent
    assert len(workers) == 1, workers
    worker = workers.pop()
    os.kill(worker, signal.SIGKILL)
    out, err = watched.proc.communicate(timeout=60)
    assert watched.proc.returncode == 1, err
    assert "the server's worker ended without an exit code (its log: " in err and ".log)" in err, err
    log = Path(err.split("(its log: ")[1].split(")")[0])
    deadline = time.monotonic() + 10
    while f"worker {worker} was killed by SIGKILL" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # the server reaps it within its next second
    assert f"worker {worker} was killed by SIGKILL" in log.read_text()
    deadline = time.monotonic() + 30
    while watched.survivors() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watched.survivors() == []
    after = _status()
    assert after is not None and after["pid"] == before["pid"]


def test_the_tool_of_a_killed_worker_is_ended_by_the_server(tmp_path, system_module):
    """A worker execs its tools directly (no setpriv wrapper: processes.parent_ends_tools); when
    it is killed, its hanging iree-run-module is reparented to the server, a subreaper, which
    ends it. The plugin never returns, so only the server's sweep can end the tool."""
    _ensure_server()
    hang = plugin_variant(tmp_path, "hang", "  { extern unsigned int sleep(unsigned int); for (;;) sleep(1); }")
    argv = [sys.executable, "-m", "pyree_build", "run", system_module, *RUN_ARGS, "--plugin", hang, "--timeout", "600"]
    client = subprocess.Popen(argv, env=_env("on"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, tools = time.monotonic() + 60, []
        while not tools and time.monotonic() < deadline:
            time.sleep(0.1)
            table = process_table()
            tools = [pid for pid, row in table.items() if "iree-run-module" in row[4] and os.fspath(hang) in row[4]]
        assert len(tools) == 1, "iree-run-module never started"
        tool, worker = tools[0], table[tools[0]][0]
        assert is_server_process(table[worker][4]), table[worker]
        os.kill(worker, signal.SIGKILL)
        client.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while tool in process_table() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tool not in process_table(), "the killed worker's iree-run-module still runs"
    finally:
        client.kill()
        for pid, row in process_table().items():
            if os.fspath(hang) in row[4]:
                os.kill(pid, signal.SIGKILL)


def test_a_killed_server_is_replaced():
    before = _ensure_server()
    os.kill(int(str(before["pid"])), signal.SIGKILL)
    result = _cli("cache", "info", env=_env("on"))
    assert result.returncode == 0, result.stderr
    after = _status()
    assert after is not None and after["pid"] != before["pid"]


def test_a_worker_that_cannot_print_its_error_leaves_the_server_alone(tmp_path):
    """A command that fails while its stderr is a pipe nobody reads any more (a ninja job once
    ninja was stopped) cannot print its error; its worker must still just exit, not unwind into
    the server's code it was forked from: that SIGKILLed the worker forked before it (another
    client's command, which then ended without an exit code) and removed the server's socket."""
    before = _ensure_server()
    read, write = os.pipe()
    os.close(read)
    try:
        argv = [sys.executable, "-m", "pyree_build", "compile", tmp_path / "missing.mlir", "-o", tmp_path / "m.vmfb"]
        failed = subprocess.run(argv, env=_env("on"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=write, timeout=300)
    finally:
        os.close(write)
    assert failed.returncode == 1
    after = _status()
    assert after is not None and after["pid"] == before["pid"], "the server's socket was removed"


def test_a_stale_server_is_replaced_when_pyree_build_changes():
    before = _ensure_server()
    edited = PACKAGE_ROOT / "pyree_build" / "server" / "__init__.py"  # the copy the server runs
    info = edited.stat()
    os.utime(edited, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    try:
        result = _cli("--version", env=_env("on"))
    finally:
        os.utime(edited, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert result.returncode == 0 and result.stdout.startswith("pyree_build "), result.stderr
    after = _status()
    assert after is not None and after["pid"] != before["pid"]


def test_concurrent_clients_are_served_in_parallel(tmp_path, system_module):
    """Eight runs whose plugin sleeps 1.5 s each: served one after another they would take 12 s."""
    sleeping = plugin_variant(tmp_path, "sleep", "  { extern int usleep(unsigned int); usleep(1500000); }")
    before = _ensure_server()
    argv = [sys.executable, "-m", "pyree_build", "run", system_module, *RUN_ARGS, "--plugin", sleeping]
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: subprocess.run(argv, env=_env("on"), capture_output=True, text=True, timeout=120), range(8)))
    elapsed = time.monotonic() - start
    assert [r.returncode for r in results] == [0] * 8, [r.stderr for r in results if r.returncode]
    after = _status()
    assert after is not None and after["pid"] == before["pid"]
    assert int(str(after["requests"])) >= int(str(before["requests"])) + 8
    assert elapsed < 10, f"8 clients took {elapsed:.1f} s: not served in parallel"


def test_a_socket_directory_others_can_open_is_refused(runtime):
    for how in ("group-writable", "another user's"):
        (runtime / "pyree_build").mkdir()
        os.chmod(runtime / "pyree_build", 0o770 if how == "group-writable" else 0o700)
        if how != "group-writable":
            if os.getuid() != 0:
                continue  # only root can give a directory away
            os.chown(runtime / "pyree_build", 65534, 65534)
        result = _cli("--version", env=_env("on", XDG_RUNTIME_DIR=str(runtime)))
        assert result.returncode == 0 and result.stdout.startswith("pyree_build "), result
        assert "not using the server" in result.stderr and "mode 0700" in result.stderr, result.stderr
        assert list((runtime / "pyree_build").iterdir()) == []
        (runtime / "pyree_build").rmdir()


def test_a_request_of_another_identity_is_refused():
    _ensure_server()
    frame = protocol.encode("run", ["--version"], {}, "/").replace(protocol.identity().encode(), b"/other/python|/other/env|/other/pyree_build")
    frame = len(frame[4:]).to_bytes(4, "little") + frame[4:]
    with protocol.connect(protocol.socket_path()) as sock:
        protocol.send_request(sock, frame, [0, 1, 2])
        assert protocol.read_line(sock).startswith("refused")


def test_the_server_exits_when_idle_and_removes_its_socket(runtime):
    env = _env("on", XDG_RUNTIME_DIR=str(runtime), PYREE_BUILD_SERVER_IDLE="1")
    assert _cli("--version", env=env).returncode == 0
    report = _status(env)
    assert report is not None and report["idle_timeout_s"] == 1
    deadline = time.monotonic() + 20
    while protocol.alive(int(str(report["pid"]))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not protocol.alive(int(str(report["pid"])))
    assert not Path(str(report["socket"])).exists()


def test_server_status_and_stop(runtime):
    env = _env("on", XDG_RUNTIME_DIR=str(runtime))
    assert "server: not running" in _cli("server", "status", env=env).stdout
    assert _cli("cache", "info", env=env).returncode == 0
    status = _cli("server", "status", env=env).stdout
    assert re.search(r"server: running\npid: \d+\nsocket: .*\nuptime: .* s\nrequests: 1\nidle timeout: 300 s\npython: .*\npages copied ahead: \d+", status), (
        status
    )
    pid = int(status.split("pid: ")[1].split()[0])
    stopped = _cli("server", "stop", env=env)
    assert stopped.returncode == 0 and f"server: stopped (pid {pid}, " in stopped.stdout
    assert not protocol.alive(pid)
    assert "server: not running" in _cli("server", "status", env=env).stdout


def _event(mask: int, name: bytes) -> bytes:
    padded = name + b"\0" * (-len(name) % 16 or (16 if name else 0))
    return struct.pack("iIII", 1, mask, 0, len(padded)) + padded


def test_what_a_worker_learns_about_files_the_next_workers_know(runtime, system_module, system_plugin):
    """A served `run` reads the module's signature and the plugin's imports (cache/facts.py)
    and hashes both; its worker hands that back to the server, so the workers forked after it
    know it without reading the disk. A status answered by such a worker counts it."""
    env = _env("on", XDG_RUNTIME_DIR=str(runtime))
    assert _cli("--version", env=env).returncode == 0
    assert "facts known: 0 " in _cli("server", "status", env=env).stdout
    ran = _cli("run", system_module, *RUN_ARGS, "--plugin", system_plugin, env=env)
    assert ran.returncode == 0, ran.stderr
    known = 0
    for _ in range(40):  # the spares forked before the report do not know it; those forked after do
        time.sleep(0.1)
        status = _cli("server", "status", env=env).stdout
        known = int(status.split("facts known: ")[1].split()[0])
        if known:
            break
    assert known >= 3, status  # the module's metadata, the plugin's resolves, and their digests


def test_a_change_is_an_event_on_a_source_or_an_install_and_never_on_pycache():
    created, modified, overflow = 0x100, 0x2, 0x4000
    assert not watch._relevant(_event(created, b"__pycache__"))
    assert watch._relevant(_event(created, b"__pycache__") + _event(modified, b"plugins.py"))
    assert watch._relevant(_event(created, b"numpy-2.0.dist-info"))
    assert watch._relevant(_event(overflow, b""))  # events were lost: assume a change
    assert watch._relevant(_event(0x400, b""))  # the watched directory itself was removed


def test_workers_report_the_pages_they_wrote_for_the_next_spares(runtime):
    if not os.access("/proc/self/pagemap", os.R_OK):
        pytest.skip("/proc/self/pagemap cannot be read here: workers copy on write, as without the server's prefault")
    env = _env("on", XDG_RUNTIME_DIR=str(runtime))
    for _ in range(3):
        assert _cli("--version", env=env).returncode == 0
    deadline = time.monotonic() + 30
    while (report := _status(env)) and not report["learned_pages"] and time.monotonic() < deadline:
        time.sleep(0.05)  # a worker reports after its client has the answer
    assert report and int(str(report["learned_pages"])) > 0, report
    assert re.search(r"pages copied ahead: [1-9]\d*", _cli("server", "status", env=env).stdout)
    _cli("server", "stop", env=env)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=12), max_size=12), st.integers(1, 16))
def test_the_learned_pages_are_the_most_recently_reported_up_to_the_limit(reports, limit):
    """prefault.learn keeps the pages in the order they were last reported and only the newest
    `limit` of them, so what spares copy ahead follows what workers write now and never grows
    past the limit; it counts the pages it had not known."""
    learned: dict[int, None] = {}
    order: list[int] = []  # the model: every page, in the order last reported
    for report in reports:
        known = set(learned)
        new = prefault.learn(learned, report, limit)
        assert new == sum(1 for i, p in enumerate(report) if p not in known and p not in report[:i])
        for page in report:
            if page in order:
                order.remove(page)
            order.append(page)
        assert list(learned) == order[-limit:]


def _private_pages(pages: int) -> tuple[mmap.mmap, frozenset[int]]:
    """A private anonymous mapping, written (so present), and its page numbers."""
    buffer = mmap.mmap(-1, pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # copied on write after a fork
    buffer.write(b"x" * len(buffer))
    first = ctypes.addressof(ctypes.c_char.from_buffer(buffer)) // mmap.PAGESIZE
    return buffer, frozenset(range(first, first + pages))


def _faults_writing(buffer: mmap.mmap) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for offset in range(0, len(buffer), mmap.PAGESIZE):
        buffer[offset] = ord("y")
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_copy_ahead_copies_the_pages_so_that_writing_them_faults_no_more():
    """In a forked child: learned pages copied ahead are written without faults, where pages
    not learned fault once each; pagemap names both as written since the fork."""
    pages = 64
    (learned, wanted), (other, _) = _private_pages(pages), _private_pages(pages)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        copied = prefault.copy_ahead(wanted, lambda: False)
        faults = [_faults_writing(learned), _faults_writing(other)]
        os.write(write, json.dumps([len(wanted & copied), faults, wanted <= set(prefault.written_since_fork())]).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    copied, (faults_learned, faults_other), written = json.loads(os.read(read, 1000))
    if copied == 0:
        pytest.skip("MADV_POPULATE_WRITE is not supported here (Linux < 5.14)")
    assert copied == pages and written
    assert faults_other >= pages and faults_learned < faults_other - pages // 2, (faults_learned, faults_other)
    assert learned[:1] == b"x"  # the parent's pages are its own still


@pytest.fixture(scope="module")
def native_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = _cli("--native-client", tmp_path_factory.mktemp("client"), env=_env("on"))
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip())


def test_the_native_client_gives_the_python_clients_results(native_client, system_module, system_plugin, tmp_path):
    for args in (["--version"], ["nosuchverb"], ["run", system_module, *RUN_ARGS, "--plugin", system_plugin, "--expect", "8xf32=12 12 12 12 12 12 12 12"]):
        expected = _cli(*args, env=_env("off"))
        for mode in ("on", "off"):
            got = subprocess.run([native_client, *map(os.fspath, args)], env=_env(mode), capture_output=True, text=True, timeout=300)
            assert (got.returncode, normal_output(got.stdout, tmp_path), normal_output(got.stderr, tmp_path)) == (
                expected.returncode,
                normal_output(expected.stdout, tmp_path),
                normal_output(expected.stderr, tmp_path),
            ), (args, mode)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_native_client_forwards_signals(native_client, tmp_path, sig):
    out = tmp_path / "out"
    watched = Watched([str(native_client), "compile", str(_MLIR), "-o", str(out / "e.vmfb")], _env("on", PYREE_BUILD_CACHE="off"))
    watched.wait_for("iree-compile")
    code, err = watched.stop(sig)
    assert code == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err
    assert watched.survivors() == []
    assert not out.exists() or list(out.iterdir()) == []


def test_a_dead_servers_socket_is_replaced(runtime):
    """A socket file nobody listens on (its server was killed before it could remove it)."""
    env = _env("on", XDG_RUNTIME_DIR=str(runtime))
    path = protocol.socket_path(env)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.close()  # the file stays; connecting is refused
    result = _cli("--version", env=env)
    assert result.returncode == 0 and result.stdout.startswith("pyree_build "), result
    assert _status(env) is not None
    _cli("server", "stop", env=env)


def _listening(path: str) -> socket.socket:
    """A socket listening at the server's path before any client is started, so none is refused."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    listener.settimeout(5)
    return listener


def _answer_in_turn(listener: socket.socket, answers: list[bytes]) -> int:
    """Read each request and give it the next of `answers` (b"": close without a word, as a server
    retiring as the client connected does); then remove the socket. Returns the requests read."""
    served = 0
    try:
        for answer in answers:
            conn, _ = listener.accept()
            with conn:
                length = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))[0]
                conn.recv(length, socket.MSG_WAITALL)
                conn.sendall(answer)
            served += 1
    except TimeoutError:
        pass  # the client stopped asking
    finally:
        os.unlink(listener.getsockname())
        listener.close()
    return served


@pytest.mark.parametrize(
    ("answers", "expected"),
    [([b""], None), ([b"", b""], None), ([b"", b'{"pid": 1, "requests": 3}\n'], {"pid": 1, "requests": 3})],
    ids=["then-none", "twice-then-none", "then-its-successor"],
)
def test_a_server_that_closes_without_a_word_is_asked_again(runtime, answers, expected):
    """`server stop` / `status` racing a retiring server: its empty answer is never the report;
    the next connection reaches the server that replaced it, or none."""
    env = _env("on", XDG_RUNTIME_DIR=str(runtime))
    listener = _listening(protocol.socket_path(env))
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(_answer_in_turn, listener, answers)
        assert protocol.control("stop", env) == expected
        assert served.result(timeout=10) == len(answers)


def test_a_server_that_never_answers_is_reported_once_the_wait_is_over(runtime, monkeypatch):
    env = _env("on", XDG_RUNTIME_DIR=str(runtime))
    monkeypatch.setattr(protocol, "_RETIRING_WAIT_S", 0.3)
    listener = _listening(protocol.socket_path(env))
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(_answer_in_turn, listener, [b""] * 1000)
        with pytest.raises(OSError, match=r"^the server answered ''$"):
            protocol.control("status", env)
        assert served.result(timeout=20) >= 2  # asked again before giving up


def test_an_answer_that_is_not_a_report_is_an_error_that_names_it(runtime):
    """`pyree-build server status` against a process on the socket that answers something else:
    exit 1, the answer quoted, and what to do."""
    env = _env("on", XDG_RUNTIME_DIR=str(runtime))
    listener = _listening(protocol.socket_path(env))
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(_answer_in_turn, listener, [b"refused: not now\n"])
        result = _cli("server", "status", env=env)
        assert served.result(timeout=10) == 1
    assert result.returncode == 1, result
    assert "cannot reach the server: the server answered 'refused: not now'" in result.stderr
    assert "pyree-build server stop" in result.stderr  # the fix line
