"""The one key of every up-to-date decision that is not a cached action's.

A cached action (local.cached_action) is keyed by its flags, tools and every file it read. Some
decisions are made before or beside one: whether a tune's best.json still stands for its sources
(tuning/records), which directory load_inline's strings build in (actions/inline), which folder of
the cache's work area holds a math library (backends/llvm_cpu/libm), whether the native client
beside a build is the one its C files make (client/native). Each is this key: the sha256 of the
values that decide it (canonical JSON) and then of each file that does, by name and content, so
two decisions from the same inputs agree everywhere and an edit anywhere changes the key.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from pyree_build.core import readers


def key_of(values: object, files: Iterable[str | os.PathLike[str]] = (), *, length: int = 64) -> str:
    """The key of `values` (anything json can write; other objects by str) and of each file's name
    and bytes ('-' for one that is absent or not a regular file), as `length` hex digits."""
    digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode())
    for path in files:
        digest.update(f"\0{Path(path).name}\0{readers.sha256_of(path) or '-'}".encode())
    return digest.hexdigest()[:length]
