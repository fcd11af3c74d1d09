"""The kernel `replace` generates against IREE's own code, side by side in one interleaved run.

    python benchmarks/kernels.py [--size M,K,N] [--rounds 5] [--devices local-sync,local-task] [--cpu generic|host] [--keep DIR]

A dense layer, MatMul + Add + Relu (x[M,K] @ W[K,N] + b[N], relu), built with the onnx helper
API at a realistic size (default 128x512 @ 512x512), imported, its one group replaced by the
generated C (untuned: the knobs at their defaults), the plugin built, and both modules checked
against onnxruntime (`verify`) before anything is timed. Then `bench --compare` alternates
IREE's module and the replaced one, `rounds` times, on each device, so drift in clock speed or
load hits both alike. Printed: each side's median and the ratio replaced / IREE (the target is
<= 2x on local-sync).

`--cpu` is the CPU both sides are built for: `generic` compiles the module for a generic CPU
and the plugin for the arch's baseline; `host` compiles both for this machine's CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import pyree_build as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import onnx_models  # noqa: E402


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="128,512,512", help="M,K,N of x (MxK) @ W (KxN) (default 128,512,512)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--devices", default="local-sync,local-task")
    parser.add_argument("--cpu", choices=("generic", "host"), default="generic")
    parser.add_argument("--keep", type=Path, help="work in this directory (kept) instead of a temporary one")
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.size.split(","))
    work = args.keep or Path(tempfile.mkdtemp(prefix="pyree-kernels-bench."))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "dense.onnx"
    onnx_models.save(onnx_models.dense_layer(m, k, n), model)
    mlir = pb.import_onnx(model, work / "dense.mlir")
    pb.replace(mlir, work / "kernels", ops=[1], imports=["dense"], onnx=model, force=True)
    plugin = pb.plugin(work / "kernels" / "dense.c", work / "dense.so", cpu="baseline" if args.cpu == "generic" else "host")
    iree = pb.compile(mlir, work / "iree.vmfb", cpu=args.cpu)
    replaced = pb.compile(mlir, work / "replaced.vmfb", cpu=args.cpu, transform_spec=work / "kernels" / "spec.mlir", expect_imports=["dense"])
    print(pb.verify(replaced, model, plugins=[plugin], baseline=iree).render())
    rng = np.random.default_rng(0)
    np.save(work / "x.npy", rng.uniform(-1, 1, (m, k)).astype(np.float32))
    inputs = [f"@{work / 'x.npy'}"]
    print(f"\nMatMul + Add + Relu, x {m}x{k} @ W {k}x{n}, cpu {args.cpu}, {args.rounds} rounds alternated (this machine):")
    for device in args.devices.split(","):
        result = pb.bench.compare(iree, replaced, "dense", inputs=inputs, plugins=[plugin], device=device, rounds=args.rounds)
        print(f"  {device:<11} IREE {_fmt(result.a_median_ms):>10}  generated {_fmt(result.b_median_ms):>10}  "
              f"generated / IREE {result.ratio:.2f}x (per round {result.ratio_min:.2f} - {result.ratio_max:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
