"""The server serves only callers it is equal to (issue 34): it never imports from the caller's
directory; a caller of other limits, groups or namespaces gets a server of its own; the client
checks who listens before it sends; closed fds 0-2 are /dev/null, never the control socket; a
failing log write and bad settings do not break it; `server status|stop` answer whatever
pyree_build the server runs.

The typed `pyree-build` (the console script beside this Python) is what a new user runs. From a
checkout's root a server started with `python -m` imported the checkout's `pyree_build/` and
refused every later command; a worker put the caller's directory first on sys.path, so a
module there named like a dependency ran in place of it. (Under an editable install the
environment maps `pyree_build` to the checkout itself, so the refusal shows only with a normal
install, as CI's; the shadowing dependency shows under both.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.watched import RUN_ARGS, Watched, plugin_variant

import pyree_build
from pyree_build.client import protocol

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the server is tested on Linux (/proc, SCM_RIGHTS)")

TYPED = Path(sys.executable).with_name("pyree-build")
SHADOWED = ("onnx", "onnxruntime", "numpy", "elftools")


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A socket directory of the test's own; every server in it (one per context the test ran
    commands in) is stopped at the end."""
    path = Path(tempfile.mkdtemp(prefix="rt.", dir="/tmp"))
    yield path
    subprocess.run([sys.executable, "-m", "pyree_build", "server", "stop"], env={**os.environ, "XDG_RUNTIME_DIR": str(path)}, capture_output=True, timeout=60)
    for sock in (path / "pyree_build").glob("s-*.sock"):
        with contextlib.suppress(OSError), protocol.connect(str(sock), timeout=30) as conn:
            protocol.send_request(conn, protocol.encode("stop", [], {}, "/"), [])
            protocol.read_line(conn)
    shutil.rmtree(path, ignore_errors=True)


def _env(runtime: Path, mode: str = "on", **extra: str) -> dict[str, str]:
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYREE_BUILD_SERVER": mode, **extra}


def _sockets(runtime: Path) -> list[Path]:
    return sorted((runtime / "pyree_build").glob("s-*.sock"))


def _sh(script: str, *args: str | os.PathLike[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`sh -c SCRIPT PYTHON ARGS...`: the script runs pyree_build as `"$0" -m pyree_build "$@"`."""
    argv = ["sh", "-c", script, sys.executable, *map(os.fspath, args)]
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _status_pid(env: dict[str, str]) -> int | None:
    report = protocol.control("status", env)
    return None if report is None else int(str(report["pid"]))


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


def _as_a_user_runs(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the tests' PYTHONSAFEPATH (conftest): a user's Python puts the working
    directory first on sys.path, which is what these tests are about."""
    return {k: v for k, v in env.items() if k != "PYTHONSAFEPATH"}


def _marks(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.imported"))


def _typed(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TYPED), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not TYPED.is_file(), reason=f"no console script {TYPED} (pyree_build is not installed into this Python's environment)")
def test_from_a_checkouts_root_nothing_is_refused_and_nothing_there_is_imported(tmp_path, runtime):
    onnx_models = pytest.importorskip("support.onnx_models", reason="onnx is not installed (pip install 'pyree_build[onnx]')")
    root = _checkout(tmp_path / "checkout")
    onnx_models.save(onnx_models.mlp(), root / "m.onnx")
    results = {}
    for mode in ("on", "off"):
        env = _as_a_user_runs({**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYREE_BUILD_SERVER": mode})
        first, second = _typed("--version", cwd=root, env=env), _typed("--version", cwd=root, env=env)
        imported = _typed("import", "m.onnx", "-o", f"m-{mode}.mlir", cwd=root, env=env)
        for result in (first, second, imported):
            assert result.returncode == 0 and "refused" not in result.stderr and "running in this process" not in result.stderr, result
        results[mode] = (first.stdout, imported.stdout.replace(mode, "MODE"))
        assert _marks(root) == [], f"the command imported the caller's directory's files ({mode})"
    assert results["on"] == results["off"]
    assert (root / "m-on.mlir").read_bytes() == (root / "m-off.mlir").read_bytes()
    env = _as_a_user_runs({**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
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
            protocol.BOOT.replace("from pyree_build.server.client import in_process as main", "main = lambda a: print(*a)"),
            os.path.dirname(pyree_build.__file__),
            "cli",
            "x",
        ],
        cwd=root,
        env=_as_a_user_runs(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0 and probe.stdout.strip() == "x", probe
    loader = protocol.BOOT.split("what, sys.argv")[0]
    shown = subprocess.run([sys.executable, "-c", loader + code, os.path.dirname(pyree_build.__file__)], cwd=root, env=_as_a_user_runs(os.environ),
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0 and _marks(root) == [], shown
    assert str(root) not in shown.stdout


def test_server_stop_answers_a_client_of_another_identity(runtime):
    """`server stop` stops this user's server on this socket whatever pyree_build either runs."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYREE_BUILD_SERVER": "on"}
    assert subprocess.run([sys.executable, "-m", "pyree_build", "--version"], env=env, capture_output=True, timeout=120).returncode == 0
    path = protocol.socket_path(env, create=False)
    replies = []
    for kind in ("status", "stop"):
        frame = protocol.encode(kind, [], {}, "/").replace(protocol.identity().encode(), b"/other/python|/other/env|/other/pyree_build")
        frame = len(frame[4:]).to_bytes(4, "little") + frame[4:]
        with protocol.connect(path, timeout=30) as sock:
            protocol.send_request(sock, frame, [])
            replies.append(json.loads(protocol.read_line(sock)))
    assert replies[0]["pid"] == replies[1]["pid"]
    assert replies[0]["identity"] == protocol.identity()
    deadline = time.monotonic() + 30
    while protocol.alive(int(replies[1]["pid"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not protocol.alive(int(replies[1]["pid"]))
    assert protocol.control("status", env) is None


SCRIPT = Path(sys.executable).with_name("pyree-build-py")
_TIMES = re.compile(r"\d+(\.\d+)? ?(s|ms|us)\b")


def _native(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.skipif(not _native(TYPED), reason=f"{TYPED} is not the native client (pyree_build was installed where no C compiler or no Linux was at hand)")
def test_the_typed_pyree_build_is_the_native_client_and_answers_as_the_python_client(tmp_path, runtime, system_module, system_plugin):
    from support.watched import RUN_ARGS

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
    before = protocol.control("status", env)
    assert before is not None, "the typed client started no server"
    assert subprocess.run([str(TYPED), "--version"], env=env, capture_output=True, timeout=60).returncode == 0
    after = protocol.control("status", env)
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
        assert identity.decode() == protocol.identity() and package.decode() == os.path.dirname(pyree_build.__file__)
        assert boot.decode() == protocol.BOOT


_MLIR = PLUGIN_SAMPLE / "example.mlir"
_COMPILE = ["compile", str(_MLIR), "--target", "llvm-cpu", "-o"]


def test_a_server_started_under_a_file_size_limit_serves_no_unlimited_caller(tmp_path, runtime):
    """`(ulimit -f 4; pyree-build --version)` started a server whose workers could write no file
    over 4 KB, and every later command used it: an unlimited caller's build failed. Now each
    gets a server of its own context, and the limited caller keeps its limit, as in process."""
    env = _env(runtime, PYREE_BUILD_CACHE="off")
    limited = 'ulimit -f 4; exec "$0" -m pyree_build "$@"'
    assert _sh(limited, "--version", env=env).returncode == 0
    unlimited = subprocess.run([sys.executable, "-m", "pyree_build", *_COMPILE, tmp_path / "big.vmfb"], env=env, capture_output=True, text=True, timeout=300)
    assert unlimited.returncode == 0, unlimited.stderr
    assert (tmp_path / "big.vmfb").stat().st_size > 4096
    assert len(_sockets(runtime)) == 2, "the unlimited caller was served by the limited caller's server"
    codes = {
        mode: _sh(limited, *_COMPILE, tmp_path / f"small-{mode}.vmfb", env=_env(runtime, mode, PYREE_BUILD_CACHE="off")).returncode for mode in ("on", "off")
    }
    assert codes["on"] == codes["off"] != 0, codes
    assert not (tmp_path / "small-on.vmfb").exists()


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True, text=True, timeout=60)
    return None if probe.returncode == 0 else f"unshare -m with a tmpfs mount is not permitted here: {probe.stderr.strip()}"


@pytest.mark.skipif(not sys.platform.startswith("linux") or _unshare_works() is not None, reason=str(_unshare_works()))
def test_a_private_mount_namespace_gets_its_own_server(tmp_path, runtime):
    """Under `unshare -m`, a source on a private tmpfs was "not found" by the host's server, and
    an output directory bound read-only there was written on the host. Now that caller gets a
    server in its own namespace: the tmpfs source builds, the read-only directory stays empty."""
    env = _env(runtime, PYREE_BUILD_CACHE="off")
    assert subprocess.run([sys.executable, "-m", "pyree_build", "--version"], env=env, capture_output=True, timeout=120).returncode == 0
    host = _status_pid(env)
    private, readonly = tmp_path / "private", tmp_path / "readonly"
    private.mkdir()
    readonly.mkdir()
    script = (
        'mount -t tmpfs none "$1" && cp "$3" "$1/" && mount --bind "$2" "$2" && mount -o remount,bind,ro "$2" || exit 99\n'
        'py="$0"; shift 3\n'
        '"$py" -m pyree_build "$@" "$P/example.mlir" -o "$P/e.vmfb" --target llvm-cpu || exit 1\n'
        'test -s "$P/e.vmfb" || exit 2\n'
        '"$py" -m pyree_build "$@" "$P/example.mlir" -o "$R/e.vmfb" --target llvm-cpu && exit 3\n'
        "exit 0\n"
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'P="$1"; R="$2"; {script}', sys.executable, private, readonly, _MLIR, "compile"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc
    assert "not found" not in proc.stderr
    assert list(private.iterdir()) == [] and list(readonly.iterdir()) == [], "the command wrote onto the host"
    assert len(_sockets(runtime)) == 2 and _status_pid(env) == host


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="changing a process's gid takes root and setpriv(1)")
def test_a_server_started_with_another_gid_serves_no_caller_of_this_gid(tmp_path, runtime):
    """A server started under `sg other` gave every later command's files that group; one of
    other supplementary groups had those groups' rights."""
    env = _env(runtime)
    other = subprocess.run(
        ["setpriv", "--regid", "4242", "--clear-groups", sys.executable, "-m", "pyree_build", "new", tmp_path / "other"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert other.returncode == 0, other.stderr
    mine = subprocess.run([sys.executable, "-m", "pyree_build", "new", tmp_path / "mine"], env=env, capture_output=True, text=True, timeout=120)
    assert mine.returncode == 0, mine.stderr
    assert {p.stat().st_gid for p in (tmp_path / "other").rglob("*")} == {4242}
    assert {p.stat().st_gid for p in (tmp_path / "mine").rglob("*")} == {os.getgid()}
    assert len(_sockets(runtime)) == 2
    # Supplementary groups alone (setgroups, newgrp): a server of their own, holding them.
    status = [sys.executable, "-c", "from pyree_build.client import protocol as p; print(p.control('status')['pid'])"]
    extra = subprocess.run(["setpriv", "--groups", "4243", *status[:1], "-m", "pyree_build", "--version"], env=env, capture_output=True, text=True, timeout=120)
    assert extra.returncode == 0, extra.stderr
    assert len(_sockets(runtime)) == 3
    pid = subprocess.run(["setpriv", "--groups", "4243", *status], env=env, capture_output=True, text=True, timeout=120).stdout.strip()
    groups = [line.split()[1:] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Groups:")][0]
    assert "4243" in groups and str(_status_pid(env)) != pid


_TIMES = re.compile(r"\d+(\.\d+)? ?(s|ms|us)\b")
_CLOSE = {"0": "<&-", "1": ">&-", "2": "2>&-", "012": "<&- >&- 2>&-"}


@pytest.mark.parametrize("closed", list(_CLOSE))
def test_closed_std_fds_are_dev_null_with_and_without_the_server(tmp_path, runtime, system_module, system_plugin, closed):
    """A client with fd 1 closed made its socket there and passed it to the worker as stdout:
    iree-run-module's output came back as "signal numbers" (`Exception in thread client-watch`);
    in process, sys.stdout was None (`AttributeError: 'NoneType' ... flush`)."""
    args = ["run", system_module, *RUN_ARGS, "--plugin", system_plugin, "--expect", "8xf32=12 12 12 12 12 12 12 12"]
    results = {}
    for mode in ("on", "off"):
        got = _sh(f'exec "$0" -m pyree_build "$@" {_CLOSE[closed]}', *args, env=_env(runtime, mode))
        assert got.returncode == 0 and "Traceback" not in got.stderr and "Exception" not in got.stderr, (mode, got)
        results[mode] = (got.returncode, _TIMES.sub("<time>", got.stdout), _TIMES.sub("<time>", got.stderr))
    assert results["on"] == results["off"]


def test_a_killed_client_whose_std_fds_were_closed_ends_its_worker_and_tools_at_once(tmp_path, runtime, system_module):
    """Its worker held the client's own end of the connection (as stdin or stdout), so it never
    saw the client go: the worker and iree-run-module ran on until their timeout."""
    sleeping = plugin_variant(tmp_path, "sleep", "  { extern unsigned int sleep(unsigned int); sleep(120); }")
    argv = ["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh", sys.executable, "-m", "pyree_build", "run", str(system_module), *RUN_ARGS, "--plugin", str(sleeping)]
    watched = Watched(argv, _env(runtime))
    watched.wait_for("iree-run-module")
    os.kill(watched.proc.pid, signal.SIGKILL)
    watched.proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while watched.survivors() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watched.survivors() == []


def _children(pid: int) -> list[int]:
    """The live (not zombie) children of `pid`."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry.name}/stat").read_bytes().rsplit(b")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
                    found.append(int(entry.name))
    return found


def _socket_links(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd") if os.path.isdir(f"/proc/{pid}/fd") else []:
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:"):
                found.add(link)
    return found


def _a_child_holds_a_connection(server: int) -> bool:
    """A worker or spare of `server` holds a socket the server itself does not hold (spares
    inherit the listening and report sockets; an accepted connection is the worker's own)."""
    own = _socket_links(server)
    return any(_socket_links(child) - own for child in _children(server))


def test_a_failing_log_write_keeps_the_server_serving(runtime):
    """The log on a full disk (here /dev/full): the server's first line, and the line `_reap`
    writes for a worker killed by a signal, raised and took the server down."""
    env = _env(runtime)
    path = Path(protocol.socket_path(env))
    os.symlink("/dev/full", path.with_suffix(".log"))
    first = subprocess.run([sys.executable, "-m", "pyree_build", "--version"], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    pid = _status_pid(env)
    assert pid is not None, "no server runs with its log on /dev/full"
    with protocol.connect(str(path), timeout=30):  # a spare takes it and waits for the request
        # Once it has, it holds a socket the server does not (the accepted connection).
        deadline = time.monotonic() + 30
        while not _a_child_holds_a_connection(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _a_child_holds_a_connection(pid), "no spare took the client"
        for child in _children(pid):
            os.kill(child, signal.SIGKILL)  # the worker's end is logged, the spare's replaced
    time.sleep(2.5)  # the server reaps within its next second
    again = subprocess.run([sys.executable, "-m", "pyree_build", "--version"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.startswith("pyree_build "), again.stderr
    assert _status_pid(env) == pid


BAD_IDLE = ("nan", "inf", "-inf", "-1", "0", "1e9", "abc", "0x10", "1_000", "5s")
IDLE_RANGE = "is not a number of seconds in (0, 604800]"


def test_bad_idle_values_are_refused_with_the_range(runtime):
    for value in BAD_IDLE:
        got = subprocess.run(
            [sys.executable, "-m", "pyree_build", "--version"], env=_env(runtime, PYREE_BUILD_SERVER_IDLE=value), capture_output=True, text=True, timeout=60
        )
        assert got.returncode == 1 and got.stdout == "", (value, got)
        assert got.stderr.startswith(f"error: PYREE_BUILD_SERVER_IDLE={value} {IDLE_RANGE}\n  fix: "), (value, got.stderr)
    assert _sockets(runtime) == []
    for value in ("nan", "-1"):
        server = subprocess.run(
            [sys.executable, "-m", "pyree_build.server", "--socket", str(runtime / "x.sock"), "--idle", value], capture_output=True, text=True, timeout=60
        )
        assert server.returncode == 1 and IDLE_RANGE in server.stderr, server
    for value in ("1", " 2.5 ", "1e3", ""):
        assert protocol.idle_seconds({protocol.IDLE_ENV: value}) == (float(value) if value.strip() else protocol.DEFAULT_IDLE_S)


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = subprocess.run(
        [sys.executable, "-m", "pyree_build", "--native-client", tmp_path_factory.mktemp("client")], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr
    return Path(built.stdout.strip())


def test_the_native_client_keys_refuses_and_reads_fds_as_the_python_client(native, tmp_path, runtime, system_module, system_plugin):
    """client/transport.c builds the context, the socket key and the refusals itself: a ulimit'd
    caller reaches the server the Python client keys for that context, bad settings read the
    same, and closed fds 0-2 do not crash it."""
    env = _env(runtime)
    both = 'ulimit -f 64; "$1" --version && "$0" -c "from pyree_build.client import protocol as p; print(p.socket_path())"'
    got = _sh(both, native, env=env)
    assert got.returncode == 0, got
    assert [str(p) for p in _sockets(runtime)] == [got.stdout.splitlines()[-1]]
    for value in BAD_IDLE[:4]:
        python = subprocess.run(
            [sys.executable, "-m", "pyree_build", "--version"], env=_env(runtime, PYREE_BUILD_SERVER_IDLE=value), capture_output=True, text=True, timeout=60
        )
        c = subprocess.run([native, "--version"], env=_env(runtime, PYREE_BUILD_SERVER_IDLE=value), capture_output=True, text=True, timeout=60)
        assert (c.returncode, c.stdout, c.stderr) == (python.returncode, python.stdout, python.stderr), value
    args = ["run", system_module, *RUN_ARGS, "--plugin", system_plugin, "--expect", "8xf32=12 12 12 12 12 12 12 12"]
    expected = subprocess.run([sys.executable, "-m", "pyree_build", *args], env=_env(runtime, "off"), capture_output=True, text=True, timeout=120)
    assert expected.returncode == 0, expected
    for mode in ("on", "off"):
        closed = _sh('exec "$@" <&- >&-', native, *args, env=_env(runtime, mode))
        assert (closed.returncode, _TIMES.sub("", closed.stderr)) == (0, _TIMES.sub("", expected.stderr)), (mode, closed)  # in process, sys.stdout was None
        closed = _sh('exec "$1" --version <&- 2>&- >&-', native, env=_env(runtime, mode))
        assert closed.returncode == 0, (mode, closed)


@pytest.mark.skipif(os.geteuid() != 0, reason="a socket of another uid is made by root (setuid in a child)")
@pytest.mark.parametrize("client", ["python", "native"])
def test_a_socket_served_by_another_uid_is_sent_nothing(tmp_path, runtime, native, client):
    """The socket's peer credentials name its server's uid: a listener of another user gets no
    request (it would get the environment and the terminal's fds); the command runs in process."""
    env = _env(runtime)
    path = protocol.socket_path(env)
    listener = (
        "import os, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.setuid(65534); s.listen(8); print('ready', flush=True)\n"
        "s.settimeout(60); c, _ = s.accept(); c.settimeout(5)\n"
        "data = b''\n"
        "try:\n"
        "    while chunk := c.recv(65536): data += chunk\n"
        "except OSError: pass\n"
        "print(len(data), flush=True)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", listener, path], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "ready"
        argv = [str(native)] if client == "native" else [sys.executable, "-m", "pyree_build"]
        got = subprocess.run([*argv, "--version"], env=env, capture_output=True, text=True, timeout=120)
        received = other.stdout.readline().strip()
    finally:
        other.kill()
        other.wait()
    assert got.returncode == 0 and got.stdout.startswith("pyree_build "), got
    assert f"not using the server: {path} is served by uid 65534, not this user's (0); running in this process" in got.stderr, got.stderr
    assert received == "0", f"the other uid's listener received {received} bytes"


_RAW_CLIENT = """import os, sys
from pyree_build.client import protocol as p
sock = p.connect(sys.argv[1], timeout=60)
p.send_request(sock, p.encode("run", ["--version"], os.environ, "/"), [0, sock.fileno(), 2])
while line := p.read_line(sock):
    print(line, flush=True)
"""


def test_the_server_checks_each_requests_context_and_never_answers_into_its_own_connection(runtime):
    """Whatever the client: one of another context (here a file size limit) reaching this socket
    is refused, naming what differs; one passing its own connection as stdout (an old client
    with fd 1 closed) has /dev/null there, so no output comes back on the control channel."""
    env = _env(runtime)
    assert subprocess.run([sys.executable, "-m", "pyree_build", "--version"], env=env, capture_output=True, timeout=120).returncode == 0
    path = protocol.socket_path(env)
    same = subprocess.run([sys.executable, "-c", _RAW_CLIENT, path], env=env, capture_output=True, text=True, timeout=120)
    assert same.returncode == 0 and re.fullmatch(r"ok \d+\nexit 0\n", same.stdout), same
    other = _sh('ulimit -f 8; exec "$0" -c "$1" "$2"', _RAW_CLIENT, path, env=env)
    assert other.stdout.startswith("refused: the client's process context differs from this server's (Max file size "), other


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(alphabet="0123456789.eE+- \tinfaINx_", max_size=10))
def test_the_native_client_accepts_exactly_the_idle_values_python_accepts(native, runtime, value):
    """client/transport.c parses PYREE_BUILD_SERVER_IDLE itself (strtod on [0-9.eE+-]): the same
    values pass, and a refused one reads the same."""
    try:
        protocol.idle_seconds({protocol.IDLE_ENV: value})
        accepted = True
    except protocol.BadSetting:
        accepted = False
    got = subprocess.run([native, "--version"], env=_env(runtime, PYREE_BUILD_SERVER_IDLE=value), capture_output=True, text=True, timeout=60)
    assert (got.returncode == 0) == accepted, (value, got)
    if not accepted:
        assert got.stderr == protocol.idle_error(value) + "\n", (value, got.stderr)


def _unshare_pid_works() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True, text=True, timeout=60)
    return None if probe.returncode == 0 else f"unshare -p is not permitted here: {probe.stderr.strip()}"


@pytest.mark.skipif(not sys.platform.startswith("linux") or _unshare_pid_works() is not None, reason=str(_unshare_pid_works()))
def test_a_pid_namespace_gets_its_own_server_or_runs_in_process(runtime):
    """With its own /proc (`unshare -p -f --mount-proc`) a caller is served by a server in its
    PID namespace; with the host's /proc, whose numbers are not its namespace's, a server would
    look its clients up as other processes (and refused each command with a note): such a
    caller runs its commands in process, quietly."""
    env = _env(runtime)
    assert subprocess.run([sys.executable, "-m", "pyree_build", "--version"], env=env, capture_output=True, timeout=120).returncode == 0
    script = '"$0" -m pyree_build --version && "$0" -m pyree_build --version && "$0" -m pyree_build server status'
    for flags in (["--mount-proc"], []):
        got = subprocess.run(["unshare", "-p", "-f", *flags, "sh", "-c", script, sys.executable], env=env, capture_output=True, text=True, timeout=300)
        assert got.returncode == 0 and got.stdout.startswith("pyree_build 0.1.0\npyree_build 0.1.0\n"), (flags, got)
        assert "refused" not in got.stderr and "running in this process" not in got.stderr, (flags, got.stderr)
        expected = "server: running\npid: " if flags else "server: none for this process (/proc cannot tell this process's context"
        assert expected in got.stdout, (flags, got.stdout)


@pytest.mark.parametrize("value", ["of", "maybe", "2", "disabled", " OFF ", "On", "", "TRUE"])
def test_a_server_mode_that_is_neither_on_nor_off_is_refused_by_both_clients(native, runtime, value):
    """`PYREE_BUILD_SERVER=of` kept the server on, silently."""
    env = _env(runtime, value)
    python = subprocess.run([sys.executable, "-m", "pyree_build", "--version"], env=env, capture_output=True, text=True, timeout=120)
    c = subprocess.run([native, "--version"], env=env, capture_output=True, text=True, timeout=120)
    assert (c.returncode, c.stdout, c.stderr) == (python.returncode, python.stdout, python.stderr)
    known = value.strip().lower() in ("off", "on", "", "true")
    if known:
        assert python.returncode == 0 and python.stdout.startswith("pyree_build "), python
    else:
        assert python.returncode == 1 and python.stderr.startswith(f"error: PYREE_BUILD_SERVER={value} is neither on nor off\n  fix: "), python
