"""What keeping weights out of the MLIR text saves at model size (issue 45).

    python benchmarks/model_params.py [--layers 4] [--width 2048] [--repeat 1]

A chain of `--layers` MatMul + Relu layers of `--width` x `--width` f32 weights (4 layers of
2048: 64 MB), built with the onnx helper API, is imported and compiled (llvm-cpu) with its
weights inline (`import --inline-params`) and externalized (the default: OUT_params.irpa,
imported back by compile), alternating, with pyree_build's cache off. Prints each step's
median seconds, the MLIR's size, and the ratio inline / externalized; then checks that both
modules compute the same numbers (the externalized module run away from its archive).
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

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(layers: int, width: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"W{i}"))
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"fc{i}"), helper.make_node("Relu", [f"m{i}"], [f"h{i}"], name=f"relu{i}")]
        x = f"h{i}"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])], weights,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def timed(*argv: str | os.PathLike[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pyree_build", *map(os.fspath, argv)], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    os.environ["PYREE_BUILD_CACHE"] = "off"
    with tempfile.TemporaryDirectory(prefix="pyree-params-bench.") as tmp:
        work = Path(tmp)
        onnx_file = work / "chain.onnx"
        onnx.save(model(args.layers, args.width), onnx_file, save_as_external_data=True, location="chain.weights")
        megabytes = args.layers * args.width * args.width * 4 / 1e6
        print(f"{args.layers} layers of {args.width}x{args.width} f32: {megabytes:.0f} MB of weights")
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeat):
            for mode, flags in (("inline", ["--inline-params"]), ("externalized", [])):
                mlir, vmfb = work / f"{mode}.mlir", work / f"{mode}.vmfb"
                times.setdefault((mode, "import"), []).append(timed("import", onnx_file, "-o", mlir, "--force", *flags))
                times.setdefault((mode, "compile"), []).append(timed("compile", mlir, "-o", vmfb))
        print(f"{'step':10} {'inline':>10} {'extern.':>10} {'ratio':>7}")
        for step in ("import", "compile"):
            a, b = statistics.median(times[("inline", step)]), statistics.median(times[("externalized", step)])
            print(f"{step:10} {a:9.1f}s {b:9.1f}s {a / b:6.1f}x")
        print(
            f"MLIR: inline {(work / 'inline.mlir').stat().st_size / 1e6:.1f} MB, externalized {(work / 'externalized.mlir').stat().st_size} bytes "
            f"+ archive {(work / 'externalized_params.irpa').stat().st_size / 1e6:.1f} MB"
        )
        (work / "externalized_params.irpa").unlink()  # the module needs no archive
        import pyree_build as pb

        x = np.random.default_rng(1).uniform(-1, 1, (1, args.width)).astype(np.float32)
        same = np.array_equal(pb.run(work / "inline.vmfb", "chain", [x])[0], pb.run(work / "externalized.vmfb", "chain", [x])[0])
        print(f"same numbers: {same}")


if __name__ == "__main__":
    main()
