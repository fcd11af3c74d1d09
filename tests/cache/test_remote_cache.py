"""The remote cache tier against a real HTTP server: Debian's nginx with a WebDAV PUT location
on 127.0.0.1. "Machines" are processes with their own local cache directories sharing one
server: A builds and uploads, B downloads and runs no tool; a server that stops, corrupts a
blob, answers with foreign bytes, hangs, or refuses writes costs a local build and one note."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.plugins import write_plugin

from pyree_build.core.files import parse_depfile

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
TOKEN = "s3cret-token"

NGINX_CONF = """
worker_processes 1;
daemon off;
master_process on;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
{user}
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 1g;
        location /cache/ {{
            root {prefix}/data;
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
        location /auth/ {{
            if ($http_authorization != "Bearer {token}") {{ return 401; }}
            root {prefix}/data;
            dav_methods PUT;
            create_full_put_path on;
        }}
        location /writers/ {{
            root {prefix}/data;
            dav_methods PUT;
            create_full_put_path on;
            set $put_ok "";
            if ($http_authorization = "Bearer {token}") {{ set $put_ok "yes"; }}
            if ($request_method = PUT) {{ set $put_ok "${{put_ok}}put"; }}
            if ($put_ok = "put") {{ return 403; }}
        }}
        location /readonly/ {{
            root {prefix}/data;
        }}
        location /foreign/ {{
            return 200 "<html>please log in</html>";
        }}
    }}
}}
"""


class Nginx:
    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.data = prefix / "data"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        for _ in range(5):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
            conf = self.prefix / "nginx.conf"
            conf.write_text(NGINX_CONF.format(prefix=self.prefix, port=self.port, user=user, token=TOKEN))
            self.proc = subprocess.Popen([NGINX, "-p", str(self.prefix), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        return
                time.sleep(0.02)
            self.stop()  # the port was taken meanwhile: try another
        raise RuntimeError(f"nginx did not start; see {self.prefix / 'error.log'}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # fast shutdown, master and worker
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def url(self, location: str = "cache") -> str:
        return f"http://127.0.0.1:{self.port}/{location}"

    def files(self, location: str = "cache", kind: str = "") -> list[Path]:
        base = self.data / location / kind
        return sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []


@pytest.fixture
def nginx(tmp_path_factory: pytest.TempPathFactory):
    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx; .ci/run installs it when root)")
    prefix = tmp_path_factory.mktemp("nginx")
    (prefix / "data").mkdir()
    server = Nginx(prefix)
    server.start()
    yield server
    server.stop()


def machine(local_cache: Path, remote: str | None, **extra: str) -> dict[str, str]:
    """The environment of one 'machine': its own local cache, and the shared server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYREE_BUILD_REMOTE_CACHE")}
    env["PYREE_BUILD_CACHE"] = str(local_cache)
    if remote:
        env["PYREE_BUILD_REMOTE_CACHE"] = remote
    env.update(extra)
    return env


def build(src: Path, out: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyree_build", "plugin", "-v", src, "-I", src.parent / "include", "-o", out, *flags],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def ran_tools(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The tool command lines -v printed and ran: `(cd DIR && TOOL ...)`, not pyree_build's own
    mkdir/mv steps, nor the recorded lines a cache hit shows with `# (cache hit)`."""
    return [
        line for line in result.stderr.splitlines()
        if line.startswith("(cd ") and not line.endswith("# (cache hit)") and not re.match(r"\(cd .+? && (mkdir|mv) ", line)
    ]  # fmt: skip


def test_machine_b_downloads_what_machine_a_built_and_runs_no_tool(nginx, tmp_path):
    src = write_plugin(tmp_path / "src", "7.0f")
    a = build(src, tmp_path / "a" / "p.so", machine(tmp_path / "cache-a", nginx.url()), "--depfile", tmp_path / "a" / "p.d")
    assert a.returncode == 0, a.stderr
    assert ran_tools(a) and "remote cache hit" not in a.stderr and "note:" not in a.stderr, a.stderr
    assert len(nginx.files(kind="ac")) == 1 and len(nginx.files(kind="cas")) == 1

    b = build(src, tmp_path / "b" / "p.so", machine(tmp_path / "cache-b", nginx.url()), "--depfile", tmp_path / "b" / "p.d")
    assert b.returncode == 0, b.stderr
    assert "remote cache hit" in b.stderr and ran_tools(b) == [], b.stderr
    assert (tmp_path / "b" / "p.so").read_bytes() == (tmp_path / "a" / "p.so").read_bytes()
    # A downloaded plugin's depfile (written with it) names what the build on A read.
    assert set(parse_depfile(tmp_path / "b" / "p.d")) == set(parse_depfile(tmp_path / "a" / "p.d"))

    # B filled its local cache: the next build is a local hit even with the server gone.
    nginx.stop()
    again = build(src, tmp_path / "b2" / "p.so", machine(tmp_path / "cache-b", nginx.url()))
    assert again.returncode == 0 and "  system plugin: cache hit" in again.stderr and "note:" not in again.stderr, again.stderr
    assert (tmp_path / "b2" / "p.so").read_bytes() == (tmp_path / "a" / "p.so").read_bytes()


def test_b_runs_the_plugin_it_downloaded(nginx, tmp_path, system_module):
    src = write_plugin(tmp_path / "src", "3.0f")
    assert build(src, tmp_path / "a.so", machine(tmp_path / "cache-a", nginx.url())).returncode == 0
    b = build(src, tmp_path / "b.so", machine(tmp_path / "cache-b", nginx.url()))
    assert "remote cache hit" in b.stderr, b.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pyree_build", "run", system_module, "--function", "mixed_invocation",
         "--input", "8xf32=2", "--input", "8xf32=4", "--plugin", tmp_path / "b.so"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0 and "8xf32=28 28 28" in run.stdout, run.stdout + run.stderr


SERVER_STOPS_MID_BUILD = r"""
import os, signal, socket, sys, time
from pathlib import Path
import pyree_build as pb
src, out, pid, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
inc = [str(src.parent / "include")]
pb.plugin([src], out / "first.so", include_dirs=inc)            # on the server: a remote hit
os.kill(pid, signal.SIGTERM)                                    # the server goes away mid-build
while socket.socket().connect_ex(("127.0.0.1", port)) == 0:
    time.sleep(0.02)
pb.plugin([src], out / "second.so", include_dirs=inc, defines=["EXTRA=1"])   # built here
pb.plugin([src], out / "third.so", include_dirs=inc, defines=["EXTRA=2"])    # built here
print("done")
"""


def test_server_stopped_mid_build_builds_locally_with_one_note(nginx, tmp_path):
    src = write_plugin(tmp_path / "src", "5.0f")
    assert build(src, tmp_path / "a.so", machine(tmp_path / "cache-a", nginx.url())).returncode == 0
    out = tmp_path / "b"
    proc = subprocess.run(
        [sys.executable, "-c", SERVER_STOPS_MID_BUILD, src, out, str(nginx.proc.pid), str(nginx.port)],
        env=machine(tmp_path / "cache-b", nginx.url()), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    assert "remote cache hit" in proc.stderr, proc.stderr
    assert proc.stderr.count("note: remote cache") == 1 and "unavailable" in proc.stderr, proc.stderr
    assert (out / "first.so").read_bytes() == (tmp_path / "a.so").read_bytes()
    for name in ("second.so", "third.so"):
        assert (out / name).stat().st_size > 0

    # Later steps of the same build skip the server instead of each paying for it.
    later = build(src, tmp_path / "c.so", machine(tmp_path / "cache-b", nginx.url()), "-D", "EXTRA=3")
    assert later.returncode == 0 and "skipped, unavailable" in later.stderr and "note:" not in later.stderr, later.stderr


def test_a_corrupted_blob_is_detected_and_rebuilt_locally(nginx, tmp_path):
    src = write_plugin(tmp_path / "src", "9.0f")
    assert build(src, tmp_path / "a.so", machine(tmp_path / "cache-a", nginx.url())).returncode == 0
    (blob,) = nginx.files(kind="cas")
    good = blob.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same size, one byte flipped
    blob.write_bytes(bytes(bad))

    b = build(src, tmp_path / "b.so", machine(tmp_path / "cache-b", nginx.url()))
    assert b.returncode == 0, b.stderr
    assert "remote cache hit" not in b.stderr and ran_tools(b), b.stderr
    assert b.stderr.count("note: remote cache") == 1 and "does not match its hash" in b.stderr, b.stderr
    assert (tmp_path / "b.so").read_bytes() == (tmp_path / "a.so").read_bytes() == good
    assert blob.read_bytes() == good  # B's upload repaired the server's copy

    blob.write_bytes(good[:100])  # truncated
    c = build(src, tmp_path / "c.so", machine(tmp_path / "cache-c", nginx.url()))
    assert c.returncode == 0 and "does not match its hash" in c.stderr and (tmp_path / "c.so").read_bytes() == good, c.stderr


def test_a_garbage_record_is_ignored(nginx, tmp_path):
    src = write_plugin(tmp_path / "src", "11.0f")
    assert build(src, tmp_path / "a.so", machine(tmp_path / "cache-a", nginx.url())).returncode == 0
    (record,) = nginx.files(kind="ac")
    record.write_bytes(b'{"format": "pyree_build.remote.v1", "entries": [{"deps": {}, "outputs": [{"sha256": "../../etc/passwd", "size": 5}]}]}')
    b = build(src, tmp_path / "b.so", machine(tmp_path / "cache-b", nginx.url()))
    assert b.returncode == 0 and "names no dependency (ignored)" in b.stderr and ran_tools(b), b.stderr  # never a hit
    assert (tmp_path / "b.so").read_bytes() == (tmp_path / "a.so").read_bytes()


def test_foreign_answers_are_never_used(nginx, tmp_path):
    """A server that answers 200 with a login page for every path, as a misrouted proxy does."""
    src = write_plugin(tmp_path / "src", "13.0f")
    env = machine(tmp_path / "cache-a", nginx.url("foreign"))
    a = build(src, tmp_path / "a.so", env)
    assert a.returncode == 0 and ran_tools(a), a.stderr
    assert a.stderr.count("note: remote cache") == 1 and "not a pyree_build record" in a.stderr, a.stderr
    # The 'upload' was answered 200 too; a second machine still gets nothing from it.
    b = build(src, tmp_path / "b.so", machine(tmp_path / "cache-b", nginx.url("foreign")))
    assert b.returncode == 0 and ran_tools(b) and "not a pyree_build record" in b.stderr, b.stderr
    assert (tmp_path / "b.so").read_bytes() == (tmp_path / "a.so").read_bytes()


def test_read_only_client_uses_hits_and_uploads_nothing(nginx, tmp_path):
    src = write_plugin(tmp_path / "src", "15.0f")
    reader = machine(tmp_path / "cache-r", nginx.url(), PYREE_BUILD_REMOTE_CACHE_MODE="read")
    r = build(src, tmp_path / "r.so", reader)
    assert r.returncode == 0 and ran_tools(r) and "note:" not in r.stderr, r.stderr
    assert nginx.files() == []  # nothing uploaded

    assert build(src, tmp_path / "a.so", machine(tmp_path / "cache-a", nginx.url())).returncode == 0
    before = nginx.files()
    r2 = build(src, tmp_path / "r2.so", machine(tmp_path / "cache-r2", nginx.url(), PYREE_BUILD_REMOTE_CACHE_MODE="read"))
    assert "remote cache hit" in r2.stderr and (tmp_path / "r2.so").read_bytes() == (tmp_path / "a.so").read_bytes()
    r3 = build(src, tmp_path / "r3.so", reader, "-D", "OTHER=1")
    assert r3.returncode == 0 and ran_tools(r3)
    assert nginx.files() == before


def test_bearer_token_is_sent_and_a_missing_one_is_one_note(nginx, tmp_path):
    src = write_plugin(tmp_path / "src", "17.0f")
    with_token = machine(tmp_path / "cache-a", nginx.url("auth"), PYREE_BUILD_REMOTE_CACHE_TOKEN=TOKEN)
    assert build(src, tmp_path / "a.so", with_token).returncode == 0
    assert len(nginx.files("auth", "cas")) == 1
    b = build(src, tmp_path / "b.so", machine(tmp_path / "cache-b", nginx.url("auth"), PYREE_BUILD_REMOTE_CACHE_TOKEN=TOKEN))
    assert "remote cache hit" in b.stderr, b.stderr
    c = build(src, tmp_path / "c.so", machine(tmp_path / "cache-c", nginx.url("auth")))
    assert c.returncode == 0 and ran_tools(c) and c.stderr.count("note: remote cache") == 1 and "HTTP 401" in c.stderr, c.stderr
    assert TOKEN not in c.stderr + b.stderr


def test_concurrent_uploads_of_the_same_key(nginx, tmp_path):
    src = write_plugin(tmp_path / "src", "19.0f")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pyree_build", "plugin", src, "-I", src.parent / "include", "-o", tmp_path / f"{i}.so"],
            env=machine(tmp_path / f"cache-{i}", nginx.url()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "note:" not in err, err
    outputs = {(tmp_path / f"{i}.so").read_bytes() for i in range(4)}
    assert len(outputs) == 1
    assert len(nginx.files(kind="ac")) == 1 and len(nginx.files(kind="cas")) == 1
    late = build(src, tmp_path / "late.so", machine(tmp_path / "cache-late", nginx.url()))
    assert "remote cache hit" in late.stderr and ran_tools(late) == [], late.stderr
    assert (tmp_path / "late.so").read_bytes() in outputs


def test_a_hanging_server_times_out_into_a_local_build(tmp_path):
    """A server that accepts the connection and never answers: the timeout bounds the wait."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/cache"
        src = write_plugin(tmp_path / "src", "21.0f")
        env = machine(tmp_path / "cache", url, PYREE_BUILD_REMOTE_CACHE_TIMEOUT="0.5")
        result = build(src, tmp_path / "a.so", env)
        assert result.returncode == 0 and ran_tools(result), result.stderr
        assert result.stderr.count("note: remote cache") == 1 and "timed out" in result.stderr, result.stderr
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


def test_malformed_settings_are_a_note_not_a_failure(tmp_path):
    src = write_plugin(tmp_path / "src", "23.0f")
    result = build(src, tmp_path / "a.so", machine(tmp_path / "cache", "ftp://example.invalid/x"))
    assert result.returncode == 0 and "remote cache not used" in result.stderr and "http(s)://" in result.stderr, result.stderr


def _requests(server: Nginx, method: str) -> list[str]:
    log = server.prefix / "access.log"
    return [line for line in log.read_text().splitlines() if f'"{method} ' in line] if log.exists() else []


def test_cmake_cache_variable_shares_a_downstream_build(nginx, tmp_path):
    """PYREE_BUILD_REMOTE_CACHE set at configure time reaches every action; machine B's whole
    build (plugin and module) comes from the server: it uploads nothing, so it built nothing."""
    from support.cmake_projects import cmake_run, ctest_run, write_downstream

    from pyree_build.cli import cmake_dir
    from pyree_build.core import toolchain

    src = tmp_path / "src"
    write_downstream(src, scale=6)
    outputs = {}
    for name in ("a", "b"):
        env = machine(tmp_path / f"cache-{name}", None)
        build_dir = tmp_path / f"build-{name}"
        configure = cmake_run(
            "-G", "Ninja", "-S", src, "-B", build_dir, f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}",
            f"-Dpyree_build_DIR={cmake_dir()}", f"-DPYREE_BUILD_PYTHON={sys.executable}",
            f"-DPYREE_BUILD_REMOTE_CACHE={nginx.url()}", env=env,
        )  # fmt: skip
        assert configure.returncode == 0, configure.stdout + configure.stderr
        puts_before = len(_requests(nginx, "PUT"))
        built = cmake_run("--build", build_dir, env=env)
        assert built.returncode == 0 and "note:" not in built.stdout, built.stdout + built.stderr
        puts = len(_requests(nginx, "PUT")) - puts_before
        if name == "a":
            assert puts >= 4, puts  # a blob and a record for each of the two actions
        else:
            assert puts == 0, _requests(nginx, "PUT")
        outputs[name] = [(build_dir / f).read_bytes() for f in ("my_plugin.so", "my_module.vmfb")]
        tested = ctest_run(build_dir, "--output-on-failure")
        assert tested.returncode == 0, tested.stdout
    assert outputs["a"] == outputs["b"]


def test_a_server_refusing_writes_keeps_its_hits(nginx, tmp_path):
    """A location without PUT (405): the client says so once, builds, and still reads."""
    src = write_plugin(tmp_path / "src", "25.0f")
    assert build(src, tmp_path / "a.so", machine(tmp_path / "cache-a", nginx.url())).returncode == 0
    shutil.copytree(nginx.data / "cache", nginx.data / "readonly")
    ro = nginx.url("readonly")
    b = build(src, tmp_path / "b.so", machine(tmp_path / "cache-b", ro))
    assert "remote cache hit" in b.stderr and "note:" not in b.stderr, b.stderr
    c = build(src, tmp_path / "c.so", machine(tmp_path / "cache-c", ro), "-D", "NEW=1")
    assert c.returncode == 0 and ran_tools(c), c.stderr
    assert c.stderr.count("note: remote cache") == 1 and "upload refused (HTTP 405)" in c.stderr, c.stderr


def test_the_readme_server_open_reads_token_writes(nginx, tmp_path):
    """The README's nginx location: anyone reads, only the token holder writes."""
    src = write_plugin(tmp_path / "src", "27.0f")
    writer = machine(tmp_path / "cache-w", nginx.url("writers"), PYREE_BUILD_REMOTE_CACHE_TOKEN=TOKEN)
    assert build(src, tmp_path / "w.so", writer).returncode == 0
    anyone = machine(tmp_path / "cache-r", nginx.url("writers"))
    r = build(src, tmp_path / "r.so", anyone)
    assert "remote cache hit" in r.stderr and "note:" not in r.stderr, r.stderr
    other = build(src, tmp_path / "o.so", anyone, "-D", "MINE=1")
    assert other.returncode == 0 and "upload refused (HTTP 403)" in other.stderr, other.stderr
    assert len(nginx.files("writers", "ac")) == 1


def test_a_token_http_cannot_send_is_a_note_not_a_failure(nginx, tmp_path):
    src = write_plugin(tmp_path / "src", "29.0f")
    env = machine(tmp_path / "cache", nginx.url(), PYREE_BUILD_REMOTE_CACHE_TOKEN="bad\ntoken")
    result = build(src, tmp_path / "a.so", env)
    assert result.returncode == 0 and ran_tools(result), result.stderr
    assert result.stderr.count("note: remote cache") == 1 and "Traceback" not in result.stderr, result.stderr
