"""Issues 33 and 45: `verify` catches kernels that are wrong only where small random inputs
never go (a clip bound above 1, equal elements, the top bit of an unsigned integer, one
element of a small output at its threshold, a negative index), draws no random shapes,
reads stored inputs and outputs, scales its tolerance to each output, tells IREE's own
differences from a kernel's (--baseline), and names the types and models it cannot check.

Each wrong kernel is the generated C with one deliberate bug; `--trials 1` is the draw verify
made before (floats in [-1, 1], integers in [0, 4), seed 0), which the bug passes. ONNX's
node tests the proofs use are written here by onnx's own tool (benchmarks/onnx_conformance.py),
so every proof runs wherever onnx and onnxruntime are installed."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, assert_clean_error, benchmark_module, run_cli

onnx = pytest.importorskip("onnx", reason='onnx is not installed (pip install "pyree_build[onnx]")')
pytest.importorskip("onnxruntime", reason='onnxruntime is not installed (pip install "pyree_build[onnx]")')

import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from pyree_build.models import verify, verify_inputs  # noqa: E402

# The ONNX node tests the proofs read, written once per run by onnx's own tool.
NODE_TESTS = ("test_abs", "test_det_2d", "test_bitshift_right_uint32", "test_bitwise_and_ui8_bcast_4v3d", "test_shrink_hard")


def _generate_node_data(directory: Path) -> Path:
    harness = benchmark_module("onnx_conformance")
    with warnings.catch_warnings():  # the tool computes every case's outputs, some dividing by zero on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        folder: Path = harness.generate_data(directory, "^(" + "|".join(NODE_TESTS) + ")$")
    assert sorted(p.name for p in folder.iterdir()) == sorted(NODE_TESTS), "onnx's tool did not write every node test the proofs use"
    return folder


@pytest.fixture(scope="module")
def node_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generate_node_data(tmp_path_factory.mktemp("onnx-node"))


def _model(name: str, nodes: list, inputs: dict, outputs: dict, initializers: list = (), opset: int = 17) -> onnx.ModelProto:  # type: ignore[assignment]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def clip_constant_bounds() -> onnx.ModelProto:
    """Clip to [-2.5, 2.5], the bounds as initializers: floats in [-1, 1] never reach them."""
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", -2.5), ("hi", 2.5))]
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")
    return _model("clip_const", [node], {"x": (TensorProto.FLOAT, [4, 8])}, {"y": (TensorProto.FLOAT, [4, 8])}, bounds)


def _node_model(test: str) -> Callable[[Path], onnx.ModelProto]:
    return lambda data: onnx.load(str(data / test / "model.onnx"))


def _one_edit(*pairs: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        for old, new in zip(pairs[::2], pairs[1::2]):
            assert text.count(old) == 1, text
            text = text.replace(old, new)
        return text

    return edit


# (model, the generated line, the bug put in its place)
WRONG_KERNELS = {
    # The upper bound dropped: only inputs above 2.5 show it. (The bounds are written into the
    # C: the generated kernel reads rank-0 constant operands wrongly in this tree, a generator
    # issue apart from verify's.)
    "clip_bound_dropped": (
        lambda data: clip_constant_bounds(),
        _one_edit(
            "const float a2 = in1[0];", "const float a2 = -2.5f;", "const float a3 = in2[0];", "const float a3 = 2.5f;", "(float)(v6 ? a3 : v5)", "(float)(v5)"
        ),
    ),  # fmt: skip
    # An arithmetic shift of a uint32: only values with the top bit set show it.
    "unsigned_shift_sign_extends": (
        _node_model("test_bitshift_right_uint32"),
        _one_edit("(int32_t)((uint32_t)a1 >> (uint32_t)a2)", "(int32_t)(a1 >> a2)"),
    ),
    # uint8 bits read as a signed char and "negatives" zeroed: only values >= 128 show it.
    "unsigned_bitwise_as_signed": (
        _node_model("test_bitwise_and_ui8_bcast_4v3d"),
        _one_edit("(int8_t)(a1 & a2)", "(int8_t)((a1 & a2) < 0 ? 0 : (a1 & a2))"),
    ),
    # Shrink (lambd 1.5) of 5 elements, its bound a step off (-1.5015) at the last element
    # only: only that element in [-1.5015, -1.5) shows it. Three draws of 5 elements do not
    # put it there; the threshold draws put every bound and its steps at every element.
    "shrink_last_element_threshold": (
        _node_model("test_shrink_hard"),
        _one_edit("(int8_t)((a1) < (v2))", "(int8_t)((a1) < ((col0 + c) == 4 ? -1.5015f : v2))"),
    ),
}


def _replaced(tmp_path: Path, model: onnx.ModelProto, edit: Callable[[str], str]) -> tuple[Path, Path, Path, Path]:
    """(model.onnx, the replaced module, the wrong kernel's plugin, the unreplaced module)."""
    onnx_file, mlir = tmp_path / "model.onnx", tmp_path / "model.mlir"
    onnx.save(model, onnx_file)
    assert run_cli("import", onnx_file, "-o", mlir).returncode == 0
    kernels = tmp_path / "kernels"
    result = run_cli("replace", mlir, "--ops", "1", "--import", "k", "-o", kernels)
    assert result.returncode == 0, result
    wrong = tmp_path / "wrong.c"
    wrong.write_text(edit((kernels / "k.c").read_text()))
    plugin, module, unreplaced = tmp_path / "wrong.so", tmp_path / "replaced.vmfb", tmp_path / "unreplaced.vmfb"
    assert run_cli("plugin", "--kind", "system", wrong, "-o", plugin).returncode == 0
    result = run_cli("compile", mlir, "-o", module, "--transform-spec", kernels / "spec.mlir", "--expect-import", "k")
    assert result.returncode == 0, result
    assert run_cli("compile", mlir, "-o", unreplaced).returncode == 0
    return onnx_file, module, plugin, unreplaced


@pytest.mark.parametrize("case", sorted(WRONG_KERNELS))
def test_a_kernel_wrong_outside_small_inputs_passes_the_old_draw_and_fails_the_default(tmp_path, node_data, case):
    build, edit = WRONG_KERNELS[case]
    onnx_file, module, plugin, unreplaced = _replaced(tmp_path, build(node_data), edit)
    old = run_cli("verify", module, "--onnx", onnx_file, "--plugin", plugin, "--trials", "1")
    assert old.returncode == 0, old  # what verify said before: "verified"
    caught = run_cli("verify", module, "--onnx", onnx_file, "--plugin", plugin)
    assert_clean_error(caught, "differ from onnxruntime's", "--baseline")
    assert "MISMATCH" in caught.stdout
    # With the unreplaced module as the baseline the kernel, not IREE, is blamed.
    blamed = run_cli("verify", module, "--onnx", onnx_file, "--plugin", plugin, "--baseline", unreplaced)
    assert_clean_error(blamed, "differ from onnxruntime's", "fix the kernel")
    assert "IREE's own module differs" not in blamed.stderr
    # IREE's own module is right on every draw.
    assert run_cli("verify", unreplaced, "--onnx", onnx_file).returncode == 0


def _argmax(select_last_index: int) -> onnx.ModelProto:
    node = helper.make_node("ArgMax", ["x"], ["i"], name="argmax", axis=1, keepdims=0, select_last_index=select_last_index)
    return _model("argmax", [node], {"x": (TensorProto.FLOAT, [4, 16])}, {"i": (TensorProto.INT64, [4])})


def test_an_argmax_that_picks_the_last_of_equal_values_fails(tmp_path):
    # A module that takes the last of equal maxima, against the model that takes the first:
    # floats in [-1, 1] never tie, the default draws do.
    onnx.save(_argmax(0), tmp_path / "first.onnx")
    onnx.save(_argmax(1), tmp_path / "last.onnx")
    assert run_cli("import", tmp_path / "last.onnx", "-o", tmp_path / "last.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "last.mlir", "-o", tmp_path / "last.vmfb").returncode == 0
    assert run_cli("verify", tmp_path / "last.vmfb", "--onnx", tmp_path / "first.onnx", "--trials", "1").returncode == 0
    caught = run_cli("verify", tmp_path / "last.vmfb", "--onnx", tmp_path / "first.onnx")
    assert_clean_error(caught, "1 of 1 outputs of argmax differ from onnxruntime's on 1 of 3 sets of inputs")
    assert "ties" in caught.stdout and "MISMATCH" in caught.stdout


def test_iree_own_difference_is_reported_as_iree_s_with_a_baseline(tmp_path, node_data):
    # Det of a matrix whose first pivot is zero: IREE 3.13's own module differs from the
    # stored output. Verified against itself as the baseline, the blame goes to IREE.
    test = node_data / "test_det_2d"
    assert run_cli("import", test / "model.onnx", "-o", tmp_path / "det.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "det.mlir", "-o", tmp_path / "det.vmfb").returncode == 0
    plain = run_cli("verify", tmp_path / "det.vmfb", "--onnx", test / "model.onnx", "--inputs", test / "test_data_set_0")
    if plain.returncode == 0:
        pytest.skip("this IREE release computes Det with a zero pivot right")
    assert_clean_error(plain, "differ from the stored outputs")
    assert "stored" in plain.stdout
    iree = run_cli("verify", tmp_path / "det.vmfb", "--onnx", test / "model.onnx", "--inputs", test / "test_data_set_0", "--baseline", tmp_path / "det.vmfb")
    assert_clean_error(iree, "IREE's own module differs from the reference", "not your kernel")
    assert "the module agrees with it" in iree.stdout


def test_stored_inputs_and_outputs_are_the_reference(tmp_path, node_data):
    test = node_data / "test_abs"
    assert run_cli("import", test / "model.onnx", "-o", tmp_path / "abs.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "abs.mlir", "-o", tmp_path / "abs.vmfb").returncode == 0
    ok = run_cli("verify", tmp_path / "abs.vmfb", "--onnx", test / "model.onnx", "--inputs", test / "test_data_set_0")
    assert ok.returncode == 0, ok
    assert "stored" in ok.stdout and "verified test_abs against the stored outputs" in ok.stderr
    files = [test / "test_data_set_0" / "input_0.pb"]
    assert run_cli("verify", tmp_path / "abs.vmfb", "--onnx", test / "model.onnx", "--inputs", *files).returncode == 0
    # A stored output that is wrong is a mismatch against the stored outputs, not onnxruntime.
    edited = tmp_path / "edited"
    shutil.copytree(test / "test_data_set_0", edited)
    expected = numpy_helper.to_array(onnx.load_tensor(str(edited / "output_0.pb")))
    (edited / "output_0.pb").write_bytes(numpy_helper.from_array(expected + 1.0).SerializeToString())
    assert_clean_error(run_cli("verify", tmp_path / "abs.vmfb", "--onnx", test / "model.onnx", "--inputs", edited), "differ from the stored outputs")
    np.save(tmp_path / "x.npy", np.zeros((2, 2), np.float32))
    assert_clean_error(run_cli("verify", tmp_path / "abs.vmfb", "--onnx", test / "model.onnx", "--inputs", tmp_path / "x.npy"), "graph input 'x' is [3, 4, 5]")
    assert_clean_error(
        run_cli("verify", tmp_path / "abs.vmfb", "--onnx", test / "model.onnx", "--inputs", edited, "--input", "3x4x5xf32=1"),
        "both --input and --inputs given",
    )
    assert_clean_error(run_cli("verify", tmp_path / "abs.vmfb", "--onnx", test / "model.onnx", "--trials", "0"), "--trials must be at least 1")


def test_f64_models_say_iree_demotes_them_and_which_flag_keeps_f64(tmp_path):
    model = _model("abs64", [helper.make_node("Abs", ["x"], ["y"], name="abs")], {"x": (TensorProto.DOUBLE, [3, 5])}, {"y": (TensorProto.DOUBLE, [3, 5])})
    onnx.save(model, tmp_path / "abs64.onnx")
    assert run_cli("import", tmp_path / "abs64.onnx", "-o", tmp_path / "abs64.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "abs64.mlir", "-o", tmp_path / "demoted.vmfb").returncode == 0
    assert_clean_error(
        run_cli("verify", tmp_path / "demoted.vmfb", "--onnx", tmp_path / "abs64.onnx"),
        "input 0 is float64 (f64)",
        "iree-compile demotes f64 to f32 by default",
        "--iree-input-demote-f64-to-f32=false",
    )
    kept = tmp_path / "kept.vmfb"
    assert run_cli("compile", tmp_path / "abs64.mlir", "-o", kept, "--", "--iree-input-demote-f64-to-f32=false").returncode == 0
    result = run_cli("verify", kept, "--onnx", tmp_path / "abs64.onnx")
    assert result.returncode == 0, result


@pytest.mark.parametrize("elem_type, name", [(TensorProto.BFLOAT16, "BFLOAT16"), (TensorProto.FLOAT8E4M3FN, "FLOAT8E4M3FN")])
def test_bfloat16_and_float8_inputs_are_named(tmp_path, elem_type, name):
    model = _model("narrow", [helper.make_node("Identity", ["x"], ["y"], name="id")], {"x": (elem_type, [4])}, {"y": (elem_type, [4])})
    onnx.save(model, tmp_path / "narrow.onnx")
    (tmp_path / "m.vmfb").write_bytes(b"not read: the model's types are checked first")
    assert_clean_error(run_cli("verify", tmp_path / "m.vmfb", "--onnx", tmp_path / "narrow.onnx"), f"graph input or output 'x' is {name}", "Cast", "float32")


def test_wide_draws_cross_the_model_s_constants_and_cover_integer_types(tmp_path):
    model = clip_constant_bounds()
    drawn = verify_inputs.draw(model, tmp_path / "m.onnx", seed=1, style="wide").arrays[0]
    assert (drawn > 2.5).any() and (drawn < -2.5).any() and np.isin(drawn, np.float32([2.5, -2.5])).any()
    ints = _model("bits", [helper.make_node("BitShift", ["x", "s"], ["y"], direction="RIGHT")], {"x": (TensorProto.UINT32, [64]), "s": (TensorProto.UINT32, [64])},
                  {"y": (TensorProto.UINT32, [64])})  # fmt: skip
    values, shifts = verify_inputs.draw(ints, tmp_path / "m.onnx", seed=1, style="wide").arrays
    assert values.max() >= 2**31 and values.min() == 0 and shifts.max() < 32  # a shift by 32 or more is undefined
    ties = verify_inputs.draw(_argmax(0), tmp_path / "m.onnx", seed=2, style="ties").arrays[0]
    assert sum(np.sum(row == row.max()) > 1 for row in ties) >= 3
    # However small the input, each wide draw goes past both bounds (a handful of random values may not).
    tiny = clip_constant_bounds()
    for dim in tiny.graph.input[0].type.tensor_type.shape.dim[1:]:
        dim.dim_value = 1
    tiny.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    for seed in range(20):
        (few,) = verify_inputs.draw(tiny, tmp_path / "m.onnx", seed=seed, style="wide").arrays
        assert few.shape == (3, 1) and few.min() < -2.5 and few.max() > 2.5
    (narrow,) = verify_inputs.draw(_model("n", [helper.make_node("Neg", ["x"], ["y"])], {"x": (TensorProto.UINT8, [2])}, {"y": (TensorProto.UINT8, [2])}),
                           tmp_path / "m.onnx", seed=0, style="wide").arrays  # fmt: skip
    assert sorted(narrow.tolist()) == [0, 255]
    uniform = verify_inputs.draw(model, tmp_path / "m.onnx", seed=0, style="uniform").arrays[0]
    assert np.array_equal(uniform, np.random.default_rng(0).uniform(-1.0, 1.0, (4, 8)).astype(np.float32))  # the draw verify made before


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 2000),
    st.floats(1e-6, 1e6),
    st.integers(0, 2**31 - 1),
)
def test_the_tolerance_follows_each_output_s_scale(size, scale, seed):
    # A softmax-like output (every value ~scale/size) compared with itself passes, and one
    # element off by 1% of its value fails, however small the output's values are.
    rng = np.random.default_rng(seed)
    want = (rng.dirichlet(np.ones(size)) * scale).astype(np.float32)
    assert verify.compare(0, "y", want.copy(), want, verify.DEFAULT_RTOL, None).passed
    wrong = want.copy()
    k = int(np.argmax(want))
    wrong[k] *= np.float32(1.01)
    result = verify.compare(0, "y", wrong, want, verify.DEFAULT_RTOL, None)
    assert not result.passed and result.worst_index == (k,) and result.mismatched == 1


def test_integer_outputs_are_exact_and_signless_results_compare_by_their_bits():
    want = np.array([0, 255, 128], np.uint8)
    same = verify.compare(0, "y", want.view(np.int8), want, verify.DEFAULT_RTOL, None)
    assert same.passed and "compared bit for bit as uint8" in same.note
    big = np.array([10**9, 7], np.int64)
    assert not verify.compare(0, "y", big + np.array([1, 0]), big, verify.DEFAULT_RTOL, None).passed  # within rtol, not equal


def test_a_softmax_that_adds_its_row_maximum_fails(tmp_path):
    # exp(x + max) / sum is softmax wherever exp does not overflow: floats within [-2, 2] never
    # show it; the wide draw reaches the largest magnitude it draws, where it overflows.
    softmax = _model(
        "sm", [helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1)], {"x": (TensorProto.FLOAT, [4, 10])}, {"y": (TensorProto.FLOAT, [4, 10])}
    )
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], name="max", axes=[1], keepdims=1),
        helper.make_node("Add", ["x", "m"], ["shifted"], name="add"),
        helper.make_node("Exp", ["shifted"], ["e"], name="exp"),
        helper.make_node("ReduceSum", ["e", "one"], ["total"], name="sum", keepdims=1),
        helper.make_node("Div", ["e", "total"], ["y"], name="div"),
    ]
    added = _model(
        "sm", nodes, {"x": (TensorProto.FLOAT, [4, 10])}, {"y": (TensorProto.FLOAT, [4, 10])}, [numpy_helper.from_array(np.array([1], np.int64), "one")]
    )
    onnx.save(softmax, tmp_path / "softmax.onnx")
    onnx.save(added, tmp_path / "added.onnx")
    assert run_cli("import", tmp_path / "added.onnx", "-o", tmp_path / "added.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "added.mlir", "-o", tmp_path / "added.vmfb").returncode == 0
    assert run_cli("verify", tmp_path / "added.vmfb", "--onnx", tmp_path / "softmax.onnx", "--trials", "1").returncode == 0
    assert_clean_error(run_cli("verify", tmp_path / "added.vmfb", "--onnx", tmp_path / "softmax.onnx"), "differ from onnxruntime's")


def _softmax_by(maximum: list, extra: list = ()) -> onnx.ModelProto:  # type: ignore[assignment]
    """Softmax of x[4, 10] over axis 1 that subtracts `maximum`'s result 'm' (nodes from x)."""
    nodes = [
        *maximum,
        helper.make_node("Sub", ["x", "m"], ["shifted"], name="sub"),
        helper.make_node("Exp", ["shifted"], ["e"], name="exp"),
        helper.make_node("ReduceSum", ["e", "one"], ["total"], name="sum", keepdims=1),
        helper.make_node("Div", ["e", "total"], ["y"], name="div"),
    ]
    constants = [numpy_helper.from_array(np.array([1], np.int64), "one"), *extra]
    return _model("sm", nodes, {"x": (TensorProto.FLOAT, [4, 10])}, {"y": (TensorProto.FLOAT, [4, 10])}, constants)


@pytest.mark.parametrize("wrong", ["last_element_left_out", "next_row_s_maximum"])
def test_a_softmax_whose_maximum_is_wrong_fails_on_the_peaks_draws(tmp_path, wrong):
    # Subtracting any constant leaves softmax unchanged where exp neither overflows nor
    # underflows: a maximum over 9 of the 10 elements (a bound off by one), or the next row's
    # (an index off by one), passes every draw but those with one element of each row 128
    # above the rest, at the row's ends in turn.
    if wrong == "last_element_left_out":
        maximum = [
            helper.make_node("Slice", ["x", "s0", "s9", "s1"], ["first"], name="first9"),
            helper.make_node("ReduceMax", ["first"], ["m"], name="max", axes=[1], keepdims=1),
        ]
        extra = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s0", 0), ("s9", 9), ("s1", 1))]
    else:
        maximum = [
            helper.make_node("ReduceMax", ["x"], ["rows"], name="max", axes=[1], keepdims=1),
            helper.make_node("Gather", ["rows", "next"], ["m"], name="next", axis=0),
        ]
        extra = [numpy_helper.from_array(np.array([1, 2, 3, 0], np.int64), "next")]
    softmax = _model(
        "sm", [helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1)], {"x": (TensorProto.FLOAT, [4, 10])}, {"y": (TensorProto.FLOAT, [4, 10])}
    )
    onnx.save(softmax, tmp_path / "softmax.onnx")
    onnx.save(_softmax_by(maximum, extra), tmp_path / "wrong.onnx")
    assert verify_inputs.peak_places(softmax, tmp_path / "softmax.onnx") == [0, 9, 1, 8]
    assert run_cli("import", tmp_path / "wrong.onnx", "-o", tmp_path / "wrong.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "wrong.mlir", "-o", tmp_path / "wrong.vmfb").returncode == 0
    before = run_cli("verify", tmp_path / "wrong.vmfb", "--onnx", tmp_path / "softmax.onnx", "--function", "sm", "--trials", "2")
    assert before.returncode == 0, before  # uniform and wide: no row far above its maximum
    caught = run_cli("verify", tmp_path / "wrong.vmfb", "--onnx", tmp_path / "softmax.onnx", "--function", "sm")
    assert_clean_error(caught, "differ from onnxruntime's")
    assert "peaks: a softmax's (or max's) input at the range's low end" in caught.stdout + caught.stderr
    # Each line along every axis holds at most one peak, at each end in turn; some lines none.
    first, last = (verify_inputs.draw(softmax, tmp_path / "softmax.onnx", seed=0, style=verify_inputs.PEAKS, turn=k).arrays[0] for k in (0, 1))
    for drawn in (first, last):
        assert ((drawn == 64).sum(axis=1) <= 1).all() and ((drawn == 64).sum(axis=0) <= 1).all()
        assert set(np.unique(drawn).tolist()) == {-64.0, 64.0}
    assert first[0, 0] == 64 and last[0, 9] == 64 and 0 in (first == 64).sum(axis=1)
    # Deeper in a model (a MatMul first) a peak at the input is none at the maximum: no peaks draws.
    deep = _model(
        "deep", [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Softmax", ["h"], ["y"], name="sm")],
        {"x": (TensorProto.FLOAT, [4, 10])}, {"y": (TensorProto.FLOAT, [4, 10])}, [numpy_helper.from_array(np.eye(10, dtype=np.float32), "w")],
    )  # fmt: skip
    assert verify_inputs.peak_places(deep, tmp_path / "deep.onnx") == []


def _gather(clamped: bool) -> onnx.ModelProto:
    """Gather of 10 rows; `clamped`: the indices clamped at 0 first, as a kernel that drops
    ONNX's negative indices (counted from the end) computes."""
    nodes = [helper.make_node("Gather", ["data", "idx2" if clamped else "idx"], ["y"], name="gather", axis=0)]
    zero = [numpy_helper.from_array(np.array(0, np.int64), "zero")] if clamped else []
    if clamped:
        nodes.insert(0, helper.make_node("Max", ["idx", "zero"], ["idx2"], name="clamp"))
    return _model("gather", nodes, {"data": (TensorProto.FLOAT, [10, 4]), "idx": (TensorProto.INT64, [6])}, {"y": (TensorProto.FLOAT, [6, 4])}, zero)


def test_indices_are_drawn_across_their_axis_negatives_included(tmp_path):
    # A module that treats negative indices as 0, against the model: integers in [0, 4) (the
    # draws before) never show it; indices drawn across [-10, 10) do. IREE's own module of the
    # model verifies on the same draws (onnxruntime takes every index drawn).
    onnx.save(_gather(False), tmp_path / "gather.onnx")
    onnx.save(_gather(True), tmp_path / "clamped.onnx")
    for name in ("gather", "clamped"):
        assert run_cli("import", tmp_path / f"{name}.onnx", "-o", tmp_path / f"{name}.mlir").returncode == 0
        assert run_cli("compile", tmp_path / f"{name}.mlir", "-o", tmp_path / f"{name}.vmfb").returncode == 0
    right = run_cli("verify", tmp_path / "gather.vmfb", "--onnx", tmp_path / "gather.onnx")
    assert right.returncode == 0, right
    assert "'idx' indexes Gather 'gather' across [-10, 10)" in right.stdout and "onnxruntime refused" not in right.stdout
    caught = run_cli("verify", tmp_path / "clamped.vmfb", "--onnx", tmp_path / "gather.onnx")
    assert_clean_error(caught, "differ from onnxruntime's")
    for seed in range(3):
        (data, idx) = verify_inputs.draw(_gather(False), tmp_path / "m.onnx", seed=seed, style=verify_inputs.style_of(seed)).arrays
        assert idx.min() >= -10 and idx.max() < 10 and (idx < 0).any(), idx


def test_scatter_and_nd_indices_are_distinct_places_across_every_axis(tmp_path):
    # ScatterND writes: two equal index tuples race (ONNX leaves which wins undefined), so its
    # tuples are distinct; each component spans its axis, from the start or from the end.
    node = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"], name="scatter")
    model = _model("scatter", [node], {"data": (TensorProto.FLOAT, [5, 3, 2]), "idx": (TensorProto.INT64, [6, 2]), "upd": (TensorProto.FLOAT, [6, 2])},
                   {"y": (TensorProto.FLOAT, [5, 3, 2])})  # fmt: skip
    seen = set()
    for seed in range(6):
        idx = verify_inputs.draw(model, tmp_path / "m.onnx", seed=seed, style=verify_inputs.style_of(seed)).arrays[1]
        places = {(int(a) % 5, int(b) % 3) for a, b in idx}
        assert len(places) == 6 and (idx[:, 0] >= -5).all() and (idx[:, 0] < 5).all() and (idx[:, 1] >= -3).all() and (idx[:, 1] < 3).all(), idx
        seen.update(int(v) for v in idx.ravel())
    assert min(seen) == -5 and max(seen) == 4
    elements = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], name="scatter", axis=1)
    model = _model("scatter", [elements], {"data": (TensorProto.FLOAT, [4, 5]), "idx": (TensorProto.INT64, [4, 3]), "upd": (TensorProto.FLOAT, [4, 3])},
                   {"y": (TensorProto.FLOAT, [4, 5])})  # fmt: skip
    idx = verify_inputs.draw(model, tmp_path / "m.onnx", seed=1, style="wide").arrays[1]
    assert all(len({int(v) % 5 for v in row}) == 3 for row in idx), idx  # distinct along the axis written


def test_a_clip_s_bounds_given_as_inputs_are_drawn_in_order(tmp_path):
    # A clip whose min exceeds its max is constant: nothing of its input reaches the output.
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")
    model = _model(
        "clip", [node], {"x": (TensorProto.FLOAT, [3, 4]), "lo": (TensorProto.FLOAT, []), "hi": (TensorProto.FLOAT, [])}, {"y": (TensorProto.FLOAT, [3, 4])}
    )
    onnx.save(model, tmp_path / "clip.onnx")
    for seed in range(6):
        drawn = verify_inputs.draw(model, tmp_path / "clip.onnx", seed=seed, style=verify_inputs.style_of(seed)).arrays
        assert drawn[1] <= drawn[2] and all(isinstance(a, np.ndarray) for a in drawn), drawn
        verify.reference_outputs(tmp_path / "clip.onnx", model, drawn)  # onnxruntime takes them


def _reshape(declared: bool) -> onnx.ModelProto:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")
    model = _model("reshape", [node], {"x": (TensorProto.FLOAT, [2, 3, 4]), "shape": (TensorProto.INT64, [2])}, {"y": (TensorProto.FLOAT, [6, 4])})
    if not declared:
        model.graph.output[0].type.tensor_type.ClearField("shape")
    return model


def test_a_shape_input_is_the_shape_the_model_declares_or_is_refused_by_name(tmp_path):
    # The shape is a graph input: random values reshape to shapes the module was not compiled
    # for. Where the model declares the result's shape, that is the value drawn; where it does
    # not, verify names the input and asks for stored inputs, never "the same input shapes".
    onnx.save(_reshape(True), tmp_path / "reshape.onnx")
    assert run_cli("import", tmp_path / "reshape.onnx", "-o", tmp_path / "reshape.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "reshape.mlir", "-o", tmp_path / "reshape.vmfb").returncode == 0
    result = run_cli("verify", tmp_path / "reshape.vmfb", "--onnx", tmp_path / "reshape.onnx")
    assert result.returncode == 0, result
    assert "'shape' is the shape the model declares, [6, 4]" in result.stdout
    onnx.save(_reshape(False), tmp_path / "undeclared.onnx")
    refused = run_cli("verify", tmp_path / "reshape.vmfb", "--onnx", tmp_path / "undeclared.onnx")
    assert_clean_error(refused, "undeclared.onnx", "graph input 'shape' is the shape of Reshape 'reshape'", "--inputs DIR")
    assert "same input shapes" not in refused.stderr
    # Stored inputs are taken as given.
    np.save(tmp_path / "x.npy", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    np.save(tmp_path / "shape.npy", np.array([-1, 4], np.int64))
    stored = run_cli("verify", tmp_path / "reshape.vmfb", "--onnx", tmp_path / "reshape.onnx", "--inputs", tmp_path / "x.npy", tmp_path / "shape.npy")
    assert stored.returncode == 0, stored


def test_slice_bounds_place_the_declared_window_anywhere_from_either_end(tmp_path):
    # Slice's starts and ends as graph inputs: random ones slice windows of other lengths than
    # the module's result ("result 0 has shape ..."); drawn as a window of the declared length,
    # placed anywhere and counted from either end, IREE's own module verifies.
    node = helper.make_node("Slice", ["x", "s", "e", "axes"], ["y"], name="slice")
    inputs = {"x": (TensorProto.FLOAT, [10, 4]), "s": (TensorProto.INT64, [1]), "e": (TensorProto.INT64, [1])}
    model = _model("slice", [node], inputs, {"y": (TensorProto.FLOAT, [4, 4])}, [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    onnx.save(model, tmp_path / "slice.onnx")
    starts = set()
    for seed in range(9):
        _, s, e = verify_inputs.draw(model, tmp_path / "slice.onnx", seed=seed, style=verify_inputs.style_of(seed)).arrays
        first, last = int(s[0]) % 10, (int(e[0]) % 10 if int(e[0]) < 10 else 10) or 10
        assert last - first == 4, (s, e)
        starts.add(int(s[0]))
    assert min(starts) < 0 <= max(starts), starts
    assert run_cli("import", tmp_path / "slice.onnx", "-o", tmp_path / "slice.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "slice.mlir", "-o", tmp_path / "slice.vmfb").returncode == 0
    result = run_cli("verify", tmp_path / "slice.vmfb", "--onnx", tmp_path / "slice.onnx")
    assert result.returncode == 0, result
    assert "'s' places the window of Slice 'slice', [4] of [10], anywhere" in result.stdout
    # With the axes a graph input too, the window cannot be known: refused by name.
    node.input[3] = "axes_in"
    model = _model("slice", [node], {**inputs, "axes_in": (TensorProto.INT64, [1])}, {"y": (TensorProto.FLOAT, [4, 4])})
    onnx.save(model, tmp_path / "axes.onnx")
    assert_clean_error(
        run_cli("verify", tmp_path / "slice.vmfb", "--onnx", tmp_path / "axes.onnx"), "graph input 'axes_in' is the axes of Slice 'slice'", "--inputs"
    )


@pytest.mark.parametrize("keepdims, result, axes", [(1, [3, 1, 2], [1]), (1, [1, 1, 1], [0, 1, 2]), (0, [3, 2], None)])
def test_a_reduction_s_axes_are_read_off_the_declared_shapes_where_certain(tmp_path, keepdims, result, axes):
    count = len(axes) if axes else 1
    # With keepdims the reduced axes are the ones whose size drops to 1; without, 3x2x2 -> 3x2
    # could be axis 1 or 2 (other sums): refused by name.
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum", keepdims=keepdims)
    model = _model("sum", [node], {"x": (TensorProto.FLOAT, [3, 2, 2]), "axes": (TensorProto.INT64, [count])},
                   {"y": (TensorProto.FLOAT, result)}, opset=18)  # fmt: skip
    onnx.save(model, tmp_path / "sum.onnx")
    if axes is None:
        with pytest.raises(verify_inputs.PyreeError, match="graph input 'axes' is the axes of ReduceSum 'sum'"):
            verify_inputs.draw(model, tmp_path / "sum.onnx", seed=0, style="wide")
        return
    drawn = verify_inputs.draw(model, tmp_path / "sum.onnx", seed=0, style="wide").arrays
    assert drawn[1].tolist() == axes
    verify.reference_outputs(tmp_path / "sum.onnx", model, drawn)  # onnxruntime's result has the declared shape
    assert list(verify.reference_outputs(tmp_path / "sum.onnx", model, drawn)[1][0].shape) == result


def test_onnxruntime_s_own_refusal_asks_for_stored_outputs(tmp_path):
    # LSTM with layout=1 is valid ONNX that IREE compiles and onnxruntime refuses: no reference
    # to draw against, and nothing the user should check the model for.
    import onnxruntime

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((1, 12, n)).astype(np.float32), w) for w, n in (("W", 2), ("R", 3))]
    node = helper.make_node("LSTM", ["x", "W", "R"], ["", "h"], name="lstm", hidden_size=3, layout=1)
    model = _model("lstm", [node], {"x": (TensorProto.FLOAT, [2, 4, 2])}, {"h": (TensorProto.FLOAT, [2, 1, 3])}, weights)
    onnx.checker.check_model(model, full_check=True)  # valid ONNX
    onnx.save(model, tmp_path / "lstm.onnx")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    with pytest.raises(Exception, match="layout") as own:  # the installed onnxruntime really refuses it
        onnxruntime.InferenceSession(str(tmp_path / "lstm.onnx"), options, providers=["CPUExecutionProvider"])
    assert run_cli("import", tmp_path / "lstm.onnx", "-o", tmp_path / "lstm.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "lstm.mlir", "-o", tmp_path / "lstm.vmfb").returncode == 0
    refused = run_cli("verify", tmp_path / "lstm.vmfb", "--onnx", tmp_path / "lstm.onnx")
    # The node and onnxruntime's own words; stored data as the way out, not a check of the model.
    assert_clean_error(refused, "onnxruntime cannot load the model: it refuses LSTM 'lstm'", str(own.value).split(": ")[-1][:60], "--inputs DIR", "output_N.pb")
    assert "onnx.checker" not in refused.stderr and "[E:onnxruntime" not in refused.stderr  # not also onnxruntime's log line


def test_onnxruntime_s_refusal_at_the_run_names_the_node(tmp_path):
    # Loaded, then refused on these inputs (an integer division by zero): the node is named.
    node = helper.make_node("Div", ["a", "b"], ["y"], name="div")
    model = _model("div", [node], {"a": (TensorProto.INT32, [4]), "b": (TensorProto.INT32, [4])}, {"y": (TensorProto.INT32, [4])})
    onnx.save(model, tmp_path / "div.onnx")
    with pytest.raises(verify.PyreeError) as refused:
        verify.reference_outputs(tmp_path / "div.onnx", model, [np.ones(4, np.int32), np.zeros(4, np.int32)])
    assert "onnxruntime refused to run Div 'div' on these inputs" in refused.value.what, refused.value
    assert "division by zero" in (refused.value.details or "") and "--inputs DIR" in (refused.value.fix or "")
    # A message that names no node names the op whose kernel refused, not a word of a sentence.
    two = _model("two", [helper.make_node("If", [], [], name="if"), node], {}, {})
    assert verify.refused_node(two, "onnxruntime::DivBase layout_ == 0 was false. If you need support ...") == "Div 'div'"
    assert verify.refused_node(two, "something else") == "the model"


def test_few_elements_meet_every_constant_at_every_element(tmp_path):
    # A 3-element clip to [-2.5, 2.5]: one threshold draw per value (the ends, each bound and
    # a step either side, 0), each element taking every value once over the draws.
    assert verify_inputs.thresholds(clip_constant_bounds()) == [-2.5, 2.5]
    tiny = clip_constant_bounds()
    tiny.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    tiny.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 1
    turns = verify_inputs.threshold_turns(tiny, tmp_path / "m.onnx")
    assert turns == 9
    drawn = np.stack([verify_inputs.draw(tiny, tmp_path / "m.onnx", seed=k, style=verify_inputs.THRESHOLDS, turn=k).arrays[0].ravel() for k in range(turns)])
    wanted = {np.float32(v) for v in (-5.0, 5.0, 0.0, *(b * f for b in (-2.5, 2.5) for f in (0.999, 1.0, 1.001)))}
    for element in drawn.T:
        assert set(element.tolist()) == {float(v) for v in wanted}, element
    # Inputs too large for one draw per value, and models that compare with no constant, get none.
    large = clip_constant_bounds()
    large.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 9
    assert verify_inputs.threshold_turns(large, tmp_path / "m.onnx") == 0
    assert verify_inputs.threshold_turns(_argmax(0), tmp_path / "m.onnx") == 0


def test_integer_divisors_onnxruntime_refuses_are_drawn_positive(tmp_path):
    # onnxruntime refuses an integer division by zero; every draw has zeros, so each falls
    # back to integers in [1, 5) for the whole set rather than failing.
    node = helper.make_node("Div", ["a", "b"], ["y"], name="div")
    model = _model("div", [node], {"a": (TensorProto.INT32, [16]), "b": (TensorProto.INT32, [16])}, {"y": (TensorProto.INT32, [16])})
    onnx.save(model, tmp_path / "div.onnx")
    assert run_cli("import", tmp_path / "div.onnx", "-o", tmp_path / "div.mlir").returncode == 0
    assert run_cli("compile", tmp_path / "div.mlir", "-o", tmp_path / "div.vmfb").returncode == 0
    result = run_cli("verify", tmp_path / "div.vmfb", "--onnx", tmp_path / "div.onnx")
    assert result.returncode == 0, result
    assert result.stdout.count("(integers in [1, 5): onnxruntime refused the others)") == 3


def test_float16_outputs_are_held_to_a_few_of_their_ulps():
    want = np.linspace(-3, 3, 64).astype(np.float16)
    one_ulp = np.nextafter(want, np.float16(np.inf))
    assert verify.compare(0, "y", one_ulp, want, None, None).passed  # 1e-4 would fail every element
    assert not verify.compare(0, "y", (want * np.float16(1.02)).astype(np.float16), want, None, None).passed
    assert not verify.compare(0, "y", one_ulp, want, 1e-4, 1e-6).passed  # explicit tolerances are kept


def test_the_baseline_decides_whose_difference_it_is():
    want = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    iree = np.array([1.0, 2.0, np.nan, 4.0], np.float32)  # IREE's own module is wrong at [2]
    for module, verdict, apart in ((iree, verify.IREE_DIFFERS, 0), (iree + np.float32([0, 1, 0, 0]), verify.IREE_DIFFERS, 1)):
        first = verify.compare(0, "y", module, want, None, None)
        judged = verify._judge(first, module, want, iree, None, None)
        assert not judged.passed and judged.verdict == verdict and judged.baseline_mismatched == apart
        assert "IREE's own module (the baseline) differs from the reference here too" in judged.render()
    # Where IREE's own module is right, a difference is the kernel's.
    wrong = want + np.float32([0, 1, 0, 0])
    judged = verify._judge(verify.compare(0, "y", wrong, want, None, None), wrong, want, want, None, None)
    assert judged.verdict == verify.MISMATCH and "IREE" not in judged.render()


def test_every_mutant_of_a_generated_kernel_that_differs_on_the_stored_data_is_caught(tmp_path, node_data):
    # benchmarks/verify_mutants.py on one node test: each generated kernel of Shrink, with one
    # edit at a time (a bound, a comparison, a load, a bias, a constant), against default verify.
    bench = benchmark_module("verify_mutants")
    record = bench.check_test(node_data / "test_shrink_hard", tmp_path, 8)
    assert record["status"] == "ok" and record["groups"], record
    assert all(g["status"] == "ok" for g in record["groups"]), record  # the right kernels pass
    found = bench.report([record])
    counts = found["counts"]
    assert counts["mutants"] >= 10 and counts["differ on stored data"] >= 5, counts
    assert counts["caught of those that differ"] == counts["differ on stored data"], found["missed"]
    assert counts["caught"] >= 0.9 * counts["mutants"], found["missed"]


KERNEL = """#include <stdint.h>
static inline double pyree_exp(double x) {
  double term = 1.0;
  double sum = 1.0;
  for (int n = 1; n < 18; ++n) { term *= x / n; sum += term; }
  return sum;
}

void k(const float* restrict in0, float* restrict out0, int64_t* restrict tmp0, int64_t* restrict tmp1) {
  for (int64_t i0 = 0; i0 < 5; ++i0) {
    tmp0[i0] = (int64_t)0;
  }
  for (int64_t e = 0; e < 5; ++e) tmp1[e] = tmp0[e];
  for (int64_t i0 = 0; i0 < 5; ++i0) {
    const float a1 = in0[i0];
    const float v2 = (float)(0x0.0p+0f);
    const int8_t v3 = (int8_t)(!((a1) <= (v2)));
    const float v4 = (float)(0x0.0p+0f);
    const float v5 = (float)(v3 ? a1 : v4);
    const float v6 = (float)(pyree_exp(v5));
    out0[i0] = (float)v6;
  }
}

// The plugin's import
"""


def _bench() -> object:
    bench = benchmark_module("verify_mutants")
    return bench


def test_the_mutation_benchmark_reads_dead_edits_and_no_edits_from_the_kernel():
    bench = _bench()
    edited = {what: text for _, what, text in bench.mutants(KERNEL)}  # type: ignore[attr-defined]
    # A bound of the loop that fills tmp0, which only tmp1 reads and no output: dead. The same
    # bound of the loop that computes the output is not.
    bound = "for (int64_t i0 = 0; i0 < 5; ++i0) { -> for (int64_t i0 = 0; i0 < 4; ++i0) {"
    assert bench.dead_edit(KERNEL, edited[f"line 10: {bound}"]) == "dead: it changes only tmp0, which no output reads"  # type: ignore[attr-defined]
    assert bench.dead_edit(KERNEL, edited[f"line 14: {bound}"]) is None  # type: ignore[attr-defined]
    # The helper's series reaches the output through its return and the call: not dead.
    series = "line 5: for (int n = 1; n < 18; ++n) { term *= x / n; sum += term; } -> for (int n = 1; n < 17; ++n) { term *= x / n; sum += term; }"
    assert bench.dead_edit(KERNEL, edited[series]) is None  # type: ignore[attr-defined]
    # relu's comparison selects its operand or a copy of the zero it compares with: no edit.
    assert not any("v3 = " in what for what in edited)


def test_a_mutant_compiled_to_the_right_kernel_s_code_is_equivalent(tmp_path):
    # An edit in a branch the built knobs never take (a lane loop wider than the row) leaves the
    # plugin's loaded bytes as they were; an edit in code that runs does not.
    import pyree_build as pb

    bench = _bench()
    base = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    probe = "float pyree_probe(float x) {{ if (16 > 1 && 5 >= 16) {{ return x * {}f; }} return x + {}f; }}\n"
    built = {}
    for name, (dead, live) in {"right": ("2.0", "1.0"), "unrun": ("3.0", "1.0"), "run": ("2.0", "2.0")}.items():
        (tmp_path / f"{name}.c").write_text(base + probe.format(dead, live))
        built[name] = bench._loaded_bytes(pb.plugin(tmp_path / f"{name}.c", tmp_path / f"{name}.so", cc="zig"))  # type: ignore[attr-defined]
    assert ".text" in built["right"] and built["unrun"] == built["right"] and built["run"] != built["right"]
