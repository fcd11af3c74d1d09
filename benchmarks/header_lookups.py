"""What keying every header lookup costs (issue 22), against the compile it keys, in one run.

    python benchmarks/header_lookups.py [--headers 50] [--repeat 9]

Writes a C source including N headers (each including a shared one, with a __has_include),
spread over three -I directories, then times, side by side: the lookup scan that goes into
the cache key (core.inputs.header_lookups, in process), the compile itself (`pyree-build
objects` with the cache off), and a cache hit. Prints medians and the scan's share.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pyree_build.core import toolchain  # noqa: E402
from pyree_build.core.inputs import header_lookups  # noqa: E402


def write_project(root: Path, count: int) -> tuple[Path, list[Path]]:
    dirs = [root / f"inc{i}" for i in range(3)]
    for d in dirs:
        d.mkdir(parents=True)
    (dirs[2] / "common.h").write_text("#pragma once\n#define COMMON 1\n")
    lines = []
    for i in range(count):
        (dirs[i % 3] / f"h{i}.h").write_text(
            f'#include "common.h"\n#if __has_include("opt{i}.h")\n#include "opt{i}.h"\n#endif\nstatic inline int h{i}(void) {{ return {i} + COMMON; }}\n'
        )
        lines.append(f'#include "h{i}.h"')
    body = " + ".join(f"h{i}()" for i in range(count)) or "0"
    src = root / "p.c"
    src.write_text("\n".join(lines) + f"\nint total(void) {{ return {body}; }}\n")
    return src, dirs


def median_ms(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headers", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pyree-lookups.") as tmp:
        root = Path(tmp)
        src, dirs = write_project(root, args.headers)
        search = [toolchain.include_dir(), *dirs]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        includes = [x for d in dirs for x in ("-I", str(d))]
        cli = [sys.executable, "-m", "pyree_build", "objects", str(src), "--arch", "x86_64", *includes, "-o", str(root / "out"), "-q"]
        scan = median_ms(lambda: header_lookups([src], search), args.repeat)
        compile_off = median_ms(lambda: subprocess.run(cli, check=True, env=dict(env, PYREE_BUILD_CACHE="off")), args.repeat)
        cache = str(root / "cache")
        subprocess.run(cli, check=True, env=dict(env, PYREE_BUILD_CACHE=cache))
        hit = median_ms(lambda: subprocess.run(cli, check=True, env=dict(env, PYREE_BUILD_CACHE=cache)), args.repeat)
    print(f"{args.headers} headers in 3 -I directories, each with a __has_include; medians of {args.repeat}, ms")
    print(f"  lookup scan (in the key)   {scan:8.2f}")
    print(f"  objects, cache off         {compile_off:8.2f}   scan = {scan / compile_off:.1%} of it")
    print(f"  objects, cache hit         {hit:8.2f}   scan = {scan / hit:.1%} of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
