"""Issue 35: nothing a user or a server names makes pyree_build hang. A FIFO or a device where
a file is expected is refused without being opened for a blocking read. Real tools throughout."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import SAMPLES, assert_clean_error
from hypothesis import given, settings
from hypothesis import strategies as st

from pyree_build.core import readers
from pyree_build.core.errors import PyreeError

EMBEDDED = SAMPLES / "custom_dispatch" / "cpu" / "embedded"


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block blocks."""

    def _hung(_signum: int, _frame: object) -> None:
        raise AssertionError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_a_dependency_a_remote_record_names_as_a_fifo_hashes_as_absent_without_blocking(fifo, tmp_path):
    from pyree_build.cache import local

    with within(5):
        assert local.hash_file(fifo) is None
        assert local._deps_unchanged({str(fifo): "0" * 64}, {}) is False
    (tmp_path / "f").write_bytes(b"x")
    assert local.hash_file(tmp_path / "f") is not None


def test_reading_a_named_file_refuses_what_is_not_a_regular_file(fifo, tmp_path):
    with within(5):
        for path, what in [(fifo, r"is a FIFO \(named pipe\), not a regular file"), (tmp_path, "is a directory"), ("/dev/zero", "character device")]:
            with pytest.raises(PyreeError, match=what):
                readers.read_regular(path, "module")
    with pytest.raises(PyreeError, match="module not found"):
        readers.read_regular(tmp_path / "absent", "module")


def test_a_fifo_in_a_pass_through_flag_is_refused_before_iree_compile_runs(cli, fifo, tmp_path):
    result = cli("compile", EMBEDDED / "example.mlir", "-o", tmp_path / "m.vmfb", "--",
                 f"--iree-preprocessing-transform-spec-filename={fifo}", timeout=60)  # fmt: skip
    assert_clean_error(result, "fifo", "--iree-preprocessing-transform-spec-filename names a FIFO (named pipe)")
    assert not (tmp_path / "m.vmfb").exists()


def test_a_fifo_as_onnx_external_data_is_named_as_a_fifo(cli, tmp_path):
    onnx = pytest.importorskip("onnx")
    from support import onnx_models as models

    path = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), path, save_as_external_data=True, all_tensors_to_one_file=True, location="mlp.weights", size_threshold=0)
    (tmp_path / "mlp.weights").unlink()
    os.mkfifo(tmp_path / "mlp.weights")
    result = cli("import", path, "-o", tmp_path / "m.mlir", timeout=60)
    assert_clean_error(result, "external data file of tensor", "is a FIFO (named pipe), not a regular file")


@given(st.binary(max_size=200))
@settings(max_examples=200, deadline=None)
def test_code_objects_of_bytes_that_are_not_a_module_is_an_error(tmp_path_factory, data):
    from pyree_build.backends.hip import hsaco

    path = tmp_path_factory.mktemp("bytes") / "x.vmfb"
    path.write_bytes(data)
    if readers.is_iree_module(data):
        hsaco.code_objects(path)
    else:
        with pytest.raises(PyreeError, match="not an IREE module"):
            hsaco.code_objects(path)


def test_code_objects_of_random_bytes_exits_non_zero(cli, tmp_path):
    path = tmp_path / "random.vmfb"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    assert_clean_error(cli("code-objects", path), "random.vmfb: not an IREE module")


def test_a_server_that_answers_a_byte_at_a_time_meets_one_deadline_for_the_whole_request(tmp_path):
    """Never idle for the socket timeout, so only a deadline for the whole request ends it."""
    import socket
    import threading
    import time

    from pyree_build.cache import remote

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000
            for byte in answer:
                if stop.is_set():
                    return
                with contextlib.suppress(OSError):
                    conn.sendall(bytes([byte]))
                time.sleep(0.05)

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    cache = remote.RemoteCache(f"http://127.0.0.1:{listener.getsockname()[1]}/c", timeout=0.5)
    try:
        with within(20):  # the deadline is 0.5 s + 64 KiB at 256 KiB/s: under a second
            assert cache._get("ac/" + "0" * 64, 1 << 16) is None
        assert cache.disabled  # a note, and a local build from here on
    finally:
        stop.set()
        listener.close()
