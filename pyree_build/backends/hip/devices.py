"""Whether an AMD GPU is usable here, for `run --device hip` and doctor."""

from __future__ import annotations

import functools

from pyree_build.backends.runtime import listed_devices
from pyree_build.core.errors import PyreeError


@functools.cache
def hip_status() -> tuple[bool, str]:
    """(usable, reason): an AMD GPU is usable when the runtime can enumerate a HIP device."""
    try:
        devices, _ = listed_devices("hip")
    except PyreeError as exc:
        return False, exc.what
    if devices:
        return True, ", ".join(devices)
    return False, "no usable AMD GPU (HIP runtime libamdhip64.so or device absent)"
