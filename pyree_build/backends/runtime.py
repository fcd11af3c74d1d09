"""What the IREE runtime enumerates here: the probe GPU backends share for `run` and `doctor`."""

from __future__ import annotations

from pyree_build.core import processes, toolchain


def listed_devices(driver: str) -> tuple[list[str], str]:
    """The `driver://` devices iree-run-module enumerates here, and what it said. A driver
    listed by the runtime is not enough: its library and a device must be present."""
    runner = toolchain.iree_run_module()
    result = processes.spawn(runner.command(f"--list_devices={driver}"), what=f"listing {driver} devices", check=False, timeout=60)
    text = (result.stdout + result.stderr).strip()
    devices = [line.strip() for line in text.splitlines() if line.strip().startswith(f"{driver}://")] if result.returncode == 0 else []
    return devices, text or f"exit code {result.returncode}"
