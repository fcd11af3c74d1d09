"""A generated kernel's own time, without IREE around it: how far it is from the roofline.

    python benchmarks/kernel_alone.py KERNEL.c [--cpu host|baseline] [--flops 2*128*256*256] [-D PYREE_FAST_MATH=1 ...]

`replace` writes each kernel's argument block with every tensor's static type in a comment
(`const float* in0;  // tensor<128x256xf32>`). From those this builds a small C program that
includes the kernel, allocates each tensor (floats filled with values in [0.5, 1.5), integers
with zeros: a valid index), calls the kernel as one workgroup covering the whole result, and
times the call in thread CPU time (best of 15 runs of calls adding up to at least 20 ms), built
with zig cc and the flags `pb.plugin` builds a system plugin with, for the same CPU
(`benchmarks/roofline.py` uses the same -mcpu values); `-D KNOB=VALUE` sets one of the knobs
the kernel declares (`pyree-tune:` lines), as `tune` builds a variant.

Compare the time with the kernel's group timed by `kernels.py --groups` (IREE's program around
the same call: imports, dispatch, copies) and, given `--flops` (a product of integers, e.g.
2*M*K*N for a matmul), its GFLOP/s with the fused peak `roofline.py` measures: a kernel at the
peak can be beaten by no schedule; what IREE's own module does around it is then the rest.
A kernel whose types are not all static is refused (its sizes are not in the source).
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pyree_build.backends.llvm_cpu import plugins
from pyree_build.core import toolchain

STRUCT = re.compile(r"\}\s*(\w+)_args_t;")
TENSOR = re.compile(r"^\s+(?:const )?(\w+)\* (\w+);\s+// tensor<([^>]*)>", re.M)
SIZE = re.compile(r"^\s+int32_t (\w+)_d(\d+);", re.M)


def _shape(text: str) -> list[int]:
    """`128x256xf32` -> [128, 256]; `f32` -> []; a dynamic size is refused."""
    dims = text.split("x")[:-1]
    if not all(d.isdigit() for d in dims):
        sys.exit(f"kernel_alone: tensor<{text}> has a dynamic size; only kernels of static shapes can be timed alone")
    return [int(d) for d in dims]


def harness(source: Path) -> str:
    """The C program that includes `source` and times its kernel."""
    text = source.read_text(encoding="utf-8")
    found = STRUCT.search(text)
    if not found:
        sys.exit(f"kernel_alone: {source} has no `..._args_t` argument block; is it a kernel `replace` generated?")
    name = found.group(1)
    tensors = {field: (ctype, _shape(t)) for ctype, field, t in TENSOR.findall(text)}
    lines = [
        "#define _POSIX_C_SOURCE 199309L  // clock_gettime under -std=c17",
        f'#include "{source.resolve()}"',
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "#include <string.h>",
        "#include <time.h>",
    ]
    lines += ["static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }"]
    lines += ["int main(void) {", f"  {name}_args_t args; memset(&args, 0, sizeof args);"]
    for field, (ctype, shape) in tensors.items():
        count = math.prod(shape)
        lines += [f"  {ctype}* {field} = calloc({count}, sizeof({ctype}));"]
        if ctype in ("float", "double"):
            lines += [f"  for (long i = 0; i < {count}; ++i) {field}[i] = ({ctype})(0.5 + (i % 97) / 97.0);"]
        lines += [f"  args.{field} = {field};"]
    for field, dim in SIZE.findall(text):
        lines += [f"  args.{field}_d{dim} = {tensors[field][1][int(dim)]};"]
    lines += [
        "  args.workgroup_id = 0; args.workgroup_count = 1;",
        f"  {name}_import(&args, NULL, NULL);",
        "  long calls = 1; double t0 = now();",
        f"  while (now() - t0 < 0.02) {{ {name}_import(&args, NULL, NULL); ++calls; }}",
        "  double best = 1e9;",
        "  for (int r = 0; r < 15; ++r) {",
        f"    double t = now(); for (long n = 0; n < calls; ++n) {name}_import(&args, NULL, NULL);",
        "    t = (now() - t) / calls; if (t < best) best = t;",
        "  }",
        '  printf("%.9f\\n", best);',
        "  return 0;",
        "}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", type=Path, help="a kernel .c that `replace` wrote")
    parser.add_argument("--cpu", default="host", help="zig cc -mcpu value (host: native)")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="KNOB=VALUE", help="a knob's value, as tune builds a variant")
    parser.add_argument("--flops", default=None, help="the kernel's floating-point operations, a product such as 2*128*256*256")
    args = parser.parse_args()
    if args.flops and not re.fullmatch(r"\d+(\*\d+)*", args.flops):
        sys.exit(f"kernel_alone: --flops takes a product of integers such as 2*128*256*256, got '{args.flops}'")
    for define in args.defines:
        if not re.fullmatch(r"[A-Za-z_]\w*=[\w.+-]+", define):
            sys.exit(f"kernel_alone: -D takes KNOB=VALUE, as the kernel's `pyree-tune:` lines name them, got '{define}'")
    work = Path(tempfile.mkdtemp(prefix="pyree-kernel-alone."))
    (work / "harness.c").write_text(harness(args.kernel), encoding="utf-8")
    mcpu = "native" if args.cpu == "host" else args.cpu
    include = toolchain.include_dir()
    build = [sys.executable, "-m", "ziglang", "cc", *plugins.SYSTEM_CFLAGS, f"-mcpu={mcpu}", f"-I{include}", *(f"-D{d}" for d in args.defines)]
    subprocess.run([*build, str(work / "harness.c"), "-o", str(work / "harness")], check=True)
    seconds = float(subprocess.run([str(work / "harness")], check=True, capture_output=True, text=True).stdout)
    knobs = f", {' '.join(args.defines)}" if args.defines else ""
    line = f"{args.kernel}: {seconds * 1e6:.1f} us per call, alone (best of 15, cpu {args.cpu}{knobs})"
    if args.flops:
        line += f", {math.prod(int(f) for f in args.flops.split('*')) / seconds / 1e9:.1f} GFLOP/s"
    print(line)


if __name__ == "__main__":
    main()
