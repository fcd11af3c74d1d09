"""The C library's functions that pyree_build calls through ctypes (prctl, madvise, inotify),
looked up once a process: the server looks them up before it forks, so a worker only calls."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def function(name: str) -> Callable[..., int] | None:
    """libc's `name`, with errno kept for ctypes.get_errno(); None where it has none (not Linux)."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
