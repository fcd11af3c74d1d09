"""`tune --ray` on a real local Ray cluster: a head and more nodes started here, every address on
loopback, stopped afterwards with no process left. A sweep with a wrong and a slow variant, its
benchmarks on the node with a custom resource; a node killed mid-sweep, its task retried elsewhere.

Ray turns 127.0.0.1 (and localhost) into the machine's external address (its
resolve_ip_for_localhost), so the nodes use 127.0.0.2, which is loopback too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli
from support.tune_kernels import EXPECTED, SLOW, WRONG, tune_args, two_kernel_model, write_kernel

pytest.importorskip("ray", reason='Ray is not installed (pip install "pyree_build[ray]")')

pytestmark = pytest.mark.slow  # a cluster takes ~10 s to start, and a sweep through it ~20 s

LOOPBACK = "127.0.0.2"
RAY = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def cluster_pids(temp_dir: str) -> set[int]:
    """Every process whose command line names the cluster's temp dir, and their descendants."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if temp_dir.encode() in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
    tree, todo = _children(), list(found)
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class Cluster:
    """A head and worker nodes on loopback, in their own temp dir; every process it started is tracked."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="pyree-ray-")  # short: Ray's socket paths must fit in 107 bytes
        self.port = _free_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.seen: set[int] = set()
        # Fast node-death detection, no usage reporting, no dashboard.
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}

    def _ray(self, *args: str, env: dict[str, str] | None = None) -> None:
        proc = subprocess.run([str(RAY), *args], env=env or self.env, capture_output=True, text=True, timeout=120)
        self.track()
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def start_head(self) -> None:
        self._ray("start", "--head", "--node-ip-address", LOOPBACK, "--port", str(self.port), "--num-cpus", "1", "--include-dashboard=false",
                  "--disable-usage-stats", "--temp-dir", self.temp_dir)  # fmt: skip

    def add_node(self, *, resources: str = "{}", env: dict[str, str] | None = None) -> None:
        self._ray("start", "--address", self.address, "--node-ip-address", LOOPBACK, "--num-cpus", "1", "--resources", resources,
                  env={**self.env, **(env or {})})  # fmt: skip

    def track(self) -> set[int]:
        self.seen |= cluster_pids(self.temp_dir)
        return self.seen

    def stop(self) -> None:
        """SIGTERM to every process of the cluster, SIGKILL to those left after 10 s; only ours."""
        pids = self.track()
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
        _signal({p for p in pids | self.track() if _alive(p)}, signal.SIGKILL)
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.start_head()
        c.add_node(resources='{"bench_node": 1}')
        yield c
    finally:
        c.stop()
        left = [p for p in c.seen | cluster_pids(c.temp_dir) if _alive(p)]
        shutil.rmtree(c.temp_dir, ignore_errors=True)  # Ray's logs and sockets; every run left one behind
        assert not left, f"Ray processes left after stopping the cluster: {left}"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_kernel(tmp_path_factory.mktemp("tune_ray_kernel"))


def test_sweep_on_the_cluster_rejects_the_wrong_variant_and_benchmarks_on_the_bench_node(cluster, kernel, system_module, tmp_path):
    out = tmp_path / "best.json"
    args = tune_args(kernel, system_module, out, f"1,{WRONG},{SLOW}")
    result = run_cli(*args, "--ray", cluster.address, "--ray-resources", '{"bench_node": 1}', timeout=600)
    assert result.returncode == 0, result
    best = json.loads(out.read_text())
    assert best["winner"]["params"] == {"UNROLL": "1"}
    status = {v["params"]["UNROLL"]: v for v in best["variants"]}
    assert status[WRONG]["status"] == "wrong result" and "WRONG RESULT" in result.stdout
    assert status[SLOW]["status"] == "ok" and status[SLOW]["median_ms"] > 5 * best["winner"]["median_ms"]
    # Both measured variants were timed on the one node with the resource.
    assert status["1"]["node"] == status[SLOW]["node"] is not None
    # The plugin came back through Ray: the artifact beside best.json, as a local sweep leaves it.
    assert (tmp_path / "best.variants" / "UNROLL=1" / "kernel.so").is_file()


def test_the_modules_other_plugins_travel_with_the_sweep(cluster, tmp_path):
    """Issue 47: `tune --plugin` on the cluster: the other kernel's plugin reaches every node
    with the module (without it no variant could run there)."""
    pytest.importorskip("onnx", reason='onnx is not installed (pip install "pyree_build[onnx]")')
    pytest.importorskip("onnxruntime", reason='onnxruntime is not installed (pip install "pyree_build[onnx]")')
    two = two_kernel_model(tmp_path)
    out = tmp_path / "fc1.json"
    result = run_cli(*two.tune_args(out), "--plugin", two.sm_plugin, "--ray", cluster.address, "--ray-resources", '{"bench_node": 1}', timeout=600)
    assert result.returncode == 0, result
    variants = json.loads(out.read_text())["variants"]
    assert [v["status"] for v in variants] == ["ok", "ok"] and all(v["node"] for v in variants), variants


def test_a_node_killed_mid_sweep_has_its_task_retried_elsewhere(cluster, kernel, system_module, tmp_path):
    pause = tmp_path / "pause"
    pause.mkdir()
    # A third node whose builds stop after building, before storing: the test kills it there.
    cluster.add_node(env={"PYREE_BUILD_CACHE_TEST_PAUSE": str(pause)})
    out = tmp_path / "best.json"
    args = [*tune_args(kernel, system_module, out, f"1,2,{WRONG}"), "-D", "KILL_TEST=1", "--ray", cluster.address]
    proc = subprocess.Popen([sys.executable, "-m", "pyree_build", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (pause / "built").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert (pause / "built").exists(), "no build ran on the node to be killed"
        worker = int((pause / "built").read_text())
        raylet = int((Path("/proc") / str(worker) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        cluster.track()
        _signal({worker, raylet}, signal.SIGKILL)  # the node dies with a build in flight
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    best = json.loads(out.read_text())
    status = {v["params"]["UNROLL"]: v["status"] for v in best["variants"]}
    assert status == {"1": "ok", "2": "ok", WRONG: "wrong result"}, stdout
    assert best["winner"]["params"]["UNROLL"] in ("1", "2")
    assert EXPECTED  # the same check as the local sweep's
