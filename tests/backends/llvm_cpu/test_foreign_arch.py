"""The aarch64 code pyree_build builds, run for real under qemu-user: the aarch64 ELF of a
standalone FatELF plugin, and aarch64 objects embedded in a module.

Needs qemu-aarch64-static, an aarch64 sysroot and the aarch64 iree-run-module,
which tests/foreign/setup_qemu.sh DIR fetches; then PYREE_QEMU_DIR=DIR (.ci/run does both where it
runs as root). Skipped otherwise
(every arch's ELF is still checked by reading it in test_standalone_plugin.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, SAMPLES

QEMU_DIR = Path(os.environ["PYREE_QEMU_DIR"]) if os.environ.get("PYREE_QEMU_DIR") else None
QEMU = QEMU_DIR / "qemu" / "usr" / "bin" / "qemu-aarch64-static" if QEMU_DIR else None
RUNNER = QEMU_DIR / "runtime-aarch64" / "iree" / "_runtime_libs" / "iree-run-module" if QEMU_DIR else None

pytestmark = pytest.mark.skipif(
    not (QEMU and QEMU.is_file() and RUNNER and RUNNER.is_file()),
    reason="set PYREE_QEMU_DIR to a directory made by tests/foreign/setup_qemu.sh to run aarch64 under qemu",
)


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_the_aarch64_elf_of_the_fatelf_runs_under_qemu(cli, tmp_path, device):
    sos = tmp_path / "plugin.sos"
    result = cli("plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", "--arch", "riscv64",
                 PLUGIN_SAMPLE / "standalone_plugin.c", "-o", sos)  # fmt: skip
    assert result.returncode == 0, result
    vmfb = tmp_path / "example_aarch64.vmfb"
    result = cli("compile", PLUGIN_SAMPLE / "example.mlir", "-o", vmfb, "--", "--iree-llvmcpu-target-triple=aarch64-unknown-unknown-eabi-elf")
    assert result.returncode == 0, result
    proc = subprocess.run(
        [QEMU, "-L", QEMU_DIR / "sysroot-aarch64", RUNNER, f"--module={vmfb}", f"--device={device}", f"--executable_plugin={sos}",
         "--function=mixed_invocation", "--input=8xf32=2", "--input=8xf32=4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "8xf32=12 12 12 12 12 12 12 12" in proc.stdout


def _run_aarch64(*args: object) -> subprocess.CompletedProcess[str]:
    assert QEMU is not None and QEMU_DIR is not None and RUNNER is not None
    return subprocess.run([QEMU, "-L", QEMU_DIR / "sysroot-aarch64", RUNNER, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_aarch64_objects_embedded_in_a_module_run_under_qemu(cli, tmp_path, device):
    sample = SAMPLES / "custom_dispatch" / "cpu" / "embedded"
    objects = tmp_path / "objects"
    result = cli("objects", sample / "functions.c", "-o", objects, "--arch", "aarch64")
    assert result.returncode == 0, result
    vmfb = tmp_path / "embedded_aarch64.vmfb"
    result = cli(
        "compile", sample / "example.mlir", "-o", vmfb, "--object-search-path", objects, "--", "--iree-llvmcpu-target-triple=aarch64-unknown-unknown-eabi-elf"
    )
    assert result.returncode == 0, result
    proc = _run_aarch64(f"--module={vmfb}", f"--device={device}", "--function=mixed_invocation", "--input=8xf32=2", "--input=8xf32=4")
    assert proc.returncode == 0, proc.stderr
    assert "8xf32=96 96 96 96 96 96 96 96" in proc.stdout
