"""Issue 35: every verb that writes, on a file system that fills up while it writes (a small
tmpfs, mounted for the test; skipped with the reason where mounting is not permitted).

Whatever the free space, a verb either succeeds with all its outputs, or fails with a clean
error (no traceback) and leaves the directory as it was: none of its outputs (not 2 of 3
parts, not a .vmfb without its depfile), no temporaries, no empty directory it made."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, SAMPLES, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EMBEDDED = SAMPLES / "custom_dispatch" / "cpu" / "embedded"
SIZE_KB = 256
EXAMPLES = int(os.environ.get("PYREE_FULL_DISK_EXAMPLES", "6"))


def _mount(where: Path) -> str | None:
    """Mount a SIZE_KB tmpfs at `where`; None, or why it cannot be."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("mount"):
        return "mounting a tmpfs needs root on Linux"
    where.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_KB}k", "tmpfs", where], capture_output=True, text=True)
    return None if result.returncode == 0 else f"mount -t tmpfs is not permitted here: {result.stderr.strip()}"


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    where = tmp_path_factory.mktemp("full") / "mnt"
    why = _mount(where)
    if why:
        pytest.skip(why)
    yield where
    subprocess.run(["umount", where], check=False)


@pytest.fixture(scope="module")
def fat(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sos") / "in.sos"
    arches = [a for arch in ("x86_64", "aarch64", "riscv64") for a in ("--arch", arch)]
    assert run_cli("plugin", "--kind", "standalone", *arches, PLUGIN_SAMPLE / "standalone_plugin.c", "-o", out).returncode == 0
    return out


def _verbs(fat: Path) -> dict[str, tuple[list[str], list[str]]]:
    """verb -> (arguments, in a fresh directory D; the outputs it writes, relative to D)."""
    return {
        "plugin": (["plugin", "--kind", "system", str(PLUGIN_SAMPLE / "system_plugin.c"), "--depfile", "D/p.d", "-o", "D/out/p.so"],
                   ["out/p.so", "p.d"]),
        "objects": (["objects", str(EMBEDDED / "functions.c"), "--arch", "x86_64", "--arch", "aarch64", "--depfile", "D/o.d", "-o", "D/objs"],
                    ["objs/functions_x86_64.o", "objs/functions_aarch64.o", "o.d"]),
        "compile": (["compile", str(PLUGIN_SAMPLE / "example.mlir"), "--depfile", "D/c.d", "-o", "D/out/e.vmfb"], ["out/e.vmfb", "c.d"]),
        "new": (["new", "D/proj"], ["proj/CMakeLists.txt", "proj/README.md", "proj/plugin.c", "proj/program.mlir", "proj/pyproject.toml"]),
        "split": (["fatelf", "split", str(fat), "-o", "D/parts"], ["parts/in_x86_64.so", "parts/in_aarch64.so", "parts/in_riscv64.so"]),
        "select": (["fatelf", "select", str(fat), "--arch", "riscv64", "-o", "D/out/sel.so"], ["out/sel.so"]),
        "join": (["fatelf", "join", *(str(fat.parent / f"parts/in_{a}.so") for a in ("x86_64", "aarch64")), "-o", "D/out/j.sos"],
                 ["out/j.sos"]),
    }  # fmt: skip


def _fill(disk: Path, free_kb: int) -> None:
    avail = shutil.disk_usage(disk).free // 1024
    with open(disk / "filler", "ab") as f:
        f.write(b"\0" * max(0, (avail - free_kb) * 1024))


@pytest.mark.parametrize("verb", ["plugin", "objects", "compile", "new", "split", "select", "join"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(free_kb=st.integers(min_value=0, max_value=48))
def test_a_verb_on_a_filling_disk_writes_all_its_outputs_or_none(disk, fat, verb, free_kb):
    if not (fat.parent / "parts").is_dir():
        assert run_cli("fatelf", "split", fat, "-o", fat.parent / "parts").returncode == 0
    for leftover in disk.iterdir():
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    work = disk / uuid.uuid4().hex[:8]
    work.mkdir()
    _fill(disk, free_kb)
    argv, outputs = _verbs(fat)[verb]
    env = dict(os.environ, PYREE_BUILD_CACHE="off", PYREE_BUILD_SERVER="off")
    result = subprocess.run([sys.executable, "-m", "pyree_build", *(a.replace("D/", f"{work}/") for a in argv), "-q"],
                            capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    left = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    if result.returncode == 0:
        assert all((work / o).is_file() and (work / o).stat().st_size > 0 for o in outputs), (left, result.stderr)
    else:
        assert "Traceback" not in result.stderr and "error:" in result.stderr, result.stderr
        assert "no space left on device" in result.stderr.lower() or "file system it writes to is full" in result.stderr, result.stderr
        assert left == [], f"free {free_kb} KB: {verb} failed ({result.stderr.strip()[:300]}) and left {left}"
