"""The native client (transport.c, plan_runner.c and their client.h): built with ziglang's
clang into a directory the caller owns (CMake: its build tree), so each CMake action and ctest
starts in ~1 ms instead of a Python start-up. `python -m pyree_build --native-client DIR`
builds it and prints its path.

It is built for this machine (zig's native target: glibc, linked dynamically; a static musl
build would start ~0.3 ms sooner but costs ~40 s the first time zig builds musl) with this
Python and its server identity compiled in; a stamp beside it names the inputs (every C file,
byte for byte), so a second call is a stat.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from pyree_build.cache import keys
from pyree_build.client import protocol
from pyree_build.core import files, processes, toolchain
from pyree_build.core.errors import PyreeError

HERE = Path(__file__).parent
SOURCES = ("transport.c", "plan_runner.c")  # compiled, in this order
HEADERS = ("client.h",)  # included by each source
CONFIGURED = SOURCES[0]  # the one that reads PYREE_PYTHON, PYREE_IDENTITY, PYREE_BOOT, PYREE_PACKAGE
NAME = "pyree_build"  # so a build log reads `.../pyree_build_client/pyree_build plugin ...`, as `-m pyree_build plugin` did


def _c_string(text: str) -> str:
    """`text` as a C string literal: every byte that is not plain ASCII as an octal escape."""
    out = []
    for byte in os.fsencode(text):
        char = chr(byte)
        out.append(char if 32 <= byte < 127 and char not in '"\\?' else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _sources() -> dict[str, str]:
    """Every C file by name, as compiled: the configuration (this Python's) ahead of CONFIGURED's text."""
    python, _, boot, package = protocol.boot_argv("", [])[:4]
    config = "".join(
        f"#define {name} {_c_string(value)}\n"
        for name, value in (("PYREE_PYTHON", python), ("PYREE_IDENTITY", protocol.identity()), ("PYREE_BOOT", boot), ("PYREE_PACKAGE", package))
    )
    return {name: (config if name == CONFIGURED else "") + (HERE / name).read_text() for name in (*SOURCES, *HEADERS)}


def build(out_dir: str | os.PathLike[str]) -> Path:
    """The client in `out_dir`, built unless the one there was built from the same inputs."""
    if not sys.platform.startswith("linux"):
        raise PyreeError("the native client is built for Linux only", fix="use `python -m pyree_build` (the Python client)")
    zig = toolchain.c_compiler("zig")
    sources = _sources()
    texts = [part for name, text in sources.items() for part in (name, text)]
    key = keys.key_of({"sources": texts, "zig": zig.identity(), "machine": os.uname().machine})
    out = Path(out_dir) / NAME
    stamp = out.with_suffix(".stamp")
    if out.is_file() and stamp.is_file() and stamp.read_text() == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # The very text the key names is what is compiled: copied, not read again where it lies.
    src = out.with_name(f"{NAME}.{os.getpid()}.src")
    tmp = out.with_name(f"{NAME}.{os.getpid()}.tmp")
    try:
        src.mkdir(exist_ok=True)
        for name, text in sources.items():
            (src / name).write_text(text)
        processes.spawn(
            zig.command("-O2", "-s", "-o", tmp, *(src / name for name in SOURCES)),
            what="building the native pyree-build client",
            file=HERE / CONFIGURED,
        )
        os.replace(tmp, out)  # the tool wrote it whole: renamed into place as atomic_outputs does
        files.write_atomic(stamp, key)
    finally:
        shutil.rmtree(src, ignore_errors=True)
        tmp.unlink(missing_ok=True)
    return out
