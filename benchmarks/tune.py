"""The mlp_plugin sample's kernel, tuned: its fastest MATMUL_RELU_TILE against the untuned kernel
(tile 1) and against IREE's own code for the same op, measured side by side in one run.

    python benchmarks/tune.py [--size M,K,N] [--tiles 1,2,4,8,16] [--rounds 7]

The sample's program (relu(x @ w) + b) at a realistic size: the spec replaces relu(matmul) with
the plugin's import in one module, the other is all IREE's code. `pb.tune` picks the tile (each
tile checked against IREE's module first); then the three are timed in alternation, `rounds`
times, so drift in clock speed or load hits all alike. Printed: each one's median time (min -
max) and the ratios of the medians, with the min - max of the per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

import pyree_build as pb

REPO = Path(__file__).resolve().parent.parent
MLP = REPO / "samples" / "custom_dispatch" / "cpu" / "mlp_plugin"


def program(m: int, k: int, n: int) -> str:
    """mlp.mlir at another size (the spec matches any size)."""
    text = (MLP / "mlp.mlir").read_text(encoding="utf-8")
    return text.replace("4x3xf32", f"{m}x{k}xf32").replace("3x5xf32", f"{k}x{n}xf32").replace("4x5xf32", f"{m}x{n}xf32").replace("<5xf32>", f"<{n}xf32>")


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="128,256,256", help="M,K,N of x (MxK) @ w (KxN) (default 128,256,256)")
    parser.add_argument("--tiles", default="1,2,4,8,16", help="MATMUL_RELU_TILE values to sweep")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.size.split(","))
    with tempfile.TemporaryDirectory(prefix="pyree-tune-bench.") as scratch:  # removed however the run ends
        run(args, m, k, n, Path(scratch))


def run(args: argparse.Namespace, m: int, k: int, n: int, work: Path) -> None:
    (work / "mlp.mlir").write_text(program(m, k, n), encoding="utf-8")
    with_plugin = pb.compile(work / "mlp.mlir", work / "with_plugin.vmfb", transform_spec=MLP / "matmul_relu_spec.mlir", expect_imports=["fused_matmul_relu"])
    iree = pb.compile(work / "mlp.mlir", work / "iree.vmfb")
    rng = np.random.default_rng(0)
    arrays = {"x": rng.uniform(-1, 1, (m, k)), "w": rng.uniform(-1, 1, (k, n)), "b": rng.uniform(-1, 1, n)}
    for name, array in arrays.items():
        np.save(work / f"{name}.npy", array.astype(np.float32))
    inputs = [f"@{work / name}.npy" for name in arrays]
    source = MLP / "matmul_relu_plugin.c"
    tuned = pb.tune(source, work / "best.json", params={"MATMUL_RELU_TILE": args.tiles.split(",")}, module=with_plugin, function="mlp",
                    inputs=inputs, reference=iree, rtol=1e-4, atol=1e-5, budget=5)  # fmt: skip
    print(tuned.render())
    assert tuned.best is not None
    untuned = pb.plugin(source, work / "untuned.so")  # the default tile, 1
    best = pb.tune.build_tuned([source], work / "tuned.so", tuned=work / "best.json")
    sides = {
        "untuned plugin (tile 1)": (with_plugin, [untuned]),
        f"tuned plugin ({tuned.best.label})": (with_plugin, [best]),
        "IREE's own code": (iree, []),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, (module, plugins) in sides.items():
            result = pb.bench(module, "mlp", inputs=inputs, plugins=plugins, repetitions=3)
            times[name].append(sum(t.median_ms for t in result.timings))
    print(f"\nrelu(x @ w) + b, x {m}x{k}, w {k}x{n}, {args.rounds} rounds alternated (this machine):")
    for name, samples in times.items():
        print(f"  {name:<40} median {_fmt(statistics.median(samples)):>10}  ({_fmt(min(samples))} - {_fmt(max(samples))})")
    names = list(sides)
    for a, b in ((names[0], names[1]), (names[2], names[1]), (names[2], names[0])):
        ratios = [x / y for x, y in zip(times[a], times[b])]
        ratio = statistics.median(times[a]) / statistics.median(times[b])
        print(f"  {a} / {b}: {ratio:.2f}x  (per round {min(ratios):.2f} - {max(ratios):.2f})")


if __name__ == "__main__":
    main()
