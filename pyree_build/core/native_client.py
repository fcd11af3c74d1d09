"""The native client (native_client.c): built with ziglang's clang into a directory the caller
owns (CMake: its build tree), so each CMake action and ctest starts in ~1 ms instead of a
Python start-up. `python -m pyree_build --native-client DIR` builds it and prints its path.

It is built for this machine (zig's native target: glibc, linked dynamically; a static musl
build would start ~0.3 ms sooner but costs ~40 s the first time zig builds musl) with this
Python and its server identity compiled in; a stamp beside it names the inputs, so a second
call is a stat.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from pyree_build.core import files, processes, server_protocol, toolchain
from pyree_build.core.errors import PyreeError

SOURCE = Path(__file__).with_name("native_client.c")
NAME = "pyree_build"  # so a build log reads `.../pyree_build_client/pyree_build plugin ...`, as `-m pyree_build plugin` did


def _c_string(text: str) -> str:
    """`text` as a C string literal: every byte that is not plain ASCII as an octal escape."""
    out = []
    for byte in os.fsencode(text):
        char = chr(byte)
        out.append(char if 32 <= byte < 127 and char not in '"\\?' else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _source() -> str:
    python, _, boot, package = server_protocol.boot_argv("", [])[:4]
    config = "".join(
        f"#define {name} {_c_string(value)}\n"
        for name, value in (("PYREE_PYTHON", python), ("PYREE_IDENTITY", server_protocol.identity()), ("PYREE_BOOT", boot), ("PYREE_PACKAGE", package))
    )
    return config + SOURCE.read_text()


def build(out_dir: str | os.PathLike[str]) -> Path:
    """The client in `out_dir`, built unless the one there was built from the same inputs."""
    if not sys.platform.startswith("linux"):
        raise PyreeError("the native client is built for Linux only", fix="use `python -m pyree_build` (the Python client)")
    zig = toolchain.c_compiler("zig")
    source = _source()
    key = hashlib.sha256("\0".join((source, zig.identity(), os.uname().machine)).encode()).hexdigest()
    out = Path(out_dir) / NAME
    stamp = out.with_suffix(".stamp")
    if out.is_file() and stamp.is_file() and stamp.read_text() == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(f"{NAME}.{os.getpid()}.c")
    tmp = out.with_name(f"{NAME}.{os.getpid()}.tmp")
    try:
        src.write_text(source)
        processes.spawn(
            zig.command("-O2", "-s", "-o", tmp, src),
            what="building the native pyree-build client",
            file=SOURCE,
        )
        os.replace(tmp, out)  # the tool wrote it whole: renamed into place as atomic_outputs does
        files.write_atomic(stamp, key)
    finally:
        for path in (src, tmp):
            path.unlink(missing_ok=True)
    return out
