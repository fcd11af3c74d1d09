"""Issue 44: a model's size is no limit of Python's, and an import's name is refused up front
when the kernel's language, the MLIR or the plugin ABI cannot hold it.

A chain of 2,000 ONNX ops (a deep network's shape: ResNet-50's `ops` passed Python's recursion
limit) is imported and listed with the real tools, under the default recursion limit; `replace`
refuses keywords, reserved identifiers, `main` and IREE's plugin ABI names before it generates
anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_clean_error, run_cli

pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from support import onnx_models  # noqa: E402


def _chain(length: int, first: str = "x") -> object:
    """x[4,8] -> `length` elementwise ops (Add b, Relu, alternating) -> MatMul W[8,8] -> y;
    with `first` "softmax", a Softmax first (a row-wise group the chain joins)."""
    nodes, previous = [], "x"
    if first == "softmax":
        nodes, previous = [helper.make_node("Softmax", ["x"], ["s"], name="softmax", axis=-1)], "s"
    for i in range(length):
        inputs = [previous, "b"] if i % 2 == 0 else [previous]
        nodes.append(helper.make_node("Add" if i % 2 == 0 else "Relu", inputs, [f"v{i}"], name=f"n{i}"))
        previous = f"v{i}"
    nodes.append(helper.make_node("MatMul", [previous, "W"], ["y"], name="fc"))
    weights = [onnx_models._weights(0, "b", (8,)), onnx_models._weights(1, "W", (8, 8))]
    return onnx_models._model("chain", nodes, {"x": (4, 8)}, {"y": (4, 8)}, weights)


@pytest.mark.parametrize("first", ["x", "softmax"])
def test_ops_lists_a_2000_op_chain(tmp_path: Path, first: str) -> None:
    model, mlir = tmp_path / "chain.onnx", tmp_path / "chain.mlir"
    length = 1999 if first == "x" else 1998
    onnx_models.save(_chain(length, first), model)
    assert run_cli("import", model, "-o", mlir).returncode == 0
    listed = run_cli("ops", mlir, timeout=240)
    assert listed.returncode == 0, listed
    assert "Traceback" not in listed.output and "RecursionError" not in listed.output
    # The chain is one group (its source names every node), the MatMul another whose input
    # comes from 2,000 ops back: neither is refused for its depth.
    assert f"n{length - 1}\n" in listed.stdout and "source:   fc" in listed.stdout, listed.stdout[-2000:]


@pytest.fixture(scope="module")
def mlp_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("names")
    model, mlir = directory / "mlp.onnx", directory / "mlp.mlir"
    onnx_models.save(onnx_models.mlp(), model)
    assert run_cli("import", model, "-o", mlir).returncode == 0
    return mlir


@pytest.mark.parametrize(
    ("name", "target", "why"),
    [
        ("int", "llvm-cpu", "a keyword of C"),
        ("main", "llvm-cpu", "entry point"),
        ("iree_hal_executable_plugin_query", "llvm-cpu", "IREE's namespace"),
        ("__fc1", "llvm-cpu", "reserved"),
        ("_Fc1", "llvm-cpu", "reserved"),
        ("fc-1", "llvm-cpu", "not a C identifier"),
        ("fc\u00e91", "llvm-cpu", "not a C identifier"),
        ("class", "cuda", "a keyword of C++"),
        ("vec4", "vulkan", "a keyword of GLSL"),
        ("gl_fc1", "vulkan", "reserved"),
    ],
)
def test_replace_refuses_import_names_the_kernel_cannot_hold(tmp_path: Path, mlp_program: Path, name: str, target: str, why: str) -> None:
    out = tmp_path / "kernels"
    result = run_cli("replace", mlp_program, "--ops", "1", "--import", name, "--target", target, "-o", out)
    assert_clean_error(result, why, "fix:")
    assert not out.exists()  # refused before anything was generated


def test_a_name_that_is_a_keyword_elsewhere_is_kept_where_it_is_not(tmp_path: Path, mlp_program: Path) -> None:
    # `filter` is reserved in GLSL only: a C import may take it, and a GLSL one may not.
    assert run_cli("replace", mlp_program, "--ops", "1", "--import", "filter", "-o", tmp_path / "c").returncode == 0
    assert_clean_error(run_cli("replace", mlp_program, "--ops", "1", "--import", "filter", "--target", "vulkan", "-o", tmp_path / "g"), "GLSL")


def test_new_refuses_the_same_names(tmp_path: Path) -> None:
    assert_clean_error(run_cli("new", tmp_path / "p", "--import", "main", "--args", "in:f32,out:f32"), "entry point")


@pytest.mark.parametrize("which", ["mlir", "params"])
def test_import_never_replaces_a_file_the_user_wrote(tmp_path: Path, which: str) -> None:
    model, mlir = tmp_path / "mlp.onnx", tmp_path / "mlp.mlir"
    onnx_models.save(onnx_models.mlp(), model)
    mine = mlir if which == "mlir" else tmp_path / "mlp_params.irpa"
    mine.write_bytes(b"the user's own file\n")
    result = run_cli("import", model, "-o", mlir, "--externalize-params")
    assert_clean_error(result, str(mine), "not written by pyree_build", "--force")
    assert mine.read_bytes() == b"the user's own file\n"
    # Once removed, import writes both; again (unchanged) it may replace them; edited, it may not.
    mine.unlink()
    assert run_cli("import", model, "-o", mlir, "--externalize-params").returncode == 0
    assert run_cli("import", model, "-o", mlir, "--externalize-params").returncode == 0
    mine.write_bytes(mine.read_bytes() + b"\n")
    edited = mine.read_bytes()
    assert_clean_error(run_cli("import", model, "-o", mlir, "--externalize-params"), "edited since pyree_build wrote it")
    assert mine.read_bytes() == edited
    assert run_cli("import", model, "-o", mlir, "--externalize-params", "--force").returncode == 0
    assert mine.read_bytes() != edited


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_ops_and_replace_agree_on_a_reduction_whose_op_has_two_results(tmp_path: Path, op: str) -> None:
    # keepdims=0 lowers to one linalg.generic computing the extremum and its index: a spec's
    # rewrite cannot anchor on an op of two results. ops said "replaceable", and the build
    # failed in iree-compile with a fix that blamed IREE; both now refuse, with the reason.
    model, mlir = tmp_path / "reduce.onnx", tmp_path / "reduce.mlir"
    node = helper.make_node(op, ["x"], ["y"], name="reduce", axes=[1], keepdims=0)
    onnx_models.save(onnx_models._model("reduce", [node], {"x": (4, 8)}, {"y": (4,)}), model)
    assert run_cli("import", model, "-o", mlir).returncode == 0
    listed = run_cli("ops", mlir)
    assert listed.returncode == 0, listed
    assert "replace:  no: its last op (linalg.generic) has 2 results" in listed.stdout, listed.stdout
    result = run_cli("replace", mlir, "--ops", "1", "--import", "reduce", "-o", tmp_path / "kernels", "--onnx", model)
    assert_clean_error(result, "cannot be replaced", "has 2 results", "Only one op can be specified as an insertion point")
    assert not (tmp_path / "kernels").exists()
