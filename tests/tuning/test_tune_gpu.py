"""Issue 37: `tune` of a GPU kernel that `replace --target` wrote. Each variant is the kernel built
with its -D values by the target's backend and the program compiled again with the spec against
that object (its own module), checked against onnxruntime on the target's device and timed there;
the choice and best.json are the CPU tune's. On this machine the device is lavapipe (a CPU
Vulkan driver); CUDA and HIP variants build and compile, then the tune says it needs the GPU.
Everything is real: no tool is mocked. Sweeps are two values, few rounds (CI time).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import assert_clean_error, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

import pyree_build as pb
from pyree_build import backends
from pyree_build.backends.vulkan import devices as vulkan
from pyree_build.tuning import gpu as tune_gpu

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from support import onnx_models  # noqa: E402

needs_vulkan = pytest.mark.skipif(not vulkan.status()[0], reason=f"no Vulkan device: {vulkan.status()[1]}")
FUNCTION = "matmul_add_relu"
QUICK = ("--max-rounds", "3", "--budget", "2", "--repetitions", "2")


def _replaced(tmp_path: Path, target: str) -> tuple[Path, Path, Path]:
    """The model, its program and replace's directory for group 1 (the dense layer) as `dense`."""
    model = tmp_path / "m.onnx"
    onnx_models.save(onnx_models.matmul_add_relu(), model)
    mlir = tmp_path / "m.mlir"
    pb.import_onnx(model, mlir)
    out = tmp_path / target
    pb.replace(mlir, out, ops=[1], imports=["dense"], onnx=model, target=target)
    return model, mlir, out


def _tune_args(kernel: Path, mlir: Path, out: Path, model: Path, best: Path, target: str, *params: str) -> list[object]:
    param_args = [a for p in params for a in ("--param", p)]
    return ["tune", kernel, "--target", target, "--program", mlir, "--spec", out / "spec.mlir", "--function", FUNCTION, "--onnx", model,
            *param_args, *QUICK, "-o", best]  # fmt: skip


@needs_vulkan
def test_a_vulkan_kernel_is_tuned_over_its_workgroup_size_and_the_applied_winner_verifies(tmp_path):
    model, mlir, out = _replaced(tmp_path, "vulkan")
    best = tmp_path / "best.json"
    result = run_cli(*_tune_args(out / "dense.glsl", mlir, out, model, best, "vulkan", "PYREE_WG_SIZE=64,32"))
    assert result.returncode == 0, result
    record = json.loads(best.read_text())
    declared = pb.tune.declared_params(out / "dense.glsl")["PYREE_WG_SIZE"]
    winner = record["winner"]["params"]["PYREE_WG_SIZE"]
    assert winner in declared and winner in ("64", "32")
    # Every variant was checked against onnxruntime on the Vulkan device and measured.
    assert sorted(v["params"]["PYREE_WG_SIZE"] for v in record["variants"]) == ["32", "64"]
    assert all(v["status"] == "ok" and v["samples_ms"] for v in record["variants"]), record["variants"]
    assert record["measured"]["device"] == "vulkan" and record["build"]["target"] == "vulkan"
    # Each variant has its own module, compiled with its own SPIR-V (the object is embedded) and
    # its own spec: the workgroups counted for its size.
    variants = tmp_path / "best.variants"
    assert (variants / "PYREE_WG_SIZE=32" / "dense.vmfb").read_bytes() != (variants / "PYREE_WG_SIZE=64" / "dense.vmfb").read_bytes()
    assert "ceildiv 32)" in (variants / "PYREE_WG_SIZE=32" / "spec.mlir").read_text()
    assert (variants / "PYREE_WG_SIZE=64" / "spec.mlir").read_text() == (out / "spec.mlir").read_text()  # the default: as replace wrote it
    # --apply: the winner's object and spec, byte for byte, and a module compiled with them verifies.
    applied = run_cli("tune", out / "dense.glsl", "--target", "vulkan", "--apply", best, "-o", tmp_path / "spv")
    assert applied.returncode == 0 and f"-DPYREE_WG_SIZE={winner}" in applied.output, applied
    chosen = variants / f"PYREE_WG_SIZE={winner}"
    assert (tmp_path / "spv" / "dense.spv").read_bytes() == (chosen / "objects" / "dense.spv").read_bytes()
    assert (tmp_path / "spv" / "spec.mlir").read_bytes() == (chosen / "spec.mlir").read_bytes()
    module = pb.compile(
        mlir, tmp_path / "tuned.vmfb", target="vulkan", transform_spec=tmp_path / "spv" / "spec.mlir", expect_imports=["dense"],
        object_search_paths=[tmp_path / "spv"],
    )  # fmt: skip
    verified = pb.verify(module, model, device="vulkan")
    assert verified.passed, verified.render()
    # Keyed by content (the kernel, the program, the spec): the same sweep again is not run again.
    again = run_cli(*_tune_args(out / "dense.glsl", mlir, out, model, best, "vulkan", "PYREE_WG_SIZE=64,32"))
    assert again.returncode == 0 and "is up to date" in again.output, again
    (out / "spec.mlir").write_text((out / "spec.mlir").read_text() + "\n// edited\n")
    # An edited spec (a comment is enough: it is read by content) tunes again.
    edited = run_cli(*_tune_args(out / "dense.glsl", mlir, out, model, best, "vulkan", "PYREE_WG_SIZE=64,32"))
    assert edited.returncode == 0 and "is up to date" not in edited.output, edited


@needs_vulkan
def test_pb_tune_takes_the_target_program_and_spec_as_the_cli_does(tmp_path):
    model, mlir, out = _replaced(tmp_path, "vulkan")
    result = pb.tune(
        [out / "dense.glsl"], tmp_path / "best.json", target="vulkan", program=mlir, spec=out / "spec.mlir", function=FUNCTION, onnx=model,
        params={"PYREE_WG_SIZE": [64]}, max_rounds=3, budget=1,
    )  # fmt: skip
    assert result.best is not None and result.best.params == {"PYREE_WG_SIZE": "64"} and result.best.status == "ok"
    written = pb.tune.build_tuned([out / "dense.glsl"], tmp_path / "spv", tuned=tmp_path / "best.json", target="vulkan")
    assert written == tmp_path / "spv" / "dense.spv" and written.read_bytes()[:4] == b"\x03\x02\x23\x07"


@needs_vulkan
def test_a_vulkan_variant_that_computes_a_wrong_result_is_rejected_and_never_chosen(tmp_path):
    # A copy of the kernel that doubles its result when built with -DPYREE_BREAK=1: the variant
    # builds, compiles and runs, and only the check against onnxruntime can tell.
    model, mlir, out = _replaced(tmp_path, "vulkan")
    shader = out / "broken.glsl"
    text = (out / "dense.glsl").read_text()
    store = next(line for line in text.splitlines() if "out0.v[" in line)
    broken = text.replace(store, store.replace("= float(", "= (PYREE_BREAK != 0 ? 2.0 : 1.0) * float("))
    shader.write_text(broken.replace("#version 450\n", "#version 450\n#ifndef PYREE_BREAK\n#define PYREE_BREAK 0\n#endif\n", 1))
    # The spec names the object `dense.spv`: the broken copy is built under that name in its own directory.
    (tmp_path / "copy").mkdir()
    kernel = tmp_path / "copy" / "dense.glsl"
    kernel.write_text(shader.read_text())
    best = tmp_path / "best.json"
    result = run_cli(*_tune_args(kernel, mlir, out, model, best, "vulkan", "PYREE_BREAK=1,0"))
    assert result.returncode == 0, result
    assert re.search(r"PYREE_BREAK=1\s+WRONG RESULT", result.stdout), result.stdout
    record = json.loads(best.read_text())
    assert record["winner"]["params"] == {"PYREE_BREAK": "0"}
    assert {v["params"]["PYREE_BREAK"]: v["status"] for v in record["variants"]} == {"0": "ok", "1": "wrong result"}


@needs_vulkan
def test_a_vulkan_variant_that_does_not_build_is_reported_and_the_others_are_tuned(tmp_path):
    # A workgroup of 4096 invocations is past what GLSL allows (glslang refuses it): that variant
    # is BUILD FAILED in the table and best.json, and the sweep goes on with the rest.
    model, mlir, out = _replaced(tmp_path, "vulkan")
    best = tmp_path / "best.json"
    result = run_cli(*_tune_args(out / "dense.glsl", mlir, out, model, best, "vulkan", "PYREE_WG_SIZE=4096,64"))
    assert result.returncode == 0, result
    assert re.search(r"PYREE_WG_SIZE=4096\s+BUILD FAILED: compiling dense.glsl with glslang", result.stdout), result.stdout
    statuses = {v["params"]["PYREE_WG_SIZE"]: v["status"] for v in json.loads(best.read_text())["variants"]}
    assert statuses == {"64": "ok", "4096": "build failed"}


@pytest.mark.parametrize("target", ("cuda", "hip"))
def test_a_cuda_or_hip_tune_without_the_gpu_builds_every_variant_then_says_it_needs_the_device(tmp_path, target):
    if backends.get(target).probe(target)[0]:
        pytest.skip(f"a {target} GPU is here: the tune runs")
    model, mlir, out = _replaced(tmp_path, target)
    kernel = out / ("dense.cu" if target == "cuda" else "dense.hip")
    best = tmp_path / "best.json"
    result = run_cli(*_tune_args(kernel, mlir, out, model, best, target, "PYREE_WG_SIZE=64,128"))
    assert_clean_error(result, "2 variant(s) of the", f"needs a {target} device", "--apply best.json")
    assert not best.exists()
    # Built and compiled, each with the block size it names: the export's workgroup_size (CUDA and HIP launch it).
    for size in ("64", "128"):
        where = tmp_path / "best.variants" / f"PYREE_WG_SIZE={size}"
        assert (where / "dense.vmfb").is_file()
        spec = (where / "spec.mlir").read_text()
        assert f"<workgroup_size = [{size} : index, 1 : index, 1 : index]>" in spec and f"ceildiv {size})" in spec
    # A best.json from the GPU machine applies here: the object and the spec with its block size,
    # and the module compiles with them (compile-only).
    record = {"format": pb.tune.FORMAT, "winner": {"params": {"PYREE_WG_SIZE": "128"}}, "build": {"target": target, "spec": str(out / "spec.mlir")}}
    best.write_text(json.dumps(record))
    applied = run_cli("tune", kernel, "--target", target, "--apply", best, "-o", tmp_path / "objects")
    assert applied.returncode == 0, applied
    written = (tmp_path / "objects" / "spec.mlir").read_text()
    assert written == (tmp_path / "best.variants" / "PYREE_WG_SIZE=128" / "spec.mlir").read_text()
    module = pb.compile(mlir, tmp_path / "m.vmfb", target=target, transform_spec=tmp_path / "objects" / "spec.mlir", expect_imports=["dense"],
                        object_search_paths=[tmp_path / "objects"])  # fmt: skip
    assert module.is_file()


def test_gpu_tune_mistakes_are_named(tmp_path):
    model, mlir, out = _replaced(tmp_path, "vulkan")
    kernel, best = out / "dense.glsl", tmp_path / "best.json"
    no_spec = run_cli("tune", kernel, "--target", "vulkan", "--program", mlir, "--function", FUNCTION, "--onnx", model, "-o", best)
    assert_clean_error(no_spec, "a vulkan tune needs the program and the spec", "--spec DIR/spec.mlir")
    with_module = run_cli("tune", kernel, "--target", "vulkan", "--module", tmp_path / "m.vmfb", "--function", FUNCTION, "-o", best)
    assert_clean_error(with_module, "each variant is compiled anew", "--program PROGRAM.mlir --spec")
    wrong_device = run_cli(*_tune_args(kernel, mlir, out, model, best, "vulkan"), "--device", "local-sync")
    assert_clean_error(wrong_device, "cannot run on --device local-sync")
    cpu_form = run_cli(*_tune_args(kernel, mlir, out, model, best, "vulkan"), "--kind", "standalone")
    assert_clean_error(cpu_form, "--kind and --arch are a CPU plugin's")
    with_plugin = run_cli(*_tune_args(kernel, mlir, out, model, best, "vulkan"), "--plugin", kernel)
    assert_clean_error(with_plugin, "--plugin loads CPU plugins beside each variant", "leave out --plugin")
    on_ray = run_cli(*_tune_args(kernel, mlir, out, model, best, "vulkan"), "--ray", "auto")
    assert_clean_error(on_ray, "--ray sweeps CPU plugins", "leave out --ray")
    other_gpu = run_cli(*_tune_args(kernel, mlir, out, model, best, "vulkan"), "--sm", "80")
    assert_clean_error(other_gpu, "--sm is not an option of the vulkan target", "--vulkan-target")
    assert not best.exists()


def test_applying_a_cpu_tune_to_a_gpu_kernel_is_refused(tmp_path):
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"format": pb.tune.FORMAT, "winner": {"params": {"TILE": "4"}}, "build": {}}))
    kernel = tmp_path / "k.glsl"
    kernel.write_text("#version 450\nvoid main() {}\n")
    result = run_cli("tune", kernel, "--target", "vulkan", "--apply", best, "-o", tmp_path / "spv")
    assert_clean_error(result, "was tuned for the CPU, not vulkan", "--target llvm-cpu")
    assert not (tmp_path / "spv").exists()


_EXECUTABLE = """  hal.executable.source private @{name}_executable <{{objects = #hal.executable.objects<{{}}>}}> {{
    hal.executable.export public @{entry} ordinal(0)
        layout(#hal.pipeline.layout<constants = 1, bindings = []>) count(%device: !hal.device, %n: index) -> (index, index, index) {{
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      hal.return %groups, %one, %one : index, index, index
    }}{size}
  }}
  util.func private @{name}_call(%arg0: tensor<8xf32>) -> tensor<8xf32> {{
    %n = arith.constant 8 : index
  }}
"""


@settings(max_examples=30, deadline=None)
@given(
    size=st.integers(1, 1024),
    others=st.lists(st.sampled_from(["a", "b", "dense2"]), unique=True, max_size=2),
    first=st.booleans(),
    launched=st.booleans(),
)
def test_a_variant_spec_sets_only_its_own_kernels_workgroups(size, others, first, launched):
    # The tuned kernel's executable gets the variant's size: its workgroup count (the result's
    # elements over the size) and, where the export names the block (CUDA, HIP), that block;
    # every other kernel the same spec replaces keeps its own. A Vulkan export is `main` in each.
    names = [*others, "dense"] if not first else ["dense", *others]
    block = " <workgroup_size = [64 : index, 1 : index, 1 : index]>" if launched else ""
    text = "".join(_EXECUTABLE.format(name=n, entry=n if launched else "main", size=block) for n in names)
    tuned = tune_gpu.variant_spec(text, "dense", [f"PYREE_WG_SIZE={size}", "OTHER=3"])
    for n in names:
        executable = tuned[tuned.index(f"@{n}_executable") :].split("util.func", 1)[0]
        expected = size if n == "dense" else 64
        assert f"ceildiv {expected})" in executable
        assert (f"<workgroup_size = [{expected} : index" in executable) == launched
    assert tune_gpu.variant_spec(text, "dense", ["OTHER=3"]) == text
    changed = tuned.count(f"ceildiv {size})") + tuned.count(f"workgroup_size = [{size} :")
    assert len(tuned) - len(text) == (len(str(size)) - 2) * (1 + launched) and changed >= 1 + launched


def _mlp_two_kernels(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The mlp model, its import, and `replace --target vulkan` of both its dense layers into one
    spec (fc1, fc2): the model, the program and the directory."""
    model = tmp_path / "mlp.onnx"
    onnx_models.save(onnx_models.mlp(), model)
    mlir = tmp_path / "mlp.mlir"
    pb.import_onnx(model, mlir)
    out = tmp_path / "vulkan"
    pb.replace(mlir, out, ops=[1, 2], imports=["fc1", "fc2"], onnx=model, target="vulkan")
    return model, mlir, out


@needs_vulkan
@pytest.mark.slow
def test_the_vulkan_directory_built_with_tune_on_builds_the_chosen_kernels_and_verifies(tmp_path):
    # replace's CMakeLists.txt for vulkan with two kernels in one spec: -D<stem>_TUNE=ON sweeps each
    # shader's declared sizes on the Vulkan device (pyree_tune TARGET vulkan; each variant's module
    # also holds the other kernel, built as generated), builds each chosen SPIR-V (pyree_vulkan_spirv
    # TUNED) and the spec with both chosen workgroup counts, chained; the module's verify passes.
    from support.cmake_projects import build, configure, ctest_run

    _, _, out = _mlp_two_kernels(tmp_path)
    text = (out / "CMakeLists.txt").read_text()
    assert "option(mlp_TUNE" in text and "pyree_tune(NAME fc2_tune TARGET vulkan SRCS fc2.glsl" in text and 'TRANSFORM_SPEC "${mlp_SPEC}"' in text
    tuned = tmp_path / "tuned"
    configure(out, tuned, extra=["-Dmlp_TUNE=ON"])
    build(tuned)
    final = (tuned / "fc2_spirv" / "spec.mlir").read_text()
    for name in ("fc1", "fc2"):
        best = json.loads((tuned / f"{name}_tune.json").read_text())
        declared = pb.tune.declared_params(out / f"{name}.glsl")["PYREE_WG_SIZE"]
        assert {v["params"]["PYREE_WG_SIZE"] for v in best["variants"]} == set(declared)
        size = best["winner"]["params"]["PYREE_WG_SIZE"]
        winner = tuned / f"{name}_tune.variants" / f"PYREE_WG_SIZE={size}"
        assert (tuned / f"{name}_spirv" / f"{name}.spv").read_bytes() == (winner / "objects" / f"{name}.spv").read_bytes()
        # The module's spec holds each kernel's chosen count, in its own executable.
        executable = final[final.index(f"@{name}_executable") :].split("util.func", 1)[0]
        assert f"ceildiv {size})" in executable
    result = ctest_run(tuned, "--output-on-failure")
    assert result.returncode == 0 and "100% tests passed" in result.stdout, result.stdout


def test_a_spec_whose_other_kernel_is_missing_is_named(tmp_path):
    # One spec, two kernels: a variant's module needs the other's object, built from its source
    # beside the spec; without it the tune says which and where, before any variant is built.
    model, mlir, out = _mlp_two_kernels(tmp_path)
    (out / "fc2.glsl").unlink()
    best = tmp_path / "best.json"
    result = run_cli(*_tune_args(out / "fc1.glsl", mlir, out, model, best, "vulkan", "PYREE_WG_SIZE=64"))
    assert_clean_error(result, "the spec also dispatches the kernel 'fc2', whose source fc2.glsl is not beside it", "every kernel it names")
    assert not best.exists() and not (tmp_path / "best.variants").exists()


@needs_vulkan
def test_a_vulkan_tune_against_a_cpu_reference_module_runs_each_on_its_own_device(tmp_path):
    # --reference: the program without the kernel, compiled for the CPU, runs on local-sync (on
    # vulkan it would only say its HAL device is missing); its results for the given inputs and
    # for random inputs of the same shapes are what each variant must reproduce on Vulkan.
    _, mlir, out = _replaced(tmp_path, "vulkan")
    reference = pb.compile(mlir, tmp_path / "cpu.vmfb")
    best = tmp_path / "best.json"
    args = ["tune", out / "dense.glsl", "--target", "vulkan", "--program", mlir, "--spec", out / "spec.mlir", "--function", FUNCTION]
    result = run_cli(*args, "--input", "8x12xf32=0.5", "--reference", reference, "--param", "PYREE_WG_SIZE=64,32", *QUICK, "-o", best)
    assert result.returncode == 0, result
    record = json.loads(best.read_text())
    assert all(v["status"] == "ok" for v in record["variants"]) and record["measured"]["device"] == "vulkan"
    assert len(list((tmp_path / "best.variants" / "random_inputs").glob("*.npy"))) == 2
