"""Issue 45: a Vulkan module's calls share one process. lavapipe compiles each shader with LLVM on
its first dispatch in a process (as much CPU as a SqueezeNet run, docs/models-at-scale.md "Vulkan on lavapipe";
Mesa's shader cache on disk spares a later process that only where it is on and warm), so
`verify` runs the module once for all its draws (run.run_calls: one child, the module loaded
once), where it ran iree-run-module once a draw; the baseline runs only on the draws where an
output fails (it is read for nothing else). The numbers are the module's own, bit for bit what
iree-run-module writes; a call the runtime refuses is run by iree-run-module, whose message is
the one a run gives. Skipped where there is no Vulkan device.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import pyree_build as pb
from pyree_build.actions import run as run_action
from pyree_build.backends.vulkan import devices as vulkan
from pyree_build.core import processes, toolchain
from pyree_build.core.errors import PyreeError

needs_vulkan = pytest.mark.skipif(not vulkan.status()[0], reason=f"no Vulkan device: {vulkan.status()[1]}")

PROGRAM = """
func.func @f(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {
  %s = arith.addf %a, %b : tensor<4x8xf32>
  %p = arith.mulf %s, %a : tensor<4x8xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<8xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<8xf32>) -> tensor<8xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>],
                         iterator_types = ["reduction", "parallel"]} ins(%p : tensor<4x8xf32>) outs(%fill : tensor<8xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %y = arith.addf %x, %acc : f32
    linalg.yield %y : f32
  } -> tensor<8xf32>
  return %p, %sum : tensor<4x8xf32>, tensor<8xf32>
}
"""


class Spawned:
    """Every process pyree_build starts, by what it runs: iree-run-module, or the calls' child."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.argvs: list[list[str]] = []
        spawn = processes.spawn

        def spy(argv, **kwargs):  # type: ignore[no-untyped-def]
            self.argvs.append([str(a) for a in argv])
            return spawn(argv, **kwargs)

        monkeypatch.setattr(processes, "spawn", spy)

    def runs(self, module: Path) -> list[list[str]]:
        """The processes that ran `module` (iree-run-module's --module=, or the child's spec)."""
        return [a for a in self.argvs if f"--module={module}" in a or any(f'"module": "{module}"' in x for x in a)]


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calls")
    (out / "f.mlir").write_text(PROGRAM)
    return pb.compile(out / "f.mlir", out / "f.vmfb", target="vulkan")


def _verify_inputs(n: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(7)
    return [[rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2)] for _ in range(n)]


@needs_vulkan
def test_calls_on_vulkan_run_in_one_process_with_iree_run_modules_numbers_bit_for_bit(module, tmp_path, monkeypatch):
    calls = _verify_inputs(3)
    spawned = Spawned(monkeypatch)
    results = run_action.run_calls(module, "f", calls, device="vulkan")
    [child] = spawned.runs(module)
    assert "pyree_build.actions.run_calls" in child, child
    assert len(results) == 3 and all(len(r) == 2 for r in results)
    for k, inputs in enumerate(calls):
        # The numbers iree-run-module itself writes (--output=@x.npy: exact, never printed text).
        files = []
        for i, array in enumerate(inputs):
            np.save(tmp_path / f"in{k}_{i}.npy", array)
            files.append(f"--input=@{tmp_path / f'in{k}_{i}.npy'}")
        outs = [tmp_path / f"out{k}_{j}.npy" for j in range(2)]
        processes.spawn(
            toolchain.iree_run_module().command(f"--module={module}", "--function=f", "--device=vulkan", *files, *(f"--output=@{o}" for o in outs)),
            what="iree-run-module",
        )
        for got, out in zip(results[k], outs):
            want = np.load(out)
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), (k, out.name)


@needs_vulkan
def test_a_passing_verify_on_vulkan_runs_the_module_once_for_all_its_draws_and_never_the_baseline(tmp_path, monkeypatch):
    from support import onnx_models  # noqa: PLC0415 - needs onnx, imported where the test runs

    pytest.importorskip("onnxruntime")
    model = tmp_path / "mlp.onnx"
    onnx_models.save(onnx_models.mlp(), model)
    mlir = pb.import_onnx(model, tmp_path / "mlp.mlir")
    module = pb.compile(mlir, tmp_path / "m.vmfb", target="vulkan")
    base = Path(shutil.copy(module, tmp_path / "base.vmfb"))  # IREE's own module, as the module is here
    spawned = Spawned(monkeypatch)
    result = pb.verify(module, model, baseline=base, device="vulkan")
    assert result.passed and len(result.trials) == 3, result.render()
    # One process (its pipelines built once), where there were three iree-run-modules; the baseline,
    # read only for an output that fails, never ran (there were three more).
    assert len(spawned.runs(module)) == 1 and spawned.runs(base) == [], spawned.argvs


@needs_vulkan
def test_a_failing_kernel_runs_the_baseline_on_the_failing_draws_on_its_own_device(tmp_path, monkeypatch):
    # A replaced dense layer with a bias bug fails every draw: the baseline (IREE's own module for
    # the CPU, run on local-sync by default, one iree-run-module a draw) runs on each and passes, so
    # the kernel is blamed, not IREE.
    from support import onnx_models  # noqa: PLC0415

    pytest.importorskip("onnxruntime")
    model = tmp_path / "m.onnx"
    onnx_models.save(onnx_models.matmul_add_relu(), model)
    mlir = pb.import_onnx(model, tmp_path / "m.mlir")
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[1], imports=["dense"], target="vulkan")
    shader = out / "dense.glsl"
    assert shader.read_text().count("float acc = c1;") == 1
    shader.write_text(shader.read_text().replace("float acc = c1;", "float acc = c1 + 1.0;"))
    pb.spirv([shader], out / "spv")
    module = pb.compile(mlir, out / "m.vmfb", target="vulkan", transform_spec=out / "spec.mlir", expect_imports=["dense"], object_search_paths=[out / "spv"])
    base = pb.compile(mlir, tmp_path / "cpu.vmfb")
    spawned = Spawned(monkeypatch)
    result = pb.verify(module, model, baseline=base)
    assert not result.passed and all(not t.passed for t in result.trials), result.render()
    assert all(o.verdict == "mismatch" for t in result.trials for o in t.outputs), result.render()
    assert len(spawned.runs(module)) == 1 and len(spawned.runs(base)) == 3, spawned.argvs
    assert all("--device=local-sync" in a for a in spawned.runs(base)), spawned.runs(base)


@needs_vulkan
def test_a_call_the_runtime_refuses_is_named_by_iree_run_module_as_a_run_names_it(module, monkeypatch):
    wrong = [[np.ones((4, 8), np.float32), np.ones((3, 8), np.float32)]] * 2
    with pytest.raises(PyreeError) as alone:
        run_action.run_to_arrays(module, "f", wrong[0], device="vulkan")
    spawned = Spawned(monkeypatch)
    with pytest.raises(PyreeError) as together:
        run_action.run_calls(module, "f", wrong, device="vulkan")
    assert together.value.what == alone.value.what
    assert "shape" in (together.value.details or "") or "mismatch" in (together.value.details or ""), together.value.details
    # The child was asked first; iree-run-module named the problem.
    assert [("run_calls" in " ".join(a)) for a in spawned.runs(module)] == [True, False], spawned.argvs


def test_calls_on_the_cpu_are_one_iree_run_module_each_as_before(tmp_path, monkeypatch):
    (tmp_path / "f.mlir").write_text(PROGRAM)
    cpu = pb.compile(tmp_path / "f.mlir", tmp_path / "f.vmfb")
    spawned = Spawned(monkeypatch)
    results = run_action.run_calls(cpu, "f", _verify_inputs(2), device="local-sync")
    assert len(results) == 2 and len(spawned.runs(cpu)) == 2 and not any("run_calls" in " ".join(a) for a in spawned.argvs), spawned.argvs
