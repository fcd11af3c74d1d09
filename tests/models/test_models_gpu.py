"""Issue 37: a model's op replaced by a generated GPU kernel (`replace --target vulkan|cuda|hip`).

The property: every group of the model zoo (tests/support/onnx_models.py) and of a slice of ONNX's
node conformance suite that `ops --target vulkan` marks generable is replaced, its GLSL built
to SPIR-V, the model compiled with the spec for Vulkan (the dispatch proven in the module by
--expect-import), run on this machine's Vulkan device (lavapipe without a GPU) and verified
against onnxruntime or the suite's stored outputs. CUDA and HIP replacements compile to PTX
(sm_80) and code objects (gfx1100) and to modules; on a machine with an NVIDIA GPU the CUDA
replacement runs and verifies. Everything is real: no tool is mocked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import assert_clean_error, benchmark_module, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyree_build as pb
from pyree_build import backends
from pyree_build.backends.vulkan import devices as vulkan
from pyree_build.core.errors import PyreeError
from pyree_build.models import verify as verify_module
from pyree_build.models.codegen import gpu_source
from pyree_build.tuning.params import declared_params

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from support import onnx_models  # noqa: E402

needs_vulkan = pytest.mark.skipif(not vulkan.status()[0], reason=f"no Vulkan device: {vulkan.status()[1]}")
# A slice of ONNX's node tests: elementwise ops and chains, broadcasts, math functions, matmuls, a Gemm,
# and the 8- and 64-bit and bool tensors GLSL holds through its extensions (i1 stored as a byte).
NODE_TESTS = (
    "test_add_bcast",
    "test_relu",
    "test_leakyrelu",
    "test_hardsigmoid",
    "test_tanh",
    "test_erf",
    "test_pow",
    "test_gelu_tanh_1_expanded",
    "test_clip_default_min",
    "test_matmul_2d",
    "test_gemm_default_no_bias",
    "test_where_example",
    "test_greater",
    "test_not_2d",
    "test_max_int64",
    "test_add_uint8",
    "test_tril_one_row_neg",  # an index widened to i64 (wrong on lavapipe through int64_t(x))
    "test_softmax_axis_2",  # row-wise: reductions in sequence over the last axis, rows over two loops
    "test_logsoftmax_axis_2",
)


def _imported(tmp_path: Path, name: str) -> tuple[Path, Path]:
    model = tmp_path / f"{name}.onnx"
    onnx_models.save(getattr(onnx_models, name)(), model)
    mlir = tmp_path / f"{name}.mlir"
    pb.import_onnx(model, mlir)
    return model, mlir


def _generable(mlir: Path, target: str) -> list[int]:
    """The groups `ops` says replace generates for `target` (a repeated group is replaced with its first)."""
    return [g.index for g in pb.ops(mlir, targets=[target]) if g.targets[target] is None and g.same_as is None]


def _vulkan_verified(tmp_path: Path, model: Path, mlir: Path, indices: list[int], *, input_files: list[Path] | None = None) -> None:
    """Replace the groups in one spec (so none of IREE's own dispatches for them is left: some
    of those use subgroup operations lavapipe's 8-lane subgroups cannot run), build, compile
    for the Vulkan device here, prove the dispatches are in the module, and verify."""
    out = tmp_path / "kernels"
    names = [f"g{index}_kernel" for index in indices]
    try:
        pb.replace(mlir, out, ops=indices, imports=names, onnx=model, target="vulkan")
    except PyreeError as e:
        # Two groups of the same ops on the same types made of parts of two groups (a transformer's
        # LayerNorms sharing a fill): the first one's matcher replaces both, the other is left out.
        never = re.search(r"import 'g(\d+)_kernel' would never be called", str(e))
        if never is None or len(indices) < 2:
            raise
        _vulkan_verified(tmp_path, model, mlir, [i for i in indices if i != int(never.group(1))], input_files=input_files)
        return
    pb.spirv([out / f"{name}.glsl" for name in names], out / "spv")
    # The Vulkan target of the device here (auto: llvmpipe on lavapipe), as a user compiles: IREE's
    # own code for the groups left to it (reductions with 8-lane subgroup operations) runs too.
    module = pb.compile(mlir, out / "m.vmfb", target="vulkan", transform_spec=out / "spec.mlir", expect_imports=names, object_search_paths=[out / "spv"])
    result = pb.verify(module, model, device="vulkan", input_files=input_files or ())
    assert result.passed, result.render()


@needs_vulkan
@pytest.mark.parametrize("name", sorted(onnx_models.BUILDERS) + sorted(onnx_models.ARCHITECTURES))
def test_every_vulkan_generable_group_of_the_zoo_runs_on_vulkan_and_verifies(tmp_path, name):
    # The small models and the real architectures (SqueezeNet-like convs, a ResNet block, a
    # transformer block, Gemm-GELU-LayerNorm): every group generated for vulkan, at once.
    model, mlir = _imported(tmp_path, name)
    listed = pb.ops(mlir, targets=["vulkan"])
    generable = [g.index for g in listed if g.targets["vulkan"] is None and g.same_as is None]
    # A group not generated says why (groups the loop-nest model leaves to the CPU's per-op body).
    assert all(g.targets["vulkan"] for g in listed if g.index not in generable and g.same_as is None)
    if generable:
        _vulkan_verified(tmp_path, model, mlir, generable)


def test_the_zoo_has_groups_generated_for_every_gpu_target(tmp_path):
    # The property above is not vacuous: the zoo's dense layers and softmax are generated for each target.
    _, mlir = _imported(tmp_path, "mlp")
    listed = pb.ops(mlir, targets=list(gpu_source.TARGETS))
    for target in gpu_source.TARGETS:
        assert [g.index for g in listed if g.targets[target] is None] == [1, 2, 3], (target, listed)


@pytest.mark.parametrize("name", ("softmax", "layer_norm"))
def test_row_wise_groups_are_generated_for_every_gpu_target(tmp_path, name):
    # A softmax or a LayerNorm (reductions in sequence over a row) is a row-wise nest: each element
    # recomputes its row's reductions in order, each in its own loop and register. (The zoo's
    # property above runs and verifies them on Vulkan; the CUDA and HIP test below compiles them.)
    _, mlir = _imported(tmp_path, name)
    [group] = pb.ops(mlir, targets=list(gpu_source.TARGETS))
    assert group.targets == dict.fromkeys(gpu_source.TARGETS), group.targets
    pb.replace(mlir, tmp_path / "k", ops=[1], imports=["rows"], target="vulkan")
    text = (tmp_path / "k" / "rows.glsl").read_text()
    assert "O(n^2) per row" in text and "float row0 = " in text and "float row1 = " in text and "row2" not in text
    # softmax's max also computes its index (an i64) that nothing reads: it is left out, so the
    # shader needs no 64-bit integer feature.
    assert "int64_t" not in text


def test_a_softmax_over_another_axis_than_the_last_is_refused_for_gpus_with_the_reason(tmp_path):
    # Reductions over the first of two loops are neither nest's: `ops` says so per target, and
    # replace refuses with that reason, writing nothing (the CPU's per-op body still replaces it).
    from onnx import helper

    model = tmp_path / "softmax0.onnx"
    onnx_models.save(onnx_models._model("softmax0", [helper.make_node("Softmax", ["x"], ["y"], axis=0)], {"x": (4, 10)}, {"y": (4, 10)}), model)
    mlir = tmp_path / "softmax0.mlir"
    pb.import_onnx(model, mlir)
    [group] = pb.ops(mlir, targets=list(gpu_source.TARGETS))
    assert group.replaceable and all("not over the last loop" in (reason or "") for reason in group.targets.values()), group.targets
    refused = run_cli("replace", mlir, "--ops", "1", "--import", "k", "-o", tmp_path / "k", "--target", "hip")
    assert_clean_error(refused, "cannot be generated for hip", "does not cover this group", "not over the last loop")
    assert not (tmp_path / "k").exists()


@pytest.fixture(scope="module")
def node_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The slice's node tests, written by onnx's own tool (through the conformance harness)."""
    harness = benchmark_module("onnx_conformance")
    folder: Path = harness.generate_data(tmp_path_factory.mktemp("onnx-node"), "^(" + "|".join(NODE_TESTS) + ")$")
    return folder


@needs_vulkan
@pytest.mark.parametrize("test", NODE_TESTS)
def test_onnx_node_tests_replaced_for_vulkan_match_the_stored_outputs(tmp_path, node_data, test):
    case = node_data / test
    mlir = tmp_path / f"{test}.mlir"
    assert run_cli("import", case / "model.onnx", "-o", mlir).returncode == 0
    generable = _generable(mlir, "vulkan")
    assert generable, pb.ops(mlir, targets=["vulkan"])
    _vulkan_verified(tmp_path, case / "model.onnx", mlir, generable, input_files=[case / "test_data_set_0"])


def test_ops_and_replace_never_disagree_per_target(tmp_path):
    # `ops --target` asks the same generate() replace runs: a group marked generable is written,
    # one marked not is refused with that reason, for every target and group of these models.
    for name in ("mlp", "layer_norm"):
        model, mlir = _imported(tmp_path, name)
        for group in pb.ops(mlir, targets=list(gpu_source.TARGETS)):
            for target, reason in group.targets.items():
                out = tmp_path / f"{name}_{group.index}_{target}"
                if reason is None:
                    written = pb.replace(mlir, out, ops=[group.index], imports=["k"], target=target)
                    assert out / f"k{gpu_source.SUFFIXES[gpu_source.TARGETS[target]]}" in written
                else:
                    with pytest.raises(PyreeError) as refused:
                        pb.replace(mlir, out, ops=[group.index], imports=["k"], target=target)
                    assert reason.split(" (")[0] in str(refused.value)
                    assert not out.exists()


@pytest.mark.parametrize("target", ("cuda", "hip"))
@pytest.mark.parametrize("name", ("matmul_add_relu", "gemm_gelu_norm", "softmax"))
def test_cuda_and_hip_replacements_compile_to_ptx_code_objects_and_modules(tmp_path, name, target):
    # Every group generated for the target, at once: the kernels build (NVRTC for sm_80; zig
    # clang + iree-lld for gfx1100, no ROCm) and the module compiles with every dispatch in it.
    # gemm_gelu_norm's kernels call the freestanding math helpers (erf, tanh) as device functions;
    # its LayerNorm and the softmax are row-wise kernels.
    model, mlir = _imported(tmp_path, name)
    indices = _generable(mlir, target)
    assert indices
    names = [f"k{i}" for i in indices]
    out = tmp_path / target
    pb.replace(mlir, out, ops=indices, imports=names, onnx=model, target=target)
    if target == "cuda":
        objects = [o for n in names for o in pb.ptx(out / f"{n}.cu", [80], out / "objects")]
        found = dict(sm=80, object_search_paths=[out / "objects"])
    else:
        objects = [o for n in names for o in pb.hsaco(out / f"{n}.hip", [1100], out / "objects")]
        found = dict(gfx=1100, object_search_paths=[out / "objects" / "gfx1100"])
    module = pb.compile(mlir, out / "m.vmfb", target=target, transform_spec=out / "spec.mlir", expect_imports=names, **found)
    assert len(objects) == len(names)
    if target == "cuda":  # the PTX is embedded as it is: each kernel's entry is in the module
        data = module.read_bytes()
        assert all(f".entry {n}(".encode() in data for n in names)


def test_expect_import_fails_a_gpu_module_whose_spec_matched_nothing(tmp_path):
    _, mlir = _imported(tmp_path, "matmul_add_relu")
    _, other = _imported(tmp_path, "two_groups")
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[1], imports=["dense"], target="vulkan")
    pb.spirv([out / "dense.glsl"], out / "spv")
    # The spec's matcher is matmul_add_relu's IR: two_groups has no such group, so no dispatch.
    result = run_cli(
        "compile", other, "-o", tmp_path / "m.vmfb", "--target", "vulkan", "--vulkan-target", "llvmpipe",
        "--transform-spec", out / "spec.mlir", "--expect-import", "dense", "--object-search-path", out / "spv",
    )  # fmt: skip
    assert_clean_error(result, "does not dispatch dense_executable", "matcher found nothing")
    assert not (tmp_path / "m.vmfb").exists()


def test_vulkan_refuses_what_glsl_cannot_index_and_dynamic_sizes_with_the_reason(tmp_path):
    from onnx import TensorProto, helper

    # 2^31 elements: GLSL indexes with 32-bit ints; CUDA C with 64-bit ones. (Only types are read.)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**31])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**31])],
    )
    model = tmp_path / "huge.onnx"
    onnx_models.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    mlir = tmp_path / "huge.mlir"
    pb.import_onnx(model, mlir)
    [group] = pb.ops(mlir, targets=["vulkan", "cuda"])
    assert group.replaceable and group.targets["cuda"] is None
    assert "2^31" in (group.targets["vulkan"] or "") and "32-bit" in (group.targets["vulkan"] or "")
    refused = run_cli("replace", mlir, "--ops", "1", "--import", "k", "-o", tmp_path / "k", "--target", "vulkan")
    assert_clean_error(refused, "cannot be generated for vulkan", "2^31")
    assert not (tmp_path / "k").exists()
    # --dynamic and --kind embedded are the CPU's forms only; ops names the GPU targets it knows.
    _, dense = _imported(tmp_path, "matmul_add_relu")
    refused = run_cli("replace", dense, "--ops", "1", "--import", "k", "-o", tmp_path / "d", "--target", "cuda", "--dynamic")
    assert_clean_error(refused, "--dynamic", "cuda")
    refused = run_cli("replace", dense, "--ops", "1", "--import", "k", "-o", tmp_path / "d", "--target", "hip", "--kind", "embedded")
    assert_clean_error(refused, "--kind embedded", "hip")
    assert not (tmp_path / "d").exists()
    assert_clean_error(run_cli("ops", dense, "--target", "metal"), "unknown GPU target 'metal'", "vulkan, cuda, hip")


@pytest.mark.parametrize("target", tuple(gpu_source.TARGETS))
def test_every_gpu_kernel_declares_its_workgroup_size_as_a_tune_knob_default_first(tmp_path, target):
    # The same knob line in GLSL, CUDA and HIP, the default (64, the spec's) first as the C's knobs:
    # among variants noise cannot tell apart, tune keeps the untuned kernel. The #ifndef default
    # lets a build without -D compile.
    _, mlir = _imported(tmp_path, "matmul_add_relu")
    pb.replace(mlir, tmp_path / "k", ops=[1], imports=["dense"], target=target)
    source = tmp_path / "k" / f"dense{gpu_source.SUFFIXES[gpu_source.TARGETS[target]]}"
    assert declared_params(source) == {"PYREE_WG_SIZE": ["64", "32", "128", "256"]}
    assert "#ifndef PYREE_WG_SIZE\n#define PYREE_WG_SIZE 64\n#endif" in source.read_text()


@needs_vulkan
def test_a_wrong_vulkan_kernel_fails_verify(tmp_path):
    # The verify test can fail: a shader that doubles the result is caught.
    model, mlir = _imported(tmp_path, "matmul_add_relu")
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[1], imports=["dense"], target="vulkan")
    shader = out / "dense.glsl"
    text = shader.read_text()
    store = next(line for line in text.splitlines() if "out0.v[" in line)
    shader.write_text(text.replace(store, store.replace("= float(", "= 2.0 * float(")))
    pb.spirv([shader], out / "spv")
    module = pb.compile(mlir, out / "m.vmfb", target="vulkan", transform_spec=out / "spec.mlir", expect_imports=["dense"], object_search_paths=[out / "spv"])
    assert not pb.verify(module, model, device="vulkan").passed


def test_cuda_replacement_runs_and_verifies_on_a_gpu(tmp_path):
    usable, reason = backends.get("cuda").probe("cuda")
    if not usable:
        pytest.skip(f"no usable CUDA GPU: {reason}")
    model, mlir = _imported(tmp_path, "matmul_add_relu")
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[1], imports=["dense"], onnx=model, target="cuda")
    pb.ptx(out / "dense.cu", [80], out / "ptx")
    module = pb.compile(
        mlir, out / "m.vmfb", target="cuda", sm=80, transform_spec=out / "spec.mlir", expect_imports=["dense"], object_search_paths=[out / "ptx"]
    )
    result = pb.verify(module, model, device="cuda")
    assert result.passed, result.render()


@pytest.mark.slow
@pytest.mark.parametrize("target", tuple(gpu_source.TARGETS))
def test_the_generated_gpu_directory_builds_and_its_verify_test_runs_or_skips(tmp_path, target):
    # The CMakeLists.txt `replace --target` writes: the kernel built by the target's function,
    # the module compiled with the spec and EXPECT_IMPORTS, the verify test on the target's device
    # (run where the device is present, reported skipped with the reason where it is not).
    from support.cmake_projects import build, configure, ctest_run

    model, mlir = _imported(tmp_path, "matmul_add_relu")
    out = tmp_path / "kernels"
    pb.replace(mlir, out, ops=[1], imports=["dense"], onnx=model, target=target)
    text = (out / "CMakeLists.txt").read_text()
    assert f"TARGET {target}" in text and "EXPECT_IMPORTS dense" in text and f"DEVICE {target}" in text
    configure(out, tmp_path / "build")
    build(tmp_path / "build")
    assert (tmp_path / "build" / "matmul_add_relu_replaced.vmfb").is_file()
    result = ctest_run(tmp_path / "build", "--output-on-failure")
    present = backends.get(target).probe(target)[0]
    if present:
        assert result.returncode == 0 and "100% tests passed" in result.stdout, result.stdout
    else:
        assert result.returncode == 0 and "***Skipped" in result.stdout and "100% tests passed" in result.stdout, result.stdout


@needs_vulkan
def test_verify_runs_each_module_on_its_own_device_by_default(tmp_path):
    # No --device: the GPU module runs on vulkan (it would only say "HAL device not found" on
    # local-sync). The CPU baseline runs only where an output fails, on local-sync: a failing
    # kernel shows that (tests/backends/vulkan/test_vulkan_calls.py).
    model, mlir = _imported(tmp_path, "matmul_add_relu")
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[1], imports=["dense"], target="vulkan")
    pb.spirv([out / "dense.glsl"], out / "spv")
    module = pb.compile(mlir, out / "m.vmfb", target="vulkan", transform_spec=out / "spec.mlir", expect_imports=["dense"], object_search_paths=[out / "spv"])
    baseline = pb.compile(mlir, tmp_path / "cpu.vmfb")
    assert verify_module.module_device(module) == "vulkan" and verify_module.module_device(baseline) == "local-sync"
    result = run_cli("verify", module, "--onnx", model, "--baseline", baseline)
    assert result.returncode == 0 and "verified" in result.output, result


def test_a_module_names_the_subgroup_sizes_its_vulkan_code_assumes(tmp_path):
    # The lavapipe check holds the device to the sizes the module's target declares: llvmpipe's
    # code (auto on lavapipe) assumes 8 lanes, lavapipe's own; a GPU target's, 16 or more.
    from pyree_build.backends.vulkan import modules

    _, mlir = _imported(tmp_path, "layer_norm")  # a reduction IREE compiles with subgroup operations
    sizes = {}
    for target in ("llvmpipe", "rdna3"):
        module = pb.compile(mlir, tmp_path / f"{target}.vmfb", target="vulkan", vulkan_target=target)
        sizes[target] = modules.declared_subgroup_sizes(module.read_bytes())
    assert sizes["llvmpipe"] == [8] and min(sizes["rdna3"]) >= modules.SMALLEST_ASSUMED_SUBGROUP, sizes


@needs_vulkan
@pytest.mark.parametrize("size", ("32", "256"))
def test_any_workgroup_size_the_knob_takes_computes_every_element(tmp_path, size):
    # The spec's workgroup count is made for the default size (64); the invocations stride over
    # the result, so a shader built with another size (what tune tries) is still right.
    model, mlir = _imported(tmp_path, "matmul_add_relu")
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[1], imports=["dense"], target="vulkan")
    pb.spirv([out / "dense.glsl"], out / "spv", defines=[f"PYREE_WG_SIZE={size}"])
    module = pb.compile(mlir, out / "m.vmfb", target="vulkan", transform_spec=out / "spec.mlir", expect_imports=["dense"], object_search_paths=[out / "spv"])
    result = pb.verify(module, model)
    assert result.passed, result.render()


# Elementwise ONNX ops the property below chains: (op, arity). Each keeps values finite on [-1, 1].
_CHAIN_OPS = (("Add", 2), ("Sub", 2), ("Mul", 2), ("Max", 2), ("Min", 2), ("Relu", 1), ("Tanh", 1), ("Sigmoid", 1), ("Abs", 1), ("Neg", 1), ("Erf", 1))


@needs_vulkan
@settings(
    max_examples=int(os.environ.get("PYREE_FUZZ_EXAMPLES", "4")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    chain=st.lists(st.sampled_from(_CHAIN_OPS), min_size=1, max_size=4),
    rows=st.integers(1, 70),
    cols=st.integers(1, 70),
    weights_first=st.booleans(),
)
def test_random_elementwise_chains_on_vulkan_match_onnxruntime(tmp_path_factory, chain, rows, cols, weights_first):
    # A chain of elementwise ops on x[rows, cols], the binary ones with a weight row broadcast
    # along the rows (on either side): every group generated for vulkan, replaced, run on the
    # device and compared with onnxruntime. Sizes that no workgroup size divides included.
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    tmp = tmp_path_factory.mktemp("chain")
    nodes, weights, value = [], [], "x"
    for n, (op, arity) in enumerate(chain):
        inputs = [value]
        if arity == 2:
            weight = f"w{n}"
            weights.append(numpy_helper.from_array(np.random.default_rng(n).uniform(-1, 1, cols).astype(np.float32), weight))
            inputs = [weight, value] if weights_first else [value, weight]
        nodes.append(helper.make_node(op, inputs, [f"v{n}"], name=f"{op.lower()}{n}"))
        value = f"v{n}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])], weights,
    )  # fmt: skip
    model = tmp / "chain.onnx"
    onnx_models.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    mlir = tmp / "chain.mlir"
    pb.import_onnx(model, mlir)
    generable = _generable(mlir, "vulkan")
    assert generable, pb.ops(mlir, targets=["vulkan"])  # elementwise chains are in the loop-nest model
    _vulkan_verified(tmp, model, mlir, generable)


@needs_vulkan
@settings(
    max_examples=int(os.environ.get("PYREE_FUZZ_EXAMPLES", "3")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(m=st.integers(1, 40), k=st.integers(1, 40), n=st.integers(1, 40))
def test_dense_layers_of_any_size_on_vulkan_match_onnxruntime(tmp_path_factory, m, k, n):
    # MatMul + Add + Relu at sizes the reduction loop and the workgroups meet unevenly.
    tmp = tmp_path_factory.mktemp("dense")
    model, mlir = tmp / "dense.onnx", tmp / "dense.mlir"
    onnx_models.save(onnx_models.dense_layer(m, k, n), model)
    pb.import_onnx(model, mlir)
    _vulkan_verified(tmp, model, mlir, _generable(mlir, "vulkan"))
