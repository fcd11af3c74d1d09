"""The second cache tier: a shared HTTP server holding content-addressed blobs.

The protocol is the one bazel-remote, ccache's HTTP storage and a plain nginx WebDAV
location all serve: `GET` and `PUT` of whole files under one base URL.

    <url>/cas/<sha256>   the bytes of one output, named by their SHA-256
    <url>/ac/<sha256>    a small JSON action record for one local-cache key (named by the
                         key's SHA-256, as bazel-remote requires): the dependency
                         sets seen so far, each with the SHA-256 (and size, mode) of every
                         output in order

Nothing fetched is trusted before it is checked: a record must parse into the expected
shape, each entry must name dependencies (every input known before the build among them),
its dependency set must match this machine's files (the caller decides how), every blob
must hash to the name it was asked for, and the caller checks each output is what the step
makes (a PTX for the sm, an ELF of the arch, a module) before it is renamed into place or
stored locally. A server that is down, slow, refuses, or answers with wrong bytes turns into
a local build and one note on stderr per process; it never fails a build.

What is left is trust in whoever can write to the server: a record that passes these checks
can still name other, well-formed bytes than the inputs would make (another kernel for the
same sm). With PYREE_BUILD_REMOTE_CACHE_KEY set, every record is signed (HMAC-SHA256 over
the record's key and entries with that shared secret) and records without a valid signature
are ignored, so only holders of the secret can make a hit; the server itself can then only
withhold entries, never choose bytes.

Only the standard library is used, and the module is imported only when a remote is set.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyree_build.core import echo, files
from pyree_build.core.records import record

URL_ENV = "PYREE_BUILD_REMOTE_CACHE"
TOKEN_ENV = "PYREE_BUILD_REMOTE_CACHE_TOKEN"  # sent as `Authorization: Bearer <token>`
AUTH_ENV = "PYREE_BUILD_REMOTE_CACHE_AUTH"  # `user:password`, sent as basic auth
MODE_ENV = "PYREE_BUILD_REMOTE_CACHE_MODE"  # `readwrite` (default) or `read`
TIMEOUT_ENV = "PYREE_BUILD_REMOTE_CACHE_TIMEOUT"  # seconds per socket operation (a whole request: see _deadline_s)
KEY_ENV = "PYREE_BUILD_REMOTE_CACHE_KEY"  # a shared secret: records are signed, unsigned ones ignored

DEFAULT_TIMEOUT = 3.0
RECORD_FORMAT = "pyree_build.remote.v1"
_MAX_ENTRIES = 8  # dependency sets kept per record, newest last
_MAX_RECORD = 1 << 20
_MAX_BLOB = 1 << 30
_SLOWEST_BYTES_PER_S = 256 * 1024
# After a failure, other processes of the same build skip the server this long instead of
# each paying a timeout (the marker lives in the local cache directory).
_BACKOFF_S = 60.0
_BACKOFF_FILE = "remote-unavailable"


def shown_url(url: str) -> str:
    """`url` as a message may show it: everything from `//` to the last `@` (a user and a
    password, even one holding `@`, `/` or `?`) replaced by `***`, however malformed the rest
    is. A path or query holding `@` is cut too: a message loses a little, never a secret."""
    scheme, sep, rest = url.partition("//")
    at = rest.rfind("@")
    return url if not sep or at < 0 else f"{scheme}//***@{rest[at + 1 :]}"


def _hex64(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


class RemoteCache:
    """One configured server. Every method swallows the server's failures: a failure
    disables the remote for the rest of the process and prints one note."""

    def __init__(self, url: str, *, token: str | None = None, auth: str | None = None, read_only: bool = False,
                 timeout: float = DEFAULT_TIMEOUT, state_dir: Path | None = None, secret: bytes | None = None) -> None:  # fmt: skip
        malformed = ValueError(f"{URL_ENV} must be http(s)://host[:port]/path, not {shown_url(url)!r}")
        try:  # urlsplit's own messages may quote a piece of the password (as a port, say): never shown
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise malformed from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise malformed
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port
        self.prefix = parts.path.rstrip("/")
        # Shown in notes: never the credentials.
        self.display = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{self.prefix}"
        self.headers = {"User-Agent": "pyree_build"}
        if parts.username is not None and auth is None:
            auth = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif auth:
            self.headers["Authorization"] = "Basic " + base64.b64encode(auth.encode("utf-8")).decode("ascii")
        self.read_only = read_only
        self.secret = secret  # records signed with it, and only signed records used
        self.timeout = timeout
        self.state_dir = state_dir
        self.disabled = False
        self._upload_disabled = False
        self._noted: set[str] = set()
        self._conn: http.client.HTTPConnection | None = None
        self._records: dict[str, list[dict[str, Any]]] = {}  # records read by this process, for the merge on upload
        self.hits = 0

    # --- transport --------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        return self._conn

    def _request(self, method: str, path: str, body: bytes | None = None, limit: int = _MAX_BLOB) -> tuple[int, bytes]:
        """One request, bounded as a whole: the socket timeout bounds each wait, and a server
        that sends a byte now and then (never idle that long) still meets the request's
        deadline, when its socket is shut (see _deadline_s). Raises OSError on any failure."""
        budget = self._deadline_s(len(body) if body is not None else limit)
        done, expired = threading.Event(), threading.Event()

        def watch() -> None:
            if done.wait(budget):
                return
            expired.set()
            while not done.is_set():  # again until the request ends: a socket may open after the first try
                sock = self._conn.sock if self._conn is not None else None
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns: the request ends here
                done.wait(0.05)

        watchdog = threading.Thread(target=watch, name="pyree_build-remote-deadline", daemon=True)
        watchdog.start()
        try:
            answer = self._request_once(method, path, body, limit)
        except OSError:
            if not expired.is_set():
                raise
        finally:
            done.set()
        if expired.is_set():  # a read cut short by the shut socket may look like a short answer
            self._drop_connection()
            raise OSError(f"{method} {path}: no whole answer within {budget:.3g} s")
        return answer

    def _deadline_s(self, size: int) -> float:
        """The whole request's bound: the socket timeout plus the time its bytes take at the
        slowest rate a cache is worth using at (slower, building locally is as quick)."""
        return self.timeout + size / _SLOWEST_BYTES_PER_S

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def _request_once(self, method: str, path: str, body: bytes | None, limit: int) -> tuple[int, bytes]:
        """One request on the kept-alive connection; a connection the server closed is
        reopened once."""
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, f"{self.prefix}/{path}", body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read(limit + 1)
                if len(data) > limit:
                    conn.close()
                    self._conn = None
                    raise OSError(f"{method} {path}: answer larger than {limit} bytes")
                if resp.will_close:
                    conn.close()
                    self._conn = None
                return resp.status, data
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                self._conn = None
                if attempt:  # a kept-alive connection the server had closed: retry once
                    raise
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._conn = None
                if isinstance(exc, OSError):
                    raise
                raise OSError(f"{type(exc).__name__}: {exc}") from None
        raise OSError("unreachable")

    def note(self, kind: str, message: str) -> None:
        """Say once per process (per kind) that the remote was not used, and why."""
        if kind in self._noted:
            return
        self._noted.add(kind)
        print(f"pyree_build: note: remote cache {self.display}: {message}; building locally", file=sys.stderr, flush=True)

    def _fail(self, exc: BaseException | str) -> None:
        """The server is unusable: stop asking it for the rest of this process and for a
        while in the other processes sharing the local cache."""
        self.disabled = True
        reason = exc if isinstance(exc, str) else (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
        self.note("down", f"unavailable ({reason})")
        if self.state_dir is not None:
            with contextlib.suppress(OSError):
                self.state_dir.mkdir(parents=True, exist_ok=True)
                files.write_atomic(self.state_dir / _BACKOFF_FILE, f"{self.display}\n{reason}\n")

    def backed_off(self) -> bool:
        """True while another process of this build found the server unavailable lately."""
        if self.state_dir is None:
            return False
        try:
            marker = self.state_dir / _BACKOFF_FILE
            age = time.time() - marker.stat().st_mtime
            if age < _BACKOFF_S and marker.read_text(encoding="utf-8").splitlines()[0] == self.display:
                return True
        except (OSError, IndexError):
            pass
        return False

    def _get(self, path: str, limit: int) -> bytes | None:
        """The bytes at `path`, or None for a miss (404) or when the server failed."""
        if self.disabled:
            return None
        try:
            status, data = self._request("GET", path, limit=limit)
        except OSError as exc:
            self._fail(exc)
            return None
        if status == 200:
            return data
        if status != 404:
            self._fail(f"GET answered HTTP {status}")
        return None

    def _put(self, path: str, body: bytes) -> bool:
        if self.disabled or self._upload_disabled:
            return False
        try:
            status, _ = self._request("PUT", path, body=body, limit=1 << 16)
        except OSError as exc:
            self._fail(exc)
            return False
        if 200 <= status < 300:
            return True
        # Refused writes (401, 403, 405, 413) leave reads working.
        self._upload_disabled = True
        self.note("put", f"upload refused (HTTP {status}); set {MODE_ENV}=read for a read-only client")
        return False

    # --- records and blobs ------------------------------------------------------

    def _record(self, key: str) -> list[dict[str, Any]]:
        if key in self._records:
            return self._records[key]
        data = self._get(_ac_path(key), _MAX_RECORD)
        entries: list[dict[str, Any]] = []
        if data is not None:
            parsed = _parse_record(data, key, self.secret)
            if isinstance(parsed, str):
                self.note("record", f"record {_ac_path(key)[:19]}... {parsed} (ignored)")
            entries = parsed if isinstance(parsed, list) else []
        self._records[key] = entries
        return entries

    def _blob(self, digest: str, size: int) -> bytes | None:
        data = self._get(f"cas/{digest}", size)
        if data is None:
            return None
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            self.note("corrupt", f"blob cas/{digest[:16]}... does not match its hash (ignored)")
            return None
        return data

    def fetch(self, key: str, count: int, deps_match: Callable[[Mapping[str, str]], bool]) -> Fetched | None:
        """The newest entry of record `key` with `count` outputs whose dependencies match (as
        `deps_match` judges them) and whose every blob verifies: its dependencies and their
        hashes, and each output's bytes. Writes nothing: the caller checks the bytes are what
        its step makes before any becomes a file."""
        if self.disabled:
            return None
        try:
            return self._fetch(key, count, deps_match)
        except Exception as exc:  # noqa: BLE001 - whatever goes wrong here, the build goes on locally
            self._fail(f"{type(exc).__name__}: {exc}")
            return None

    def upload(self, key: str, outputs: Sequence[Path], dep_hashes: Mapping[str, str]) -> bool:
        """Put each output's bytes and then the record that names them (readers never see a
        record before its blobs). Returns True when everything was stored."""
        if self.read_only or self.disabled or self._upload_disabled:
            return False
        try:
            return self._upload(key, outputs, dep_hashes)
        except Exception as exc:  # noqa: BLE001 - an upload never fails the build
            self._fail(f"{type(exc).__name__}: {exc}")
            return False

    def _fetch(self, key: str, count: int, deps_match: Callable[[Mapping[str, str]], bool]) -> Fetched | None:
        for entry in reversed(self._record(key)):
            if len(entry["outputs"]) != count or not deps_match(entry["deps"]):
                continue
            blobs = []
            for out in entry["outputs"]:
                data = self._blob(out["sha256"], out["size"])
                if data is None:
                    break
                blobs.append(data)
            else:
                self.hits += 1
                return Fetched(dict(entry["deps"]), blobs, [bool(o.get("exec")) for o in entry["outputs"]])
            if self.disabled:
                return None
        return None

    def _upload(self, key: str, outputs: Sequence[Path], dep_hashes: Mapping[str, str]) -> bool:
        described = []
        for path in outputs:
            try:
                data = Path(path).read_bytes()
                executable = bool(os.stat(path).st_mode & 0o100)
            except OSError:
                return False
            digest = hashlib.sha256(data).hexdigest()
            if not self._put(f"cas/{digest}", data):
                return False
            described.append({"sha256": digest, "size": len(data), "exec": executable})
        entry = {"deps": dict(dep_hashes), "outputs": described}
        known = [e for e in self._record(key) if e["deps"] != entry["deps"]]
        known.append(entry)
        known = known[-_MAX_ENTRIES:]
        doc: dict[str, object] = {"format": RECORD_FORMAT, "entries": known}
        if self.secret is not None:
            doc["mac"] = _mac(self.secret, key, known)
        body = json.dumps(doc, sort_keys=True).encode("utf-8")
        if not self._put(_ac_path(key), body):
            return False
        self._records[key] = known
        return True


def _ac_path(key: str) -> str:
    return "ac/" + hashlib.sha256(key.encode("utf-8")).hexdigest()


@record(frozen=True)
class Fetched:
    """A remote entry that passed every check the remote tier can make, not yet written."""

    deps: dict[str, str]
    blobs: list[bytes]
    executable: list[bool]


def _mac(secret: bytes, key: str, entries: list[dict[str, Any]]) -> str:
    """The record's signature: its key and entries, canonical JSON, under the shared secret."""
    message = json.dumps({"key": key, "entries": entries}, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _parse_record(data: bytes, key: str, secret: bytes | None) -> list[dict[str, Any]] | str:
    """The entries of a record, or why they are not used: not a record of ours, an entry
    that names no dependency (nothing ties its bytes to any input), or a signature missing
    or wrong while a shared secret is set."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "is not a pyree_build record"
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT or not isinstance(doc.get("entries"), list):
        return "is not a pyree_build record"
    entries = []
    for entry in doc["entries"]:
        if not isinstance(entry, dict):
            return "is not a pyree_build record"
        deps, outs = entry.get("deps"), entry.get("outputs")
        if not isinstance(deps, dict) or not all(isinstance(k, str) and os.path.isabs(k) and _hex64(v) for k, v in deps.items()):
            return "is not a pyree_build record"
        if not deps:
            return "has an entry that names no dependency"
        if not isinstance(outs, list) or not outs:
            return "is not a pyree_build record"
        for out in outs:
            if not isinstance(out, dict) or not _hex64(out.get("sha256")):
                return "is not a pyree_build record"
            size = out.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= _MAX_BLOB:
                return "is not a pyree_build record"
        entries.append({"deps": deps, "outputs": outs})
    if secret is not None:
        mac = doc.get("mac")
        if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(secret, key, doc["entries"])):
            return f"is not signed with {KEY_ENV}"
    return entries


# One remote per process and setting: another secret, token or mode is another client.
_CONFIGURED: dict[tuple[str | None, ...], RemoteCache | None] = {}


def from_env(state_dir: Path | None = None) -> RemoteCache | None:
    """The remote configured by the environment (one per process), or None when unset,
    malformed (said once), or backed off after a recent failure of another process."""
    url = os.environ.get(URL_ENV, "").strip()
    if not url or url.lower() in ("0", "off", "no", "false"):
        return None
    setting = (url, *(os.environ.get(name) for name in (TOKEN_ENV, AUTH_ENV, MODE_ENV, TIMEOUT_ENV, KEY_ENV)))
    if setting in _CONFIGURED:
        return _CONFIGURED[setting]
    remote: RemoteCache | None
    try:
        timeout = float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT)
        mode = os.environ.get(MODE_ENV, "readwrite").strip().lower()
        if mode not in ("read", "readonly", "read-only", "readwrite", "read-write", "rw", ""):
            raise ValueError(f"{MODE_ENV} must be read or readwrite, not {mode!r}")
        remote = RemoteCache(
            url,
            token=os.environ.get(TOKEN_ENV) or None,
            auth=os.environ.get(AUTH_ENV) or None,
            read_only=mode.startswith("read") and "write" not in mode,
            timeout=timeout if timeout > 0 else DEFAULT_TIMEOUT,
            state_dir=state_dir,
            secret=os.environ[KEY_ENV].encode("utf-8") if os.environ.get(KEY_ENV) else None,
        )
    except ValueError as exc:
        print(f"pyree_build: note: remote cache not used: {exc}", file=sys.stderr, flush=True)
        remote = None
    if remote is not None and remote.backed_off():
        remote.disabled = True
        echo.log_step(f"  remote cache {remote.display}: skipped, unavailable to another build step in the last {_BACKOFF_S:.0f} s")
    _CONFIGURED[setting] = remote
    return remote
