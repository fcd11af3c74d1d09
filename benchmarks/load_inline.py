"""What `pb.load_inline` costs, side by side in one run (issue 25, item 1).

    python benchmarks/load_inline.py [--repeat 50]

Rows, each a median and min-max in ms over --repeat rounds (after one warm-up):
a cold load (a kernel string never built: plugin, module, import check), a warm load (the
same strings again: cache hits), one call of the loaded kernel in this process, and the
same call through `iree-run-module` (the raw tool, what a second plugin in one process
costs). The kernel is the CPU plugin sample's import on 8 floats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "samples" / "custom_dispatch" / "cpu" / "plugin"

KERNEL = r"""
#include <stddef.h>
#include <stdint.h>
typedef struct {
  const float* lhs; size_t lhs_offset;
  const float* rhs; size_t rhs_offset;
  float* out; size_t out_offset;
  size_t count; size_t workgroup;
  uint32_t processor_id; const uint64_t* processor_data;
} args_t;

int simple_mul_workgroup(void* params, void* context, void* reserved) {
  const args_t* a = (const args_t*)params;
  for (size_t i = 0; i < a->count; ++i)
    a->out[a->out_offset + i] = a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i] * SCALE;
  return 0;
}
"""


def timings(action: Callable[[int], object], repeat: int) -> list[float]:
    action(-1)  # warm-up
    times = []
    for k in range(repeat):
        start = time.perf_counter()
        action(k)
        times.append((time.perf_counter() - start) * 1000)
    return times


def show(label: str, times: list[float]) -> float:
    median = statistics.median(times)
    print(f"  {label:<50} {median:9.2f} ms  ({min(times):.2f}-{max(times):.2f})")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    os.environ.setdefault("PYREE_BUILD_CACHE", tempfile.mkdtemp(prefix="pyree-bench-inline."))
    import pyree_build as pb
    from pyree_build.core import echo, toolchain

    echo.VERBOSITY = 0
    program = (SAMPLE / "example.mlir").read_text()
    a, b = np.full(8, 2, np.float32), np.full(8, 4, np.float32)
    cold_repeat = max(3, args.repeat // 10)
    print(f"pb.load_inline, {args.repeat} rounds ({cold_repeat} for cold loads):")
    cold = show(
        "cold load (build plugin + module, import check)",
        timings(lambda k: pb.load_inline(mlir=program, c_source=KERNEL.replace("SCALE", f"{k + 2}"), function="mixed_invocation"), cold_repeat),
    )
    kernel = pb.load_inline(mlir=program, c_source=KERNEL.replace("SCALE", "1"), function="mixed_invocation")
    warm = show(
        "warm load (the same strings: cache hits)",
        timings(lambda _: pb.load_inline(mlir=program, c_source=KERNEL.replace("SCALE", "1"), function="mixed_invocation"), args.repeat),
    )
    call = show("call in this process", timings(lambda _: kernel(a, b), args.repeat))
    argv = [str(toolchain.iree_run_module().path), f"--module={kernel.module}", "--function=mixed_invocation", "--device=local-sync"]
    argv += [f"--executable_plugin={p}" for p in kernel.plugins] + ["--input=8xf32=2", "--input=8xf32=4"]
    raw = show("the same call with iree-run-module (raw binary)", timings(lambda _: subprocess.run(argv, check=True, capture_output=True), args.repeat))
    print(f"ratios: cold/warm load {cold / warm:.1f}x; iree-run-module/in-process call {raw / call:.1f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
