"""The kernels `replace` generates against IREE's own code, untuned and tuned, side by side in one interleaved run.

    python benchmarks/kernels.py [--cases dense128,dense256,softmax] [--rounds 7] [--devices local-sync,local-task]
                                 [--cpu generic|host] [--tune-budget 20] [--no-tune] [--keep DIR]

The cases (issue 36's targets):
- `dense128`, `dense256`: a dense layer, MatMul + Add + Relu (x[M,K] @ W[K,N] + b[N], relu) at
  128x512 @ 512x512 and 256x1024 @ 1024x1024;
- `softmax`: the attention block's softmax group (tests/support/onnx_models.py's transformer block: max,
  exp(x - max) summed, divide) over the scores of 4 heads x 256 tokens, x[4,256,256].

Each model is built with the onnx helper API, imported, its one group replaced by the generated
C, the plugin built with the knobs at their defaults (untuned), and the module checked against
onnxruntime (`verify`) before anything is timed. Then `tune` sweeps the knobs the C declares
(no --param) on each device, against onnxruntime, and the winner is built (tuned). Then IREE's
module, the untuned and the tuned plugin are timed in turn, `rounds` times, on each device, so
drift in clock speed or load hits all alike. Printed: each side's median, its ratio to IREE's
median, and the spread of the per-round ratios (the noise). Targets: untuned <= 2x, tuned <= 1x.

`--cpu` is the CPU both sides are built for: `generic` compiles the module for a generic CPU
and the plugin for the arch's baseline; `host` compiles both for this machine's CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import helper

import pyree_build as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # support/onnx_models.py

from support import onnx_models  # noqa: E402

CASES = {
    "dense128": ("MatMul + Add + Relu, x 128x512 @ W 512x512", (128, 512)),
    "dense256": ("MatMul + Add + Relu, x 256x1024 @ W 1024x1024", (256, 1024)),
    "softmax": ("attention softmax (max, exp sum, divide), x 4x256x256 over the last axis", (4, 256, 256)),
}


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def _model(case: str) -> tuple[object, tuple[int, ...]]:
    if case.startswith("dense"):
        m, k = CASES[case][1]
        return onnx_models.dense_layer(m, k, k), (m, k)
    shape = CASES[case][1]
    node = helper.make_node("Softmax", ["x"], ["y"], name="attn", axis=-1)
    return onnx_models._model("attn", [node], {"x": shape}, {"y": shape}), shape


def run_case(case: str, work: Path, args: argparse.Namespace) -> None:
    work.mkdir(parents=True, exist_ok=True)
    model_proto, x_shape = _model(case)
    function = model_proto.graph.name  # the module's function is the model's graph
    model = work / f"{case}.onnx"
    onnx_models.save(model_proto, model)
    mlir = pb.import_onnx(model, work / f"{case}.mlir")
    pb.replace(mlir, work / "kernels", ops=[1], imports=[case], onnx=model, force=True)
    source = work / "kernels" / f"{case}.c"
    plugin_cpu = "baseline" if args.cpu == "generic" else "host"
    untuned = pb.plugin(source, work / "untuned.so", cpu=plugin_cpu)
    iree = pb.compile(mlir, work / "iree.vmfb", cpu=args.cpu)
    replaced = pb.compile(mlir, work / "replaced.vmfb", cpu=args.cpu, transform_spec=work / "kernels" / "spec.mlir", expect_imports=[case])
    print(pb.verify(replaced, model, plugins=[untuned], baseline=iree).render())
    rng = np.random.default_rng(0)
    np.save(work / "x.npy", rng.uniform(-1, 1, x_shape).astype(np.float32))
    inputs = [f"@{work / 'x.npy'}"]
    devices = args.devices.split(",")
    tuned: dict[str, tuple[Path, str]] = {}
    if not args.no_tune:
        for device in devices:
            best = work / f"best-{device}.json"
            result = pb.tune(source, best, module=replaced, function=function, onnx=model, device=device, cpu=plugin_cpu, budget=args.tune_budget,
                             build_dir=work / f"variants-{device}")  # fmt: skip
            assert result.best is not None, result.render()
            tuned[device] = (pb.tune.build_tuned([source], work / f"tuned-{device}.so", tuned=best, cpu=plugin_cpu), result.best.label)
    print(f"\n{CASES[case][0]}, cpu {args.cpu}, {args.rounds} rounds alternated (this machine):")
    for device in devices:
        sides: list[tuple[Path, list[Path]]] = [(iree, []), (replaced, [untuned])]
        names = ["IREE", "generated, untuned"]
        if device in tuned:
            sides.append((replaced, [tuned[device][0]]))
            names.append(f"generated, tuned ({tuned[device][1]})")
        result = pb.bench.compare_many(sides, function, inputs=inputs, device=device, rounds=args.rounds)
        for name, side in zip(names, result.sides):
            ratio = "" if side is result.sides[0] else f"  / IREE {side.ratio:.2f}x (per round {side.ratio_min:.2f} - {side.ratio_max:.2f})"
            print(f"  {device:<11} {name:<48} {_fmt(side.median_ms):>10}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"which of {', '.join(CASES)} (default all)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--devices", default="local-sync,local-task")
    parser.add_argument("--cpu", choices=("generic", "host"), default="generic")
    parser.add_argument("--tune-budget", type=float, default=20.0, help="tune's budget in seconds, per case and device")
    parser.add_argument("--no-tune", action="store_true", help="time the untuned kernels only")
    parser.add_argument("--keep", type=Path, help="work in this directory (kept) instead of a temporary one")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="pyree-kernels-bench."))
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"unknown case {case!r}: choose from {', '.join(CASES)}")
        run_case(case, work / case, args)


if __name__ == "__main__":
    main()
