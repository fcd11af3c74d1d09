"""This machine's roofline for the generated kernels: peak float FLOP/s of one core and memory
bandwidth, measured here, for the CPU a plugin is built for.

    python benchmarks/roofline.py [--cpu baseline,host]

A small C program (built with zig cc, as plugins are) times, in thread CPU time (so time this
thread is descheduled on a shared machine does not count): 12 independent chains of vector
multiply + add (x = x * m + d; without fast-math every step is kept) on the widest vectors the
CPU has, first as a multiply, then an add (clang contracts the two within one expression by
default: not here), then, where the CPU has them, as fused multiply-adds, which the generated
kernels' accumulators are (PYREE_FP_CONTRACT): their peak. Some cores (AMD's Zen 4) issue
multiplies and adds to pipes of their own and reach the fused FLOP/s both ways; on others the
fused peak is twice the other. Then a 256 MiB scaled copy (read + write), best of 5. Compare a
kernel's FLOP/s (2 M K N / time for a dense layer) with the fused peak, and its bytes / time
with the bandwidth, to see which bound it is near.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__AVX512F__)
#define BYTES 64
#elif defined(__AVX__)
#define BYTES 32
#else
#define BYTES 16
#endif
typedef float vec __attribute__((vector_size(BYTES)));
#define LANES (BYTES / 4)
#define CHAINS 12
// Without asking, clang splits 512-bit vectors into two 256-bit halves on CPUs it tunes for 256-bit
// vectors (Intel's server cores): the "512-bit" peak measured there was the 256-bit one, half.
#define WIDE __attribute__((min_vector_width(BYTES * 8)))
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
// Each pragma holds to the end of the file: the fused chains come last.
#pragma clang fp contract(off)
static WIDE double separate_peak(vec* a, vec m, vec d, long iters) {
  double t0 = now();
  for (long n = 0; n < iters; ++n) {
    for (int i = 0; i < CHAINS; ++i) a[i] = a[i] * m + d;
  }
  return 2.0 * CHAINS * LANES * iters / (now() - t0) / 1e9;
}
#pragma clang fp contract(fast)
static WIDE double fused_peak(vec* a, vec m, vec d, long iters) {
  double t0 = now();
  for (long n = 0; n < iters; ++n) {
    for (int i = 0; i < CHAINS; ++i) a[i] = a[i] * m + d;
  }
  return 2.0 * CHAINS * LANES * iters / (now() - t0) / 1e9;
}
WIDE int main(void) {
  vec a[CHAINS], m, d;
  for (int j = 0; j < LANES; ++j) { m[j] = 0.999999f; d[j] = 1e-7f; }
  for (int i = 0; i < CHAINS; ++i) for (int j = 0; j < LANES; ++j) a[i][j] = 1.0f + i + j;
  long iters = 200000000 / LANES;
  double separate = separate_peak(a, m, d, iters);
  double fused = 0;
#if defined(__FMA__) || defined(__aarch64__)
  fused = fused_peak(a, m, d, iters);
#endif
  float s = 0; for (int i = 0; i < CHAINS; ++i) for (int j = 0; j < LANES; ++j) s += a[i][j];
  printf("peak      %7.1f GFLOP/s  (one core, %d-bit vectors, multiply, then add; checksum %g)\n", separate, BYTES * 8, s);
  if (fused > 0) printf("fused     %7.1f GFLOP/s  (one core, %d-bit fused multiply-adds: the generated kernels' peak)\n", fused, BYTES * 8);
  size_t n = (size_t)64 << 20; float* x = malloc(n * 4); float* y = malloc(n * 4);
  if (!x || !y) return 1;
  for (size_t i = 0; i < n; ++i) { x[i] = (float)i; y[i] = 0; }
  double best = 1e9;
  for (int r = 0; r < 5; ++r) { double u = now(); for (size_t i = 0; i < n; ++i) y[i] = 2.0f * x[i]; double v = now(); if (v - u < best) best = v - u; }
  printf("bandwidth %7.1f GB/s     (one core, 256 MiB read + 256 MiB written, best of 5; %g)\n", 2.0 * n * 4 / best / 1e9, y[n / 2]);
  return 0;
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", default="baseline,host", help="zig cc -mcpu values (host: native)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pyree-roofline."))
    source = work / "roofline.c"
    source.write_text(PROGRAM, encoding="utf-8")
    for cpu in args.cpu.split(","):
        exe = work / f"roofline-{cpu}"
        mcpu = "native" if cpu == "host" else cpu
        subprocess.run([sys.executable, "-m", "ziglang", "cc", "-O2", f"-mcpu={mcpu}", str(source), "-o", str(exe)], check=True)
        print(f"cpu {cpu}:")
        print(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout, end="")


if __name__ == "__main__":
    main()
