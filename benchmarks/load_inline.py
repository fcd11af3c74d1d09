"""What `pb.load_inline` costs, side by side in one run (issues 25 and 48).

    python benchmarks/load_inline.py [--repeat 50]

Rows, each a median and min-max in ms over --repeat rounds (after one warm-up):

mlir= (the CPU plugin sample's import on 8 floats): a cold load (a kernel string never built:
plugin, module, import check), a warm load (the same strings again: cache hits), one call of
the loaded kernel in this process, and the same call through `iree-run-module` (the raw tool).

args= (a plain C axpy, no MLIR): the first load (program and plugin), a load of an edited
function (a plugin only: the program is a cache hit), and calls of the first version and of
three edited ones, loaded beside it in this process, interleaved round by round at n = 8 and
n = 1,000,000 (target: an edited version's call <= 1.5x the first version's).
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
from typing import Any

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
    signature_rows(pb, args.repeat)
    sys.stdout.flush()


AXPY = r"""
#include <stddef.h>
void axpy(const float* x, const float* y, float a, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a * x[i] * EDIT + y[i];
}
"""
AXPY_ARGS = "in:f32[n], in:f32[n], in:f32, out:f32[n]"


def signature_rows(pb: Any, repeat: int) -> None:
    def load(edit: int) -> Any:
        return pb.load_inline(c_source=AXPY.replace("EDIT", str(edit)), function="axpy", args=AXPY_ARGS)

    print(f"pb.load_inline(args=...), {repeat} rounds:")
    first_load = show("first load (program + plugin)", timings(lambda k: _fresh_program_load(pb, k), max(3, repeat // 10)))
    edit_load = show("load of an edited function (plugin only)", timings(lambda k: load(1000 + k), max(3, repeat // 10)))
    versions = [load(edit) for edit in (1, 2, 3, 4)]
    for n in (8, 1_000_000):
        x, y = np.ones(n, np.float32), np.ones(n, np.float32)
        rounds: list[list[float]] = [[] for _ in versions]
        for kernel in versions:
            kernel(x, y, 2.0)  # warm-up: each version's device, module and pages
        for _ in range(repeat):
            for i, kernel in enumerate(versions):
                start = time.perf_counter()
                kernel(x, y, 2.0)
                rounds[i].append((time.perf_counter() - start) * 1000)
        first = show(f"call of the first version, n={n}", rounds[0])
        edited = [show(f"call of edited version {i}, n={n}", times) for i, times in enumerate(rounds[1:], start=1)]
        print(f"ratios at n={n}: edited/first call {max(edited) / first:.2f}x (worst of {len(edited)})")
    print(f"ratio: first load / edited load {first_load / edit_load:.1f}x")


def _fresh_program_load(pb: Any, k: int) -> Any:
    """A load whose program was never built: a signature of its own (another scalar type)."""
    types = ["f32", "f64", "i32", "i64", "i16", "i8"]
    signature = f"in:f32[n], in:f32[n], in:{types[k % len(types)]}, out:f32[n]"
    source = AXPY.replace("float a,", f"{_C[types[k % len(types)]]} a,").replace("EDIT", str(k + 10_000))
    return pb.load_inline(c_source=source, function="axpy", args=signature, tile=4096 + k + 1)


_C = {"f32": "float", "f64": "double", "i32": "int", "i64": "long long", "i16": "short", "i8": "signed char"}


if __name__ == "__main__":
    main()
