"""The aarch64 ELF of a standalone FatELF plugin, run for real under qemu-user.

Opt-in: needs qemu-aarch64-static, an aarch64 sysroot and the aarch64 iree-run-module,
which tests/foreign/setup_qemu.sh DIR fetches; then PYREE_QEMU_DIR=DIR. Skipped otherwise
(every arch's ELF is still checked by reading it in test_standalone_plugin.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE

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
