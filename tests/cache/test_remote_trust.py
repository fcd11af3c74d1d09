"""Issue 35 items 4 and 5, issue 44 item 4: what the remote cache tier takes from a server.

A stand-in server (Python's http.server on 127.0.0.1, GET and PUT of whole files, as nginx
WebDAV and bazel-remote serve them) is either honest or hostile: the hostile one answers every
record with one it made up. A record without dependencies, one that leaves out the inputs, or
bytes that are not what the step makes (an HTML page, an object for another machine) are never
a hit, never written and never stored locally; with PYREE_BUILD_REMOTE_CACHE_KEY only records
signed with that secret are used. A remote hit is stored locally from its private files, not
from the final paths that another process may rewrite.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, REPO

from pyree_build.core import toolchain

SOURCE = "int pyree_value(int x) { return x * VALUE; }\n"


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, bytes] = {}
        self.forged: bytes | None = None  # when set, the answer to every record GET
        self.asked: list[str] = []  # every GET, in order
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/cache"


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        name = self.path.removeprefix("/cache/")
        with self.server.lock:
            self.server.asked.append(name)
            data = self.server.forged if name.startswith("ac/") and self.server.forged is not None else self.server.files.get(name)
        self.send_response(200 if data is not None else 404)
        self.send_header("Content-Length", str(len(data or b"")))
        self.end_headers()
        self.wfile.write(data or b"")

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.files[self.path.removeprefix("/cache/")] = body
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    thread = threading.Thread(target=s.serve_forever, daemon=True)
    thread.start()
    yield s
    s.shutdown()
    s.server_close()


def _env(cache: Path, remote: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYREE_BUILD_REMOTE_CACHE")}
    env.update(PYREE_BUILD_CACHE=str(cache), PYREE_BUILD_SERVER="off", PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
    if remote:
        env["PYREE_BUILD_REMOTE_CACHE"] = remote
    env.update(extra)
    return env


def _objects(src: Path, out: Path, env: dict[str, str], arch: str = "x86_64") -> tuple[bytes, str]:
    result = subprocess.run(
        [sys.executable, "-m", "pyree_build", "objects", src, "--arch", arch, "-o", out],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return (out / f"{src.stem}_{arch}.o").read_bytes(), result.stderr


def _source(directory: Path, value: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "k.c"
    src.write_text(f"#define VALUE {value}\n" + SOURCE)
    return src


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _forge(server: Server, deps: dict[str, str], blob: bytes, secret: bytes | None = None, key: str = "") -> None:
    """Make the server answer every record with one entry: `deps`, and `blob` as the output."""
    server.files[f"cas/{_sha(blob)}"] = blob
    entries = [{"deps": deps, "outputs": [{"sha256": _sha(blob), "size": len(blob), "exec": False}]}]
    doc: dict[str, object] = {"format": "pyree_build.remote.v1", "entries": entries}
    if secret is not None:
        message = json.dumps({"key": key, "entries": entries}, sort_keys=True, separators=(",", ":")).encode()
        doc["mac"] = hmac.new(secret, message, hashlib.sha256).hexdigest()
    server.forged = json.dumps(doc).encode()


def test_an_honest_server_still_gives_hits(server, tmp_path):
    src = _source(tmp_path / "src", 3)
    built, _ = _objects(src, tmp_path / "a", _env(tmp_path / "cache-a", server.url))
    fetched, log = _objects(src, tmp_path / "b", _env(tmp_path / "cache-b", server.url))
    assert fetched == built and "remote cache hit" in log, log


def _hostile_records(src: Path, other_arch_object: bytes) -> dict[str, tuple[dict[str, str], bytes]]:
    real = {str(src.resolve()): _sha(src.read_bytes())}
    package = {str(Path(toolchain.__file__).resolve()): _sha(Path(toolchain.__file__).read_bytes())}
    return {
        "no dependencies": ({}, other_arch_object),
        "the inputs left out": (package, other_arch_object),
        "an HTML page": (real, b"<html>please log in</html>"),
        "an object for another machine": (real, other_arch_object),
    }


@pytest.mark.parametrize("kind", ["no dependencies", "the inputs left out", "an HTML page", "an object for another machine"])
def test_a_hostile_record_is_never_a_hit_nor_stored(server, tmp_path, kind):
    src = _source(tmp_path / "src", 5)
    aarch64, _ = _objects(src, tmp_path / "arm", _env(tmp_path / "cache-arm", None), arch="aarch64")
    deps, blob = _hostile_records(src, aarch64)[kind]
    _forge(server, deps, blob)
    out, log = _objects(src, tmp_path / "b", _env(tmp_path / "cache-b", server.url))
    assert "remote cache hit" not in log, log
    assert out == _objects(src, tmp_path / "c", _env(tmp_path / "off", None))[0]
    # Nothing of it was stored: with the remote off, the local cache gives the right bytes.
    again, log = _objects(src, tmp_path / "d", _env(tmp_path / "cache-b", None))
    assert again == out, log


def test_with_a_shared_key_an_unsigned_record_of_well_formed_bytes_is_refused(server, tmp_path):
    """Without a key a writer can make a hit of other well-formed bytes for your inputs (the
    README says so); with PYREE_BUILD_REMOTE_CACHE_KEY, only a holder of the key can."""
    src = _source(tmp_path / "src", 7)
    other, _ = _objects(_source(tmp_path / "other", 9), tmp_path / "o", _env(tmp_path / "cache-o", None))
    _forge(server, {str(src.resolve()): _sha(src.read_bytes())}, other)
    unsigned, log = _objects(src, tmp_path / "a", _env(tmp_path / "cache-a", server.url))
    assert "remote cache hit" in log and unsigned == other, log  # the documented limit without a key
    keyed, log = _objects(src, tmp_path / "b", _env(tmp_path / "cache-b", server.url, PYREE_BUILD_REMOTE_CACHE_KEY="team secret"))
    assert "remote cache hit" not in log and "not signed" in log, log
    assert keyed == _objects(src, tmp_path / "c", _env(tmp_path / "off", None))[0]


def test_signed_records_are_hits_for_holders_of_the_key_only(server, tmp_path):
    src = _source(tmp_path / "src", 11)
    signed = {"PYREE_BUILD_REMOTE_CACHE_KEY": "team secret"}
    built, _ = _objects(src, tmp_path / "a", _env(tmp_path / "cache-a", server.url, **signed))
    fetched, log = _objects(src, tmp_path / "b", _env(tmp_path / "cache-b", server.url, **signed))
    assert fetched == built and "remote cache hit" in log, log
    _, log = _objects(src, tmp_path / "c", _env(tmp_path / "cache-c", server.url, PYREE_BUILD_REMOTE_CACHE_KEY="another"))
    assert "remote cache hit" not in log, log


def test_a_remote_hit_is_stored_from_its_own_files_not_the_shared_outputs(server, tmp_path, monkeypatch):
    """Another process rewrites the output while the hit is being stored: the local entry
    still holds the server's bytes (on main it held whatever the output path held then)."""
    from pyree_build.backends.llvm_cpu import plugins
    from pyree_build.cache import local, remote

    src = _source(tmp_path / "src", 13)
    built, _ = _objects(src, tmp_path / "a", _env(tmp_path / "cache-a", server.url))
    out = tmp_path / "b"
    real_store = local._store

    def store_while_rewritten(root, base, paths, deps):  # type: ignore[no-untyped-def]
        (out / "k_x86_64.o").write_bytes(b"written by another process")
        return real_store(root, base, paths, deps)

    for name, value in _env(tmp_path / "cache-b", server.url).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(local, "_store", store_while_rewritten)
    remote._CONFIGURED.clear()
    plugins.objects(src, out, archs=["x86_64"])
    assert (out / "k_x86_64.o").read_bytes() == built
    monkeypatch.setattr(local, "_store", real_store)
    monkeypatch.delenv("PYREE_BUILD_REMOTE_CACHE")
    again, log = _objects(src, tmp_path / "c", _env(tmp_path / "cache-b", None))
    assert again == built and "cache hit" in log, log


@pytest.mark.parametrize("mode", ["readwrite", "read"])
def test_a_record_cannot_probe_a_local_file(server, tmp_path, mode):
    """Issue 44 item 4: a record whose dependencies name a file the build does not read, with
    the hash of a guess at its content, is refused whatever the file holds: no hit and no blob
    asked for, so the server cannot learn whether the guess was right (on main a right guess
    was a hit, a wrong one a miss)."""
    src = _source(tmp_path / "src", 17)
    secret = tmp_path / "home" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("hunter2")
    honest, _ = _objects(src, tmp_path / "honest", _env(tmp_path / "cache-honest", None))
    outcomes = []
    for guess in ("hunter2", "letmein"):
        _forge(server, {str(src.resolve()): _sha(src.read_bytes()), str(secret): _sha(guess.encode())}, honest)
        server.asked.clear()
        _, log = _objects(src, tmp_path / guess, _env(tmp_path / f"cache-{guess}", server.url, PYREE_BUILD_REMOTE_CACHE_MODE=mode))
        outcomes.append(("remote cache hit" in log, [a for a in server.asked if a.startswith("cas/")]))
        assert "not an input of this build" in log, log
    assert outcomes == [(False, []), (False, [])], outcomes


_OPENED: list[str] = []
_WATCHING: list[bool] = []


def _audit(event: str, args: tuple) -> None:  # type: ignore[type-arg]
    if _WATCHING and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


def test_a_foreign_dependency_is_never_opened(server, tmp_path, monkeypatch):
    """The file a hostile record names is not even opened (Python's audit hook sees every
    open), while the build's own source is: the refusal comes before any hash."""
    from pyree_build.backends.llvm_cpu import plugins
    from pyree_build.cache import remote

    src = _source(tmp_path / "src", 19)
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    honest, _ = _objects(src, tmp_path / "honest", _env(tmp_path / "cache-honest", None))
    _forge(server, {str(src.resolve()): _sha(src.read_bytes()), str(secret): _sha(b"hunter2")}, honest)
    for name, value in _env(tmp_path / "cache", server.url).items():
        monkeypatch.setenv(name, value)
    remote._CONFIGURED.clear()
    if not hasattr(sys, "_pyree_test_audit"):
        sys.addaudithook(_audit)  # hooks cannot be removed: this one records only while watched
        sys._pyree_test_audit = True  # type: ignore[attr-defined]
    _OPENED.clear()
    _WATCHING.append(True)
    try:
        plugins.objects(src, tmp_path / "out", archs=["x86_64"])
    finally:
        _WATCHING.clear()
    assert str(secret) not in _OPENED
    assert str(src.resolve()) in _OPENED and not [a for a in server.asked if a.startswith("cas/")]


SAMPLES = REPO / "samples" / "custom_dispatch"
# verb -> (sample file, argv after it; {out} is the output directory): each step's own check
# must accept what the step really makes, or every honest remote hit would be refused.
STEPS = {
    "compile": (SAMPLES / "cpu" / "plugin" / "example.mlir", ["compile", "--target", "llvm-cpu", "-o", "{out}/m.vmfb"]),
    "ptx": (SAMPLES / "cuda" / "kernels" / "kernels.cu", ["ptx", "--sm", "80", "--sm", "75", "-o", "{out}"]),
    "bitcode": (SAMPLES / "cuda" / "ukernel" / "ukernel.cu", ["bitcode", "--sm", "80", "-o", "{out}"]),
    "hsaco": (SAMPLES / "hip" / "kernels" / "kernels.cu", ["hsaco", "--gfx", "942", "--gfx", "1100", "-o", "{out}"]),
    "spirv": (SAMPLES / "vulkan" / "shaders" / "simple_mul.glsl", ["spirv", "-o", "{out}"]),
    "system plugin": (SAMPLES / "cpu" / "plugin" / "system_plugin.c", ["plugin", "--kind", "system", "-o", "{out}/p.so"]),
    "standalone FatELF": (
        SAMPLES / "cpu" / "plugin" / "standalone_plugin.c",
        ["plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", "-o", "{out}/p.sos"],
    ),
}


def _step(verb: str, out: Path, env: dict[str, str]) -> tuple[dict[str, bytes], str]:
    source, argv = STEPS[verb]
    args = [a.replace("{out}", str(out)) for a in argv]
    result = subprocess.run([sys.executable, "-m", "pyree_build", args[0], source, *args[1:]], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and not p.name.startswith(".")}, result.stderr


@pytest.mark.parametrize("verb", sorted(STEPS))
def test_every_steps_check_accepts_what_the_step_makes(server, tmp_path, verb):
    built, _ = _step(verb, tmp_path / "a", _env(tmp_path / "cache-a", server.url))
    fetched, log = _step(verb, tmp_path / "b", _env(tmp_path / "cache-b", server.url))
    assert "remote cache hit" in log and "not what" not in log, log
    assert fetched == built
    modes = {name: [os.stat(tmp_path / side / name).st_mode & 0o777 for side in ("a", "b")] for name in built}
    assert all(a == b for a, b in modes.values()), modes  # a plugin stays executable


def test_each_check_refuses_the_neighbouring_kind(tmp_path):
    """The checks tell apart what a hostile record could swap in: PTX of another sm, a code
    object of another gfx, a module that is not one, an object of another machine."""
    from pyree_build.backends.cuda import ptx
    from pyree_build.backends.hip import hsaco
    from pyree_build.backends.llvm_cpu import plugins
    from pyree_build.core import formats
    from pyree_build.core.errors import PyreeError

    built, _ = _step("ptx", tmp_path / "ptx", _env(tmp_path / "cache", None))
    sm75 = tmp_path / "ptx" / next(n for n in built if n.endswith("sm_75.ptx"))
    ptx._check_ptx([75], [sm75])
    with pytest.raises(PyreeError, match="not sm_80"):
        ptx._check_ptx([80], [sm75])
    with pytest.raises(PyreeError, match="not an IREE module"):
        formats.require_vmfb(sm75)
    _step("hsaco", tmp_path / "co", _env(tmp_path / "cache", None))
    with pytest.raises(PyreeError, match="not gfx942"):
        hsaco._check_objects(["gfx942"], [tmp_path / "co" / "gfx1100" / "kernels.co"])
    _objects(_source(tmp_path / "src", 3), tmp_path / "o", _env(tmp_path / "cache", None), arch="aarch64")
    with pytest.raises(PyreeError, match="for machine 183, not ET_REL for machine 62"):
        plugins._check_objects(["x86_64"], [tmp_path / "o" / "k_aarch64.o"])
