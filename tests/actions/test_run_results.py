"""`run` returns whole results of any size (issue 13, item 8): iree-run-module elides text
over 1024 elements, so results are read through .npy files and printed in full."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli

import pyree_build as pb
from pyree_build.core import toolchain

BIG = """
func.func @big(%a: tensor<2000xf32>) -> (tensor<2000xf32>, tensor<2000xf32>) {
  %0 = arith.addf %a, %a : tensor<2000xf32>
  return %0, %a : tensor<2000xf32>, tensor<2000xf32>
}
func.func @grid(%a: tensor<50x40xi32>, %b: tensor<?xf32>) -> (tensor<50x40xi32>, tensor<?xf32>, tensor<f32>) {
  %s = arith.constant dense<1.5> : tensor<f32>
  return %a, %b, %s : tensor<50x40xi32>, tensor<?xf32>, tensor<f32>
}
func.func @positive(%a: tensor<2000xf32>) -> tensor<2000xi1> {
  %z = arith.constant dense<0.0> : tensor<2000xf32>
  %0 = arith.cmpf ogt, %a, %z : tensor<2000xf32>
  return %0 : tensor<2000xi1>
}
func.func @none(%a: tensor<4xf32>) {
  return
}
"""


@pytest.fixture(scope="module")
def big_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("big")
    (root / "big.mlir").write_text(BIG)
    result = run_cli("compile", root / "big.mlir", "-o", root / "big.vmfb")
    assert result.returncode == 0, result
    return root / "big.vmfb"


def test_a_2000_element_result_comes_back_whole(big_module, tmp_path):
    values = np.arange(2000, dtype=np.float32) / 8
    np.save(tmp_path / "a.npy", values)
    doubled = " ".join("%G" % v for v in values * 2)  # noqa: UP031 - as the runtime prints
    result = run_cli("run", big_module, "--function", "big", "--input", f"@{tmp_path / 'a.npy'}", "--expect", f"2000xf32={doubled}")
    assert result.returncode == 0, result
    assert "..." not in result.stdout
    assert result.stdout.count("result[") == 2
    # A wrong last element is caught: the whole result is compared, not an elided prefix.
    wrong = doubled.rsplit(" ", 1)[0] + " 1"
    assert_clean_error(run_cli("run", big_module, "--function", "big", "--input", f"@{tmp_path / 'a.npy'}", "--expect", f"2000xf32={wrong}"),
                       "output does not match")  # fmt: skip


def test_the_python_api_returns_exact_arrays_of_any_size(big_module):
    import pyree_build as pb

    doubled, same = pb.run(big_module, "big", ["2000xf32=0.1"], in_process=False)
    assert doubled.shape == (2000,) and doubled.dtype == np.float32
    assert np.array_equal(doubled, np.full(2000, np.float32(0.1) * 2))  # exact, not the printed 6 digits
    assert np.array_equal(same, np.full(2000, np.float32(0.1)))


def test_printed_results_match_what_iree_run_module_prints(big_module):
    """The text --expect and --check-file see is iree-run-module's own format, now unelided."""
    args = ["--function=grid", "--input=50x40xi32=-7", "--input=3xf32=0.1 -inf 1e10"]
    unelided = f"--output_max_element_count={1 << 20}"
    own = subprocess.run(toolchain.iree_run_module().command(f"--module={big_module}", *args, unelided), capture_output=True, text=True)
    assert own.returncode == 0, own.stderr
    ours = run_cli("run", big_module, *args)
    assert ours.returncode == 0, ours
    assert ours.stdout == own.stdout
    assert ours.stdout.splitlines()[-1] == "f32=1.5" and "3xf32=0.1 -INF 1E+10" in ours.stdout
    assert ours.stdout.count("-7") == 2000


def test_a_function_without_results_still_runs(big_module):
    result = run_cli("run", big_module, "--function", "none", "--input", "4xf32=1")
    assert result.returncode == 0, result
    assert result.stdout.strip() == "EXEC @none"


def test_results_numpy_cannot_hold_come_back_whole_as_text(big_module):
    """Results read from their text rather than a .npy file (i1 here) are never elided either."""
    import pyree_build as pb

    result = run_cli("run", big_module, "--function", "positive", "--input", "2000xf32=1")
    assert result.returncode == 0, result
    assert "..." not in result.stdout and result.stdout.count("01") == 2000
    (flags,) = pb.run(big_module, "positive", ["2000xf32=1"], in_process=False)
    assert flags.shape == (2000,) and flags.dtype == np.bool_ and flags.all()


@pytest.mark.parametrize("in_process", [True, False])
def test_a_function_the_module_lacks_is_named_with_the_ones_it_has(system_plugin, system_module, in_process):
    """issue 26 item 8: `--function main_graph` on a module without it lists its functions."""
    with pytest.raises(pb.PyreeError) as caught:
        pb.run(system_module, "main_graph", ["8xf32=1", "8xf32=1"], plugins=[system_plugin], in_process=in_process)
    assert caught.value.what == "the module has no function 'main_graph'"
    assert "mixed_invocation" in caught.value.fix and "__init" not in caught.value.fix


def test_the_cli_lists_the_functions_of_the_module(cli, system_plugin, system_module):
    result = cli("run", system_module, "--function", "main_graph", "--input", "8xf32=1", "--input", "8xf32=1", "--plugin", system_plugin)
    assert_clean_error(result, "has no function 'main_graph'", "name one of its functions: mixed_invocation")


SCALE = """
func.func @scale(%a: f32, %x: tensor<4xf32>, %n: i32) -> (tensor<4xf32>, i32) {
  %e = tensor.empty() : tensor<4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]}
      ins(%x : tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %m = arith.mulf %in, %a : f32
    linalg.yield %m : f32
  } -> tensor<4xf32>
  %twice = arith.addi %n, %n : i32
  return %r, %twice : tensor<4xf32>, i32
}
"""


@pytest.fixture(scope="module")
def scale_module(tmp_path_factory):
    root = tmp_path_factory.mktemp("scalars")
    (root / "scale.mlir").write_text(SCALE)
    assert run_cli("compile", root / "scale.mlir", "-o", root / "scale.vmfb").returncode == 0
    return root / "scale.vmfb"


@pytest.mark.parametrize("in_process", [True, False])
@pytest.mark.parametrize("a", [2.5, np.float32(2.5), np.asarray(2.5, np.float32), "2.5", "f32=2.5"], ids=repr)
def test_scalar_arguments_reach_the_function_by_their_declared_type(scale_module, a, in_process):
    """issue 26 item 3: a scalar parameter takes a Python number, a numpy scalar, a 0-d array
    or a spec, in process and out of process, and an int for an f32 is converted, not
    reinterpreted bit for bit."""
    scaled, twice = pb.run(scale_module, "scale", [a, np.ones(4, np.float32), 21], in_process=in_process)
    assert scaled.tolist() == [2.5] * 4 and int(twice) == 42
    assert pb.run(scale_module, "scale", [2, np.ones(4, np.float32), "i32=1"], in_process=in_process)[0].tolist() == [2.0] * 4


def test_an_array_for_a_scalar_parameter_is_refused_by_position(scale_module):
    with pytest.raises(pb.PyreeError, match=r"input 0 is for a scalar parameter \(f32\)"):
        pb.run(scale_module, "scale", [np.ones(3), np.ones(4, np.float32), 1])


def test_the_cli_takes_a_typed_scalar_spec(cli, scale_module):
    result = cli("run", scale_module, "--function", "scale", "--input", "f32=3", "--input", "4xf32=1", "--input", "5")
    assert result.returncode == 0, result
    assert "4xf32=3 3 3 3" in result.stdout and "10" in result.stdout


def test_expect_close_compares_each_result_within_the_tolerance(cli, scale_module):
    """issue 26 item 12: float results checked by value, not by printed digits."""
    run = ["run", scale_module, "--function", "scale", "--input", "2.5", "--input", "4xf32=1 2 3 4", "--input", "5"]
    assert cli(*run, "--expect-close", "4xf32=2.5 5 7.5 10", "--expect-close", "i32=10").returncode == 0
    off = cli(*run, "--expect-close", "4xf32=2.5 5 7.5 10.001")
    assert_clean_error(off, "result 0 differs from the expected value in 1 of 4 elements", "largest difference at index [3]: got 10.0, expected 10.001")
    assert cli(*run, "--expect-close", "4xf32=2.5 5 7.5 10.001", "--rtol", "1e-3").returncode == 0
    shape = cli(*run, "--expect-close", "3xf32=1")
    assert_clean_error(shape, "result 0 has shape [4], the expected value [3]")


def test_expect_close_takes_an_npy_reference_from_python(scale_module, tmp_path):
    reference = tmp_path / "ref.npy"
    np.save(reference, np.asarray([2.5, 5, 7.5, 10], np.float32))
    inputs = [2.5, np.asarray([1, 2, 3, 4], np.float32), 5]
    pb.run(scale_module, "scale", inputs, in_process=False, expect_close=f"@{reference}")
    np.save(reference, np.asarray([2.5, 5, 7.5, 11], np.float32))
    with pytest.raises(pb.PyreeError, match="result 0 differs"):
        pb.run(scale_module, "scale", inputs, in_process=False, expect_close=f"@{reference}", atol=0.5)


def test_bad_scalars_and_expectations_are_named(cli, scale_module):
    """Each error the scalar and --expect-close paths add, fed its bad input."""
    with pytest.raises(pb.PyreeError, match="malformed input spec 'f32=two': 'two' is not a number"):
        pb.run(scale_module, "scale", ["f32=two", np.ones(4, np.float32), 1])
    run = ["run", scale_module, "--function", "scale", "--input", "2", "--input", "4xf32=1", "--input", "1"]
    assert_clean_error(
        cli(*run, "--expect-close", "4xf32=2", "--expect-close", "i32=2", "--expect-close", "1"), "3 expected results given, the function returned 2"
    )
    assert_clean_error(cli(*run, "--expect-close", "4xf32=2", "--rtol", "-1"), "tolerances must be non-negative")
    with pytest.raises(pb.PyreeError, match="rtol must be a non-negative number"):
        pb.run(scale_module, "scale", [2.0, np.ones(4, np.float32), 1], in_process=False, expect_close="4xf32=2", rtol=-1.0)
