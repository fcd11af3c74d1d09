"""Issue 33 (coverage): the groups real networks are made of can be replaced, and exactly.

A body that uses a constant from outside it (relu's 0.0, a norm's epsilon, GELU's 0.5) is matched
with the constant compared by value (the spec clones it into the body first: captures.py), and a
fill shared by two same-shape ops never makes a group "two results". Measured on miniature real
architectures (tests/onnx_models.ARCHITECTURES); each newly replaceable kind of group is replaced,
compiled with --expect-import and verified against onnxruntime.

Everything is real: iree-import-onnx, iree-compile with the generated spec, zig cc, iree-run-module,
onnxruntime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from support import onnx_models  # noqa: E402

import pyree_build as pb  # noqa: E402

# A relu exactly as ONNX's imports to it (cmpf ugt + select on a constant defined outside the body),
# with the constant left to fill in: a spec made for one value must not match another.
RELU = """
func.func @relu(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %cst = arith.constant CONSTANT : f32
  %e = tensor.empty() : tensor<4x8xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %c = arith.cmpf ugt, %in, %cst : f32
    %s = arith.select %c, %in, %cst : f32
    linalg.yield %s : f32
  } -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
"""


def _program(tmp_path: Path, name: str, constant: str) -> Path:
    path = tmp_path / f"{name}.mlir"
    path.write_text(RELU.replace("CONSTANT", constant))
    return path


@pytest.mark.parametrize("other", ["5.000000e-01", "-0.000000e+00"])
def test_a_body_constant_is_matched_by_value(tmp_path, other):
    # Generated from relu(0.0): it replaces relu(0.0), with the right numbers, and leaves a
    # clamp at another value (0.5; -0.0, equal to 0.0 as a number but not the same constant)
    # alone: the import is not called there.
    relu = _program(tmp_path, "relu", "0.000000e+00")
    (group,) = pb.ops(relu)
    assert group.replaceable and not group.matched_by_name, group
    out = tmp_path / "k"
    pb.replace(relu, out, ops=[1], imports=["my_relu"])
    plugin = pb.plugin(out / "my_relu.c", out / "my_relu.so", kind="system")
    module = out / "relu.vmfb"
    assert run_cli("compile", relu, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "my_relu").returncode == 0
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    (y,) = pb.run(module, "relu", [x], plugins=plugin)
    np.testing.assert_array_equal(y, np.where(x > 0, x, np.float32(0)))
    clamp = _program(tmp_path, "clamp", other)
    refused = run_cli("compile", clamp, "-o", out / "clamp.vmfb", "--transform-spec", out / "spec.mlir", "--expect-import", "my_relu")
    assert_clean_error(refused, "does not call import 'my_relu'")


def _imported(tmp_path: Path, name: str) -> tuple[Path, Path]:
    model = Path(onnx_models.save(onnx_models.ARCHITECTURES[name](), tmp_path / f"{name}.onnx"))
    mlir = tmp_path / f"{name}.mlir"
    pb.import_onnx(model, mlir)
    return model, mlir


def _replaced_verifies(tmp_path: Path, model: Path, mlir: Path, ops: list[int], names: list[str]) -> None:
    """Replace `ops` at once, build each import, compile expecting every import, verify."""
    out = tmp_path / ("k_" + "_".join(names))
    pb.replace(mlir, out, ops=ops, imports=names, onnx=model)
    plugins = [pb.plugin(out / f"{n}.c", out / f"{n}.so", kind="system") for n in names]
    module = out / "m.vmfb"
    expects = [a for n in names for a in ("--expect-import", n)]
    compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", *expects)
    assert compiled.returncode == 0, compiled
    assert pb.verify(module, model, plugins=plugins).passed


# The share `ops` marks replaceable on each architecture (the goal: >= 90%); before
# issue 33's part 3 these were 2/11, 6/15, 12/15 and 4/6, and ResNet's 7/15 until a batch
# norm's scale (computed from its constants alone, which IREE folds while compiling) became
# part of the group that applies it: 11/11.
@pytest.mark.parametrize("name", sorted(onnx_models.ARCHITECTURES))
def test_ops_marks_real_architectures_replaceable(tmp_path, name):
    _, mlir = _imported(tmp_path, name)
    groups = pb.ops(mlir)
    refused = [(g.index, g.source, g.reason) for g in groups if not g.replaceable]
    assert len(refused) <= 0.1 * len(groups), refused
    assert not [g.index for g in groups if g.matched_by_name], "a constant-capturing body must be compared, not matched by name"


@pytest.mark.parametrize("name", sorted(onnx_models.ARCHITECTURES))
def test_every_replaceable_group_of_real_architectures_at_once_verifies(tmp_path, name):
    # A whole model replaced: every group `ops` marks replaceable, those the same as another
    # included, in one spec, each import called, the numbers onnxruntime's (issue 45: the
    # transformer block's 15 groups were refused for 3 whose ops another matcher also took).
    model, mlir = _imported(tmp_path, name)
    chosen = [g.index for g in pb.ops(mlir) if g.replaceable]
    _replaced_verifies(tmp_path, model, mlir, chosen, [f"g{i}" for i in chosen])


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_set_of_groups_places_each_import_once_at_its_own_group(tmp_path_factory, data):
    # Property: for any subset of the transformer block's replaceable groups (it has repeats:
    # Q/K/V projections, two LayerNorms), the spec places exactly one call of each import, and
    # the call's location is its own group's.
    tmp = tmp_path_factory.mktemp("subset")
    _, mlir = _transformer(tmp_path_factory)
    groups = [g for g in pb.ops(mlir) if g.replaceable]
    chosen = data.draw(st.lists(st.sampled_from(groups), min_size=1, max_size=len(groups), unique_by=lambda g: g.index))
    names = [f"s{g.index}" for g in chosen]
    pb.replace(mlir, tmp / "k", ops=[g.index for g in chosen], imports=names)
    from pyree_build.models import spec
    from pyree_build.models.ir import program

    placed = program.after_spec(mlir, (tmp / "k" / "spec.mlir").read_text())
    assert {n: spec.dispatches_of(placed, n) for n in names} == dict.fromkeys(names, 1)


_TRANSFORMER: dict[str, tuple[Path, Path]] = {}


def _transformer(tmp_path_factory: Any) -> tuple[Path, Path]:
    if "t" not in _TRANSFORMER:
        _TRANSFORMER["t"] = _imported(tmp_path_factory.mktemp("transformer"), "transformer_block")
    return _TRANSFORMER["t"]


def test_a_value_computed_from_constants_is_computed_by_each_group_that_reads_it(tmp_path):
    """ResNet's batch norms: rsqrt(var + eps) is folded by IREE while compiling, so no group
    of its own is listed; each group applying a norm computes it from the constants, and
    replacing all of them at once gives onnxruntime's numbers. Such a value, and the zero fill
    that same-shape convolutions share, ties no group to another: every convolution is one
    group with its own BatchNorm (the shared fill once kept all but the last apart, a kernel
    and an elementwise pass over its whole output where one kernel does both)."""
    model, mlir = _imported(tmp_path, "resnet_block")
    groups = pb.ops(mlir)
    norms = [g for g in groups if any(s.startswith("bn_") for s in g.source)]
    assert len(norms) == 4 and all(g.replaceable for g in norms), [(g.index, g.reason) for g in norms]
    assert all(any("math.rsqrt" in op for op in g.ops) and "linalg.generic(arith.subf)" in g.ops for g in norms), [g.ops for g in norms]
    convolutions = [g for g in groups if any(op.startswith("linalg.conv_") for op in g.ops)]
    assert [sum(op.startswith("linalg.conv_") for op in g.ops) for g in convolutions] == [1, 1, 1, 1], [g.ops for g in convolutions]
    assert [[s for s in g.source if s.startswith("bn_")] for g in convolutions] == [["bn_a"], ["bn_b"], ["bn_c"], ["bn_s"]], [g.source for g in groups]
    assert len(groups) == 7 and not [g.index for g in groups if g.ops == ["linalg.generic(arith.addf)", "linalg.generic(math.rsqrt)"]]
    chosen = [g.index for g in groups if g.replaceable]
    _replaced_verifies(tmp_path, model, mlir, chosen, [f"k{i}" for i in chosen])


@st.composite
def _conv_blocks(draw: Any) -> list[tuple[int, bool, int | None]]:
    count = draw(st.integers(2, 5))
    return [(draw(st.sampled_from([1, 3])), draw(st.booleans()), draw(st.none() | st.integers(0, i))) for i in range(count)]


@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocks=_conv_blocks())
def test_every_convolution_is_one_group_with_its_batch_norm(tmp_path_factory, blocks):
    # Property over chains of same-shape convolutions (one shared zero fill), each with its
    # BatchNorm (a scale computed from constants), a Relu or not, and residual sums with earlier
    # blocks' outputs: no group holds two convolutions, each convolution's group holds its own
    # norm, and the model with every group replaced at once gives onnxruntime's numbers.
    tmp = tmp_path_factory.mktemp("chain")
    model = Path(onnx_models.save(onnx_models.conv_batch_norm_chain(blocks), tmp / "chain.onnx"))
    mlir = tmp / "chain.mlir"
    pb.import_onnx(model, mlir)
    groups = pb.ops(mlir)
    assert all(g.replaceable for g in groups), [(g.index, g.reason) for g in groups]
    with_conv = [g for g in groups if any(op.startswith("linalg.conv_") for op in g.ops)]
    assert [sum(op.startswith("linalg.conv_") for op in g.ops) for g in with_conv] == [1] * len(blocks), [(g.source, g.ops) for g in groups]
    assert [[s for s in g.source if s.startswith("bn")] for g in with_conv] == [[f"bn{i}"] for i in range(len(blocks))], [g.source for g in groups]
    chosen = [g.index for g in groups]
    _replaced_verifies(tmp, model, mlir, chosen, [f"c{i}" for i in chosen])


# One group of each kind the issue names: conv + relu (squeezenet), residual add + relu (resnet),
# LayerNorm with its epsilon (transformer), Gemm whose zero fill another matmul shares, and a
# LayerNorm sharing its reduction's fill with Softmax (the user's block).
@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("squeezenet_like", "fire2_expand3_relu"),
        ("resnet_block", "relu_out"),
        ("transformer_block", "ln2"),
        ("gemm_gelu_norm", "gemm"),
        ("gemm_gelu_norm", "norm"),
    ],
)
def test_newly_replaceable_groups_verify(tmp_path, name, source):
    model, mlir = _imported(tmp_path, name)
    (group,) = [g for g in pb.ops(mlir) if g.source[-1] == source]  # a fill taken from another group comes first
    assert group.replaceable, group
    _replaced_verifies(tmp_path, model, mlir, [group.index], [f"g{group.index}"])


def test_groups_sharing_a_fill_are_replaced_together(tmp_path):
    # The user's block (issue 33): Gemm merged with its erf GELU (the classic reason to write a
    # kernel), and the later MatMul merged with its Softmax; Gemm and MatMul start from one zero
    # fill. One spec, both imports called (--expect-import), the numbers onnxruntime's.
    model, mlir = _imported(tmp_path, "gemm_gelu_norm")
    groups = pb.ops(mlir)
    gemm_gelu = tuple(g.index for g in groups if g.source[-1] in ("gemm", "gelu_add", "gelu_half_mul"))
    matmul_softmax = tuple(g.index for g in groups if g.source[-1] in ("matmul", "softmax"))
    assert len(gemm_gelu) == 3 and len(matmul_softmax) == 2, groups
    _replaced_verifies(tmp_path, model, mlir, [gemm_gelu, matmul_softmax], ["my_gemm_gelu", "my_matmul_softmax"])


def test_cli_merges_conv_batch_norm_relu_into_one_kernel(tmp_path):
    # ResNet's conv, then its batch norm and relu (with the scale computed from the variance)
    # are one group as listed; --ops 3+4+5 merges the bottleneck's tail (the last conv and its
    # norm, the shortcut's conv and its norm, the residual add and relu) into one import whose
    # C computes all of them.
    model, mlir = _imported(tmp_path, "resnet_block")
    groups = pb.ops(mlir)
    assert groups[0].source == ["conv_a", "bn_a", "relu_a"], groups[:1]
    assert [g.source[-1] for g in groups[2:5]] == ["bn_c", "bn_s", "relu_out"], groups[2:5]
    out = tmp_path / "k"
    result = run_cli("replace", mlir, "--ops", "3+4+5", "--import", "bottleneck_tail", "-o", out, "--onnx", model)
    assert result.returncode == 0, result
    c = (out / "bottleneck_tail.c").read_text()
    assert all(name in c for name in ("conv_c", "bn_c", "shortcut", "bn_s", "residual", "relu_out")), c[:2000]
    assert "--ops 3+4+5" in (out / "spec.mlir").read_text() and "rsqrt" in c
    plugin = pb.plugin(out / "bottleneck_tail.c", out / "bottleneck_tail.so", kind="system")
    compiled = run_cli("compile", mlir, "-o", out / "m.vmfb", "--transform-spec", out / "spec.mlir", "--expect-import", "bottleneck_tail")
    assert compiled.returncode == 0, compiled
    assert pb.verify(out / "m.vmfb", model, plugins=plugin).passed


def test_groups_that_are_not_connected_are_not_merged(tmp_path):
    _, mlir = _imported(tmp_path, "gemm_gelu_norm")
    refused = run_cli("replace", mlir, "--ops", "1+5", "--import", "k", "-o", tmp_path / "a")
    assert_clean_error(refused, "op group 1+5", "not one connected group", "2 results used outside it")
    assert_clean_error(run_cli("replace", mlir, "--ops", "1+x", "--import", "k", "-o", tmp_path / "b"), "--ops takes op group numbers, got '1+x'")
    assert_clean_error(run_cli("replace", mlir, "--ops", "1+2,2", "--import", "k,l", "-o", tmp_path / "c"), "once")
    assert_clean_error(run_cli("replace", mlir, "--ops", "1+9", "--import", "k", "-o", tmp_path / "d"), "no op group 9")
    with pytest.raises(pb.PyreeError, match="op group numbers"):
        pb.replace(mlir, tmp_path / "e", ops=[(1, "2")], imports=["k"])  # type: ignore[list-item]
    assert not any((tmp_path / d).exists() for d in "abcde")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(onnx_models.ARCHITECTURES))
def test_every_group_of_real_architectures_verifies(tmp_path, name):
    model, mlir = _imported(tmp_path, name)
    for group in pb.ops(mlir):
        if group.replaceable:
            _replaced_verifies(tmp_path, model, mlir, [group.index], [f"g{group.index}"])


def test_groups_a_matcher_cannot_tell_apart_each_get_their_own_import(tmp_path):
    # SqueezeNet's two fire modules have the same expand 1x1 conv + relu (same sizes; weights
    # are inputs): one matcher's ops, found in both places. Each matcher is tried on its own
    # group alone, so both at once get their own import, and the numbers are right (with
    # --dynamic, a matcher for the ops wherever they are, such a pair is refused up front:
    # test_onnx_conformance's batch norm).
    model, mlir = _imported(tmp_path, "squeezenet_like")
    groups = pb.ops(mlir)
    first, second = [g.index for g in groups if g.source[-1].endswith("_expand1_relu")]
    assert next(g for g in groups if g.index == second).same_as == first
    _replaced_verifies(tmp_path, model, mlir, [first, second], ["a", "b"])


def test_a_small_group_inside_a_larger_one_leaves_every_import_called(tmp_path):
    # The lone reshape (#3, of an input two nodes read) is the same op on the same types as the
    # reshapes inside both batch norm groups, before their roots: in one foreach_match its
    # matcher took those inner reshapes first and the larger groups' imports were never
    # called. Every group at once, those `ops` marks the same included: all called.
    model = Path(onnx_models.save(onnx_models.batch_norm_of_inputs(), tmp_path / "bn.onnx"))
    mlir = tmp_path / "bn.mlir"
    pb.import_onnx(model, mlir)
    groups = pb.ops(mlir)
    chosen = [g.index for g in groups if g.replaceable]
    assert len(chosen) >= 3 and any(g.ops == ["tensor.expand_shape"] for g in groups if g.index in chosen), groups
    _replaced_verifies(tmp_path, model, mlir, chosen, [f"k{i}" for i in chosen])


def test_a_call_iree_removes_as_dead_code_is_told_apart_from_a_matcher_that_found_nothing(tmp_path):
    # CenterCropPad: the slice's end only sets sizes that are static, so IREE drops the group
    # that computes it, call and all, after the spec placed the call. --expect-import says so,
    # not "it matched nothing"; a matcher edited to find nothing still gets that message.
    model = Path(onnx_models.save(onnx_models.center_crop_pad(), tmp_path / "ccp.onnx"))
    mlir = tmp_path / "ccp.mlir"
    pb.import_onnx(model, mlir)
    (end,) = [g.index for g in pb.ops(mlir) if g.source == ["end"]]
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[end], imports=["crop_end"])
    removed = run_cli("compile", mlir, "-o", out / "m.vmfb", "--transform-spec", out / "spec.mlir", "--expect-import", "crop_end")
    assert_clean_error(removed, "does not call import 'crop_end'", "the spec placed the call", "IREE removed it", "choose another group")
    spec = (out / "spec.mlir").read_text()
    assert spec.count("arith.addi %in, %in_0 : i64") == 1
    (out / "spec.mlir").write_text(spec.replace("arith.addi %in, %in_0 : i64", "arith.muli %in, %in_0 : i64"))
    unmatched = run_cli("compile", mlir, "-o", out / "m.vmfb", "--transform-spec", out / "spec.mlir", "--expect-import", "crop_end")
    assert_clean_error(unmatched, "does not call import 'crop_end'", "it matched nothing")
    assert "IREE removed it" not in unmatched.stderr
    assert not (out / "m.vmfb").exists()


@pytest.mark.parametrize("name", sorted(onnx_models.ARCHITECTURES))
def test_weights_in_an_archive_group_as_weights_inline(tmp_path, name):
    # Differential: a model imported with its weights in a parameter archive (util.global.load)
    # lists the same groups as with them inline (arith.constant): a load of a global nothing
    # writes is a constant, as IREE's const-expr analysis takes it. Before, each reshape of a
    # batch norm's archived statistics was a group of its own (ResNet-50: 92 of 225).
    model = Path(onnx_models.save(onnx_models.ARCHITECTURES[name](), tmp_path / f"{name}.onnx"))
    inline = pb.ops(pb.import_onnx(model, tmp_path / "inline.mlir", externalize_params=False))
    archived = pb.ops(pb.import_onnx(model, tmp_path / "archived.mlir", externalize_params=True))
    assert "util.global.load" in (tmp_path / "archived.mlir").read_text()
    assert [(g.ops, g.replaceable) for g in archived] == [(g.ops, g.replaceable) for g in inline]


@pytest.mark.parametrize("archived", [False, True])
def test_a_batch_norms_scale_and_shift_through_reshaped_weights_join_its_group(tmp_path, archived):
    # Caffe2's batch norm (ONNX's light DenseNet-121): BatchNormalization, then Mul and Add + Relu
    # by [C] weights each reshaped by an Unsqueeze of its own. A reshape of a weight was a unit
    # of its own, so the Mul consumed two groups and joined neither: three kernels, three passes
    # over the feature map (DenseNet-121: 428 groups, now 192). Weights inline or in an archive.
    model = Path(onnx_models.save(onnx_models.batch_norm_then_scale(), tmp_path / "bn_scale.onnx"))
    mlir = pb.import_onnx(model, tmp_path / "bn_scale.mlir", externalize_params=archived)
    groups = pb.ops(mlir)
    (norm,) = [g for g in groups if "bn" in g.source]
    assert {"bn", "scale", "shift", "relu"} <= set(norm.source) and norm.replaceable, [(g.index, g.source, g.ops, g.reason) for g in groups]
    assert all(g.replaceable for g in groups)
    if archived:  # inline, the importer folds each Unsqueeze of a constant away
        assert {"gamma_reshape", "beta_reshape"} <= set(norm.source), norm.source
    chosen = [g.index for g in groups]
    _replaced_verifies(tmp_path, model, mlir, chosen, [f"g{i}" for i in chosen])
