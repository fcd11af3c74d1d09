"""Where a model's time goes on a Vulkan device (lavapipe on a CPU): one process, the module
loaded once, the function called N times, each phase's wall time and CPU time split by thread.

    python benchmarks/vulkan_lavapipe.py [--calls N] [--group K] [--cache DIR] [-o DIR]

The model is ONNX's light SqueezeNet (the onnx wheel's backend test data: 26 convolutions at
224x224), its ConstantOfShape weights made seeded random initializers and its opset raised to
17, imported and compiled for Vulkan (the target chosen for the device here, llvmpipe on
lavapipe); with --group K, group K is replaced by the generated GLSL kernel too (`replace
--target vulkan`). Mesa's shader cache is the directory --cache (default: a new, empty one, so
the first call compiles every shader); run again with the same --cache to see a warm cache.

Prints, per phase (device, module load, call 1, call 2, ...), its wall and CPU seconds and each
busy thread's CPU seconds. On lavapipe (Mesa 22.3) the first call's extra is lavapipe's LLVM
compiling each shader on its first dispatch (one thread, busy in the first call only); the
shaders run on lavapipe's workers (LP_NUM_THREADS); two of IREE's threads wait in lavapipe's
semaphore wait, which polls the clock. Figures: README "Vulkan on lavapipe".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def squeezenet(path: Path) -> Path:
    """The light SqueezeNet with seeded weights, opset 17."""
    import onnx
    from onnx import helper, numpy_helper, version_converter

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
    graph = onnx.load(str(light)).graph
    rng = np.random.default_rng(0)
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    weights, nodes = [], []
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            nodes.append(node)
            continue
        shape = constants[node.input[0]].astype(np.int64)
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        weights.append(numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), node.output[0]))
    inputs = []
    for value in graph.input:
        if value.name not in constants:
            inputs.append(value)
        elif not value.name.endswith("__SHAPE"):  # a bias
            weights.append(numpy_helper.from_array((rng.standard_normal(constants[value.name].shape) * 0.05).astype(np.float32), value.name))
    model = helper.make_model(helper.make_graph(nodes, "squeezenet", inputs, list(graph.output), weights), opset_imports=[helper.make_opsetid("", 9)])
    model = version_converter.convert_version(model, 17)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def module(out: Path, group: int | None) -> Path:
    import pyree_build as pb

    mlir = pb.import_onnx(squeezenet(out / "squeezenet.onnx"), out / "squeezenet.mlir")
    if group is None:
        return pb.compile(mlir, out / "squeezenet.vmfb", target="vulkan")
    kernels = out / f"g{group}"
    name = f"g{group}_kernel"
    pb.replace(mlir, kernels, ops=[group], imports=[name], target="vulkan")
    pb.spirv([kernels / f"{name}.glsl"], kernels / "spv")
    return pb.compile(
        mlir, kernels / "m.vmfb", target="vulkan", transform_spec=kernels / "spec.mlir", expect_imports=[name], object_search_paths=[kernels / "spv"]
    )


class Threads:
    """Each thread's CPU seconds (user + system) since the last look."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def look(self) -> dict[str, float]:
        now = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            now[f"{tid} {name}"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        spent = {t: s - self.last.get(t, 0.0) for t, s in now.items()}
        self.last = now
        return spent


def report(phase: str, wall: float, spent: dict[str, float], per_phase: dict[str, dict[str, float]]) -> None:
    busy = sorted(((s, t) for t, s in spent.items() if s >= 0.1), reverse=True)
    print(f"{phase:12} wall {wall:8.2f} s  cpu {sum(spent.values()):8.1f} s  threads: " + ", ".join(f"{t} {s:.1f}" for s, t in busy), flush=True)
    per_phase[phase] = spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--group", type=int, default=None, help="replace this op group (pyree-build ops --target vulkan) first")
    parser.add_argument("--cache", type=Path, default=None, help="MESA_SHADER_CACHE_DIR (default: a new empty one)")
    parser.add_argument("-o", "--out", type=Path, default=None, help="where the model and module are written (default: a temporary directory)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="pyree-vulkan-bench."))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["MESA_SHADER_CACHE_DIR"] = os.fspath(args.cache or Path(tempfile.mkdtemp(prefix="mesa-cache.")))
    vmfb = module(out, args.group)
    print(f"module {vmfb}; Mesa shader cache {os.environ['MESA_SHADER_CACHE_DIR']}", flush=True)

    from pyree_build.actions import inprocess

    threads, per_phase = Threads(), {}
    threads.look()
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
    start = time.perf_counter()
    import iree.runtime as rt

    config = rt.Config("vulkan")
    context = rt.SystemContext(config=config)
    report("device", time.perf_counter() - start, threads.look(), per_phase)
    start = time.perf_counter()
    vm_module = rt.VmModule.copy_buffer(context.instance, vmfb.read_bytes())
    context.add_vm_module(vm_module)
    entry = context.modules[vm_module.name]["squeezenet"]
    report("module load", time.perf_counter() - start, threads.look(), per_phase)
    for call in range(1, args.calls + 1):
        start = time.perf_counter()
        inprocess.to_host(config.device, entry(x))
        report(f"call {call}", time.perf_counter() - start, threads.look(), per_phase)
    if args.calls >= 2:
        first, later = per_phase["call 1"], per_phase["call 2"]
        only_first = sum(s for t, s in first.items() if s >= 1.0 and later.get(t, 0.0) < 0.05 * s)
        print(f"first call {sum(first.values()):.1f} s CPU, a later one {sum(later.values()):.1f} s; threads busy in the first call only "
              f"(lavapipe's LLVM compiling each shader): {only_first:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
