"""MLIR written for another IREE release (issue 26 item 5): the error names the release
mismatch and shows how iree-compile 3.13 writes each construct; the shown form compiles.

Each case is a program written here in both forms: the older one as earlier IREE releases
wrote it (and as IREE's own samples were written then), the newer one as 3.13 writes it.
"""

from __future__ import annotations

import re

import pytest
from conftest import SAMPLES, assert_clean_error, run_cli

CUDA = SAMPLES / "custom_dispatch" / "cuda" / "kernels"
CLAMP = """func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = tosa.clamp %a min_val(0.0 : f32) max_val(6.0 : f32) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""
SHAPE = """func.func @f(%a: tensor<4xf32>) -> tensor<2x2xf32> {
  %s = tosa.const_shape values(dense<[2, 2]> : tensor<2xindex>) : () -> !tosa.shape<2>
  %0 = tosa.reshape %a, %s : (tensor<4xf32>, !tosa.shape<2>) -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}
"""
HIP_DEVICE = """module attributes {hal.device.targets = [#hal.device.target<"hip", [#hal.executable.target<"rocm", "rocm-hsaco-fb">]> : !hal.device]} {
  func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = arith.addf %a, %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""

# A transform spec whose matcher checks the iterator kind of a dimension, the way IREE's own
# Vulkan argmax spec does (its file, unchanged, fails to parse with 3.13 for this reason).
MATCH_DIMS = """module attributes {transform.with_named_sequence} {
  transform.named_sequence @match_rows(%op: !transform.any_op {transform.readonly}) -> !transform.any_op {
    %m = transform.match.structured failures(propagate) %op : (!transform.any_op) -> !transform.any_op {
    ^bb0(%s: !transform.any_op):
      transform.match.structured.dim %s[0] parallel : !transform.any_op
      transform.match.structured.dim %s[-1] reduction : !transform.any_op
      transform.match.structured.yield %s : !transform.any_op
    }
    transform.yield %m : !transform.any_op
  }
  transform.named_sequence @note(%op: !transform.any_op {transform.readonly}) {
    transform.yield
  }
  transform.named_sequence @__transform_main(%module: !transform.any_op) {
    %funcs = transform.structured.match ops{["util.func"]} in %module : (!transform.any_op) -> !transform.any_op
    transform.foreach %funcs : !transform.any_op {
    ^bb0(%f: !transform.any_op):
      %r = transform.foreach_match in %f @match_rows -> @note : (!transform.any_op) -> !transform.any_op
    }
    transform.yield
  }
}
"""


def _older_objects(text: str) -> str:
    text = text.replace("<{objects = #hal.executable.objects<{", "attributes {objects = #hal.executable.objects<{")
    return text.replace("}>}> {", "}>} {")


def _older_workgroup_size(text: str) -> str:
    return re.sub(r"\} <workgroup_size = (\[[^\]]*\])>", r"} attributes {workgroup_size = \1}", text)


@pytest.fixture(scope="module")
def ptx_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ptx")
    assert run_cli("ptx", CUDA / "kernels.cu", "--sm", "80", "-o", out).returncode == 0
    return out


@pytest.mark.parametrize(("older", "construct", "now"), [
    (_older_objects, "`attributes {objects = ...}` on hal.executable.source", "<{objects = #hal.executable.objects<{...}>}>"),
    (_older_workgroup_size, "`} attributes {workgroup_size = ...}`", "} <workgroup_size = [64 : index, 1 : index, 1 : index]>"),
], ids=["objects", "workgroup_size"])  # fmt: skip
def test_hal_executable_constructs_of_an_older_release(cli, tmp_path, ptx_dir, older, construct, now):
    text = (CUDA / "example.mlir").read_text()
    program = tmp_path / "older.mlir"
    program.write_text(older(text))
    assert program.read_text() != text
    flags = ["--target", "cuda", "--sm", "80", "--object-search-path", ptx_dir]
    result = cli("compile", program, "-o", tmp_path / "older.vmfb", *flags)
    assert_clean_error(result, "is written for another IREE release than the iree-compile 3.13", construct, now)
    assert cli("compile", CUDA / "example.mlir", "-o", tmp_path / "now.vmfb", *flags).returncode == 0


@pytest.mark.parametrize(("now_text", "older_text", "construct", "shown", "flags"), [
    (CLAMP, CLAMP.replace("min_val(0.0 : f32) max_val(6.0 : f32)", "{min_val = 0.0 : f32, max_val = 6.0 : f32}"),
     "`tosa.clamp %x {min_val = ..., max_val = ...}`", "tosa.clamp %x min_val(0.0 : f32) max_val(6.0 : f32)", []),
    (SHAPE, SHAPE.replace("values(dense<[2, 2]> : tensor<2xindex>)", "{values = dense<[2, 2]> : tensor<2xindex>}"),
     "`tosa.const_shape {values = ...}`", "tosa.const_shape values(", []),
    (HIP_DEVICE, HIP_DEVICE.replace('device.target<"hip"', 'device.target<"rocm"'),
     '`#hal.device.target<"rocm", ...>`', '#hal.device.target<"hip", ', None),
], ids=["tosa.clamp", "tosa.const_shape", "hip device"])  # fmt: skip
def test_other_constructs_of_an_older_release(cli, tmp_path, now_text, older_text, construct, shown, flags):
    assert older_text != now_text
    (tmp_path / "older.mlir").write_text(older_text)
    result = cli("compile", tmp_path / "older.mlir", "-o", tmp_path / "older.vmfb")
    assert_clean_error(result, "is written for another IREE release", construct, shown)
    if flags is not None:  # the 3.13 form compiles (the hip device needs a GPU description to go further)
        (tmp_path / "now.mlir").write_text(now_text)
        assert cli("compile", tmp_path / "now.mlir", "-o", tmp_path / "now.vmfb", *flags).returncode == 0


def test_a_transform_spec_of_an_older_release_is_named_with_its_line(cli, tmp_path):
    program = SAMPLES / "custom_dispatch" / "vulkan" / "shaders" / "row_sums.mlir"
    older = re.sub(r"\] (parallel|reduction) :", r"] {\1} :", MATCH_DIMS)
    assert older.count("{parallel}") == 1 and older.count("{reduction}") == 1
    (tmp_path / "older_spec.mlir").write_text(older)
    result = cli("compile", program, "-o", tmp_path / "older.vmfb", "--transform-spec", tmp_path / "older_spec.mlir")
    assert_clean_error(result, "older_spec.mlir is written for another IREE release", "line 5: a unit attribute in braces", "line 6:",
                       "transform.match.structured.dim %op[0] parallel")  # fmt: skip
    assert not (tmp_path / "older.vmfb").exists()
    (tmp_path / "spec.mlir").write_text(MATCH_DIMS)
    assert cli("compile", program, "-o", tmp_path / "now.vmfb", "--transform-spec", tmp_path / "spec.mlir").returncode == 0
