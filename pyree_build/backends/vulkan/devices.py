"""Vulkan devices on this machine and the --iree-vulkan-target that is correct for them.

A module compiled for one Vulkan target can run on another device with wrong results and
exit code 0 (checked: `rdna3` / `ampere` modules on lavapipe, the CPU Vulkan device, sum
rows of 1024 ones to 256). So `auto` — the default — picks the target of the device that
is here, and the conservative baseline where there is none.
"""

from __future__ import annotations

import re

from pyree_build.core import processes, toolchain
from pyree_build.core.errors import PyreeError, trim
from pyree_build.core.records import record

# --iree-vulkan-target names iree-compile 3.13 accepts (checked one by one); an unknown
# name crashes it with a stack dump, so names are checked here first. `auto` picks the
# target of the Vulkan device on this machine.
VULKAN_TARGETS = (
    "auto", "vp_android_baseline_2022", "llvmpipe", "valhall", "valhall4", "adreno", "pascal", "volta", "turing",
    "ampere", "ada", "a100", "rtx3090", "rtx4090", "sm_80", "sm_86", "sm_89", "rdna1", "rdna2", "rdna3", "cdna1",
    "cdna2", "cdna3", "gfx90a", "gfx942", "gfx1100", "mi300x", "rx7900xtx",
)  # fmt: skip

# Correct everywhere (no subgroup or extension assumptions), but slower on real GPUs.
BASELINE_TARGET = "vp_android_baseline_2022"


@record(frozen=True)
class VulkanDevice:
    uri: str
    name: str
    driver: str
    vendor_id: int
    kind: str  # cpu, discrete-gpu, integrated-gpu, ...
    subgroup_sizes: tuple[int, int]  # (smallest, largest) lanes; (0, 0) where the runtime did not say


# Each try's time limit, in seconds: a cold start of the Vulkan loader and driver on a loaded
# machine took longer than a warm one, and a failed try read as "no device" hid lavapipe.
# A try that times out, crashes or fails for another reason than "no driver" is tried again.
PROBE_LIMITS = (60.0, 180.0)
# What the runtime prints when no Vulkan driver is installed: an answer, not a failure.
_NO_DRIVER = ("VK_ERROR_INCOMPATIBLE_DRIVER", "vulkan library", "libvulkan")

_probe_failures: list[str] = []  # why the last probe found nothing, when it failed


def devices() -> tuple[VulkanDevice, ...]:
    """The Vulkan devices IREE's runtime sees (none without a Vulkan driver), in its order.
    An answer is kept for the process (a warm server's too); a failed probe is not."""
    if _known:
        return _known[0]
    found = _probe()
    if not _probe_failures:
        _known.append(found)
    return found


_known: list[tuple[VulkanDevice, ...]] = []


def _probe() -> tuple[VulkanDevice, ...]:
    try:
        runner = toolchain.iree_run_module()
    except PyreeError:
        return ()
    _probe_failures.clear()
    for limit in PROBE_LIMITS:
        try:
            result = processes.spawn(runner.command("--dump_devices=vulkan"), what="listing Vulkan devices", check=False, timeout=limit)
        except PyreeError as exc:  # past the limit, or killed
            _probe_failures.append(exc.what)
            continue
        output = result.stderr + result.stdout
        if result.returncode == 0 or any(sign in output for sign in _NO_DRIVER):
            _probe_failures.clear()
            break
        _probe_failures.append(f"iree-run-module --dump_devices=vulkan exited with code {result.returncode}: {trim(output, 4) or '(nothing printed)'}")
    else:
        return ()
    if result.returncode != 0:
        return ()
    found = []
    for block in re.split(r"^# --device=", result.stdout, flags=re.MULTILINE)[1:]:
        fields = dict(re.findall(r"^(\w+): (.*)$", block, flags=re.MULTILINE))
        vendor = fields.get("vendor_id", "0")
        found.append(
            VulkanDevice(
                uri=block.split("\n", 1)[0].strip(),
                name=fields.get("name", "?"),
                driver=fields.get("driver", "?"),
                vendor_id=int(vendor, 16) if vendor.lower().startswith("0x") else int(vendor or 0),
                kind=fields.get("type", "?"),
                subgroup_sizes=_subgroup_sizes(fields.get("subgroup", "")),
            )
        )
    return tuple(found)


def _subgroup_sizes(line: str) -> tuple[int, int]:
    """(min, max) of a `subgroup: size=8 ... minSubgroupSize=8 maxSubgroupSize=8` line."""
    sizes = dict(re.findall(r"(\w+)=(\d+)", line))
    size = int(sizes.get("size", 0))
    return int(sizes.get("minSubgroupSize", size)), int(sizes.get("maxSubgroupSize", size))


def named(device: str) -> VulkanDevice | None:
    """The device a --device value selects: `vulkan` the first, `vulkan://N` by ordinal,
    `vulkan://PATH` by its path; None where it is not here."""
    here = devices()
    _, _, which = device.partition("://")
    if not which:
        return here[0] if here else None
    if which.isdigit():
        return here[int(which)] if int(which) < len(here) else None
    return next((d for d in here if d.uri == device), None)


def target_for(device: VulkanDevice) -> str:
    """The --iree-vulkan-target that computes correctly on `device`."""
    if device.driver == "llvmpipe" or "llvmpipe" in device.name:
        return "llvmpipe"  # lavapipe: 8-wide subgroups, which GPU targets do not assume
    if device.vendor_id == 0x10DE:
        return "ampere"  # NVIDIA: 32-wide subgroups on every generation IREE targets
    return BASELINE_TARGET


def resolve_target(name: str) -> str:
    """Check a --vulkan-target name (iree-compile crashes on unknown ones) and resolve `auto`."""
    if name not in VULKAN_TARGETS:
        raise PyreeError(
            f"unknown Vulkan target '{name}'",
            fix=f"use auto (the device on this machine) or one of: {', '.join(VULKAN_TARGETS[1:])}",
        )
    if name != "auto":
        return name
    here = devices()
    chosen = target_for(here[0]) if here else BASELINE_TARGET
    return chosen


def status() -> tuple[bool, str]:
    """(usable, reason) for --device vulkan."""
    here = devices()
    if not here and _probe_failures:
        tries = "; then ".join(_probe_failures)
        return False, f"the Vulkan device probe failed {len(_probe_failures)} time(s), so whether a device is here is unknown: {tries}"
    if not here:
        return False, "no Vulkan device (install a Vulkan driver; on a CPU-only Debian machine: apt-get install mesa-vulkan-drivers)"
    return True, "; ".join(f"{d.name} [{d.driver}, target {target_for(d)}]" for d in here)
