"""Issue 47's benchmarks, the parts that decide what they time (the benchmarks run on demand).
benchmarks/kernels.py times whole models with groups merged into one kernel where `replace`
fuses them (a Linear and its GELU), asked of `replace`, never read from the model's node names:
a model is data, and a name is no evidence of what a node computes; checked here on a model
whose names say the opposite. benchmarks/kernel_alone.py times a generated kernel without IREE
around it, sized from the kernel's own argument block."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, benchmark_module

import pyree_build as pb

pytest.importorskip("onnx", reason="the model is built with onnx's helper API: pip install pyree_build[onnx]")

from support import onnx_models  # noqa: E402


def _benchmark() -> Any:
    return benchmark_module("kernels")


def test_groups_are_merged_where_replace_fuses_them_whatever_the_nodes_are_called(tmp_path: Path) -> None:
    bench = _benchmark()
    proto = onnx_models.gemm_gelu_norm()  # Gemm -> erf GELU -> LayerNorm -> MatMul -> Softmax
    for n, node in enumerate(proto.graph.node):
        node.name = f"node{n}"  # the benchmark's old rule merged nodes named gelu or softmax: none here
    model = onnx_models.save(proto, tmp_path / "user.onnx")
    mlir = pb.import_onnx(model, tmp_path / "user.mlir")
    groups = [g for g in pb.ops(mlir) if g.replaceable]
    units = [bench._members(u) for u in bench._merged(mlir, groups, tmp_path)]
    ops = [[op for g in unit for op in g.ops] for unit in units]
    tags = [bench._tag(u) for u in units]

    # The Gemm with its GELU and the LayerNorm after it, and the MatMul with its Softmax: each a
    # tiled nest, then the row passes; never the MatMul merged after the LayerNorm (a reduction
    # of its own, which would recompute what it reads at every step).
    assert len(units) == 2, tags
    assert all(sum(op.startswith("linalg.matmul") for op in o) == 1 for o in ops), ops
    assert any("math.erf" in op for op in ops[0]) and any("math.exp" in op for op in ops[1]), ops
    assert sorted(g.index for unit in units for g in unit) == [g.index for g in groups]
    for unit in units:
        probe = tmp_path / "probe" / bench._tag(unit)
        pb.replace(mlir, probe, ops=[tuple(g.index for g in unit)], imports=["probe"])
        assert bench.REFERENCE_FORM not in (probe / "probe.c").read_text(encoding="utf-8")


def test_kernel_alone_times_a_generated_kernel_from_its_argument_block(tmp_path: Path) -> None:
    """benchmarks/kernel_alone.py sizes every tensor from the comments `replace` writes in the
    argument block, builds a harness around the kernel and times it; bad input is refused."""
    model = onnx_models.save(onnx_models.gemm_gelu_norm(), tmp_path / "user.onnx")
    mlir = pb.import_onnx(model, tmp_path / "user.mlir")
    pb.replace(mlir, tmp_path / "k", ops=[1], imports=["linear"])
    kernel = tmp_path / "k" / "linear.c"
    script = [sys.executable, str(REPO / "benchmarks" / "kernel_alone.py")]
    done = subprocess.run([*script, str(kernel), "--flops", "2*4*64*64", "-D", "PYREE_TILE_ROWS=2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = re.search(r"([\d.]+) us per call, alone \(best of 15, cpu host, PYREE_TILE_ROWS=2\), ([\d.]+) GFLOP/s", done.stdout)
    assert found and float(found.group(1)) > 0 and float(found.group(2)) > 0, done.stdout

    for bad, message in [
        ([str(REPO / "README.md")], "no `..._args_t` argument block"),
        ([str(kernel), "--flops", "2x"], "--flops takes a product of integers"),
        ([str(kernel), "-D", "PYREE_TILE_ROWS=2;rm"], "-D takes KNOB=VALUE"),
    ]:
        refused = subprocess.run([*script, *bad], capture_output=True, text=True, timeout=300)
        assert refused.returncode == 1 and message in refused.stderr, refused.stderr
