"""What always hashing file contents costs: sha256 of a 100 MB file (the cache never keys
a file by size and mtime) against the run time of the tools the cache saves.

    python benchmarks/hash_cost.py [--repeat N]

Prints the median of each and the ratio hash / tool. Target: hashing 100 MB takes well
under one tool run (ratio < 0.5), so the cost of hashing inputs stays small even for
inputs far larger than any source, header, spec or object a build reads.
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

from pyree_build import cache  # noqa: E402

PLUGIN = REPO / "samples" / "custom_dispatch" / "cpu" / "plugin"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ, PYREE_BUILD_CACHE="off", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory(prefix="pyree-hash-bench.") as tmp:
        big = Path(tmp) / "100MB.bin"
        with big.open("wb") as f:
            for _ in range(100):
                f.write(os.urandom(1 << 20))

        def run(*argv: object) -> None:
            subprocess.run([sys.executable, "-m", "pyree_build", *map(str, argv)], check=True, capture_output=True, env=env)

        sides = {
            "sha256 of 100 MB": lambda: cache.hash_file(big),
            "iree-compile example.mlir (cache off)": lambda: run("compile", PLUGIN / "example.mlir", "-o", Path(tmp) / "m.vmfb"),
            "system plugin build (cache off)": lambda: run("plugin", PLUGIN / "system_plugin.c", "-o", Path(tmp) / "p.so"),
        }
        times: dict[str, list[float]] = {k: [] for k in sides}
        for fn in sides.values():
            fn()  # warm the page cache and the tools' lazily built state
        for _ in range(args.repeat):
            for label, fn in sides.items():
                times[label].append(timed(fn))
    hash_s = statistics.median(times["sha256 of 100 MB"])
    for label, values in times.items():
        median = statistics.median(values)
        ratio = "" if label.startswith("sha256") else f"   hash/tool {hash_s / median:5.2f}x"
        print(f"{label:<40} median {median * 1000:8.1f} ms  (min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f}){ratio}")


if __name__ == "__main__":
    main()
