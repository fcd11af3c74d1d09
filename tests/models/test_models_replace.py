"""Issue 21 items 2, 3 and 6: `ops` lists a real model's op groups, `replace` generates the spec
and a correct C import for any group it accepts, and the replaced model gives onnxruntime's
numbers, on models the generator was not written for (built here with the onnx helper API).

Everything is real: iree-import-onnx, iree-compile with the generated spec, zig cc for the
plugin, iree-run-module and onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_clean_error, run_cli

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from support import onnx_models  # noqa: E402

MODELS = ("mlp", "gemm_trans_b", "matmul_add_relu", "softmax", "layer_norm", "elementwise_broadcast", "two_groups")


def _imported(tmp_path: Path, name: str) -> tuple[Path, Path]:
    model = tmp_path / f"{name}.onnx"
    onnx_models.save(getattr(onnx_models, name)(), model)
    mlir = tmp_path / f"{name}.mlir"
    result = run_cli("import", model, "-o", mlir)
    assert result.returncode == 0, result
    return model, mlir


def _groups(mlir: Path) -> list[dict]:
    result = run_cli("ops", mlir, "--json")
    assert result.returncode == 0, result
    return json.loads(result.stdout)


def _replace_build_verify(tmp_path: Path, model: Path, mlir: Path, groups: list[int], names: list[str]) -> tuple[Path, list[Path]]:
    out = tmp_path / ("kernels_" + "_".join(names))
    result = run_cli("replace", mlir, "--ops", ",".join(map(str, groups)), "--import", ",".join(names), "-o", out, "--onnx", model)
    assert result.returncode == 0, result
    plugins = []
    for name in names:
        plugin = out / f"{name}.so"
        assert run_cli("plugin", "--kind", "system", out / f"{name}.c", "-o", plugin).returncode == 0
        plugins.append(plugin)
    module = out / "replaced.vmfb"
    expects = [a for n in names for a in ("--expect-import", n)]
    result = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", *expects)
    assert result.returncode == 0, result
    return module, plugins


@pytest.mark.parametrize("name", MODELS)
def test_every_group_replace_accepts_verifies(tmp_path, name):
    # The property: for every group `ops` marks replaceable, the replaced model gives
    # onnxruntime's numbers, with the import called (--expect-import) and only then.
    model, mlir = _imported(tmp_path, name)
    groups = _groups(mlir)
    assert groups and all({"index", "root", "ops", "operands", "results", "source"} <= set(g) for g in groups)
    accepted = [g for g in groups if g["replaceable"]]
    assert accepted, groups
    for g in accepted:
        label = f"{name}_g{g['index']}"
        module, plugins = _replace_build_verify(tmp_path, model, mlir, [g["index"]], [label])
        verified = run_cli("verify", module, "--onnx", model, *[a for p in plugins for a in ("--plugin", p)])
        assert verified.returncode == 0, verified
        # Without the plugin the module cannot run: the import really is called.
        assert run_cli("verify", module, "--onnx", model).returncode != 0


def test_ops_names_the_onnx_nodes_and_the_fused_ops(tmp_path):
    _, mlir = _imported(tmp_path, "mlp")
    listed = run_cli("ops", mlir)
    assert listed.returncode == 0, listed
    assert "#1  linalg.generic" in listed.stdout and "#2  linalg.matmul" in listed.stdout
    groups = _groups(mlir)
    assert groups[0]["source"] == ["fc1", "bias1", "relu1"]
    assert groups[0]["ops"][:2] == ["linalg.fill", "linalg.matmul"]
    assert [o["shape"] for o in groups[0]["operands"]] == [[4, 16], [16, 32], [32]]
    assert groups[2]["source"] == ["softmax"] and "math.exp" in " ".join(groups[2]["ops"])


def test_two_groups_in_one_spec(tmp_path):
    model, mlir = _imported(tmp_path, "mlp")
    module, plugins = _replace_build_verify(tmp_path, model, mlir, [1, 3], ["fc1_relu", "my_softmax"])
    verified = run_cli("verify", module, "--onnx", model, *[a for p in plugins for a in ("--plugin", p)])
    assert verified.returncode == 0, verified


def test_a_wrong_kernel_fails_verify(tmp_path):
    model, mlir = _imported(tmp_path, "matmul_add_relu")
    out = tmp_path / "k"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "k", "-o", out, "--onnx", model).returncode == 0
    source = out / "k.c"
    text = source.read_text()
    # The kernel's last statement doubles every element of the result (8 x 6: writing past it
    # is another error, one the run reports).
    marker = "\n}\n\n// The plugin's import"
    source.write_text(text.replace(marker, "\n  for (int64_t e = 0; e < 8 * 6; ++e) out0[e] *= 2.0f;" + marker, 1))
    assert run_cli("plugin", "--kind", "system", source, "-o", out / "k.so").returncode == 0
    assert run_cli("compile", mlir, "-o", out / "m.vmfb", "--transform-spec", out / "spec.mlir", "--expect-import", "k").returncode == 0
    failed = run_cli("verify", out / "m.vmfb", "--onnx", model, "--plugin", out / "k.so")
    assert failed.returncode == 1 and "differ from onnxruntime" in failed.stderr, failed


def test_edited_files_are_never_overwritten(tmp_path):
    model, mlir = _imported(tmp_path, "softmax")
    out = tmp_path / "k"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "sm", "-o", out).returncode == 0
    assert run_cli("replace", mlir, "--ops", "1", "--import", "sm", "-o", out).returncode == 0  # unchanged: fine
    edited = out / "sm.c"
    edited.write_text(edited.read_text() + "// mine\n")
    refused = run_cli("replace", mlir, "--ops", "1", "--import", "sm", "-o", out)
    assert_clean_error(refused, "sm.c", "--force")
    assert edited.read_text().endswith("// mine\n")
    # Another import into the same directory keeps the first one's files.
    assert run_cli("replace", mlir, "--ops", "1", "--import", "other", "-o", out).returncode == 0
    assert edited.exists() and (out / "other.c").exists()
    assert run_cli("replace", mlir, "--ops", "1", "--import", "sm", "-o", out, "--force").returncode == 0
    assert not edited.read_text().endswith("// mine\n")


def test_bad_requests_are_refused_by_name(tmp_path):
    _, mlir = _imported(tmp_path, "softmax")
    assert_clean_error(run_cli("replace", mlir, "--ops", "7", "--import", "k", "-o", tmp_path / "a"), "no op group 7", "pyree-build ops")
    assert_clean_error(run_cli("replace", mlir, "--ops", "1", "--import", "9k", "-o", tmp_path / "b"), "not a C identifier")
    assert_clean_error(run_cli("replace", mlir, "--ops", "1,1", "--import", "a,b", "-o", tmp_path / "c"), "once")
    assert_clean_error(run_cli("replace", mlir, "--ops", "one", "--import", "a", "-o", tmp_path / "d"), "op group numbers")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_op_with_no_c_form_is_refused_with_its_name(tmp_path):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Sin", ["x"], ["y"], name="sine")]
    graph = helper.make_graph(
        nodes, "sine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "sine.onnx"
    onnx_models.save(model, path)
    mlir = tmp_path / "sine.mlir"
    assert run_cli("import", path, "-o", mlir).returncode == 0
    (group,) = _groups(mlir)
    assert not group["replaceable"] and "math.sin" in group["reason"]
    assert_clean_error(run_cli("replace", mlir, "--ops", "1", "--import", "k", "-o", tmp_path / "k"), "math.sin")
    assert not (tmp_path / "k").exists()


def test_standalone_and_embedded_builds_of_the_generated_c(tmp_path):
    # The same C, with its own freestanding math (exp here), links for every arch as a
    # standalone plugin and as embedded objects; the embedded module runs with no plugin.
    model, mlir = _imported(tmp_path, "softmax")
    out = tmp_path / "k"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "sm", "-o", out, "--kind", "embedded").returncode == 0
    standalone = run_cli("plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", "--arch", "riscv64", out / "sm.c", "-o", out / "sm.sos")
    assert standalone.returncode == 0, standalone
    objects = run_cli("objects", out / "sm.c", "--arch", "x86_64", "--arch", "aarch64", "-o", out)
    assert objects.returncode == 0, objects
    module = out / "m.vmfb"
    compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--object-search-path", out)
    assert compiled.returncode == 0, compiled
    for name in ("sm_x86_64.o", "sm_aarch64.o"):
        (out / name).unlink()  # hermetic: the objects are inside the module
    assert run_cli("verify", module, "--onnx", model).returncode == 0


def test_static_spec_matches_only_its_shapes_and_dynamic_any(tmp_path):
    # A spec generated from mlp's fc1+bias+relu (4x16 @ 16x32) in its static form leaves a
    # model of other sizes alone (the import is not called); with --dynamic it replaces the
    # same ops there too (8x12 @ 12x6), and the C, reading every size from its arguments,
    # gives onnxruntime's numbers in both models.
    mlp_onnx, mlp_mlir = _imported(tmp_path, "mlp")
    other_onnx, other_mlir = _imported(tmp_path, "matmul_add_relu")
    for flag, name in (([], "fixed"), (["--dynamic"], "general")):
        out = tmp_path / name
        assert run_cli("replace", mlp_mlir, "--ops", "1", "--import", name, "-o", out, *flag).returncode == 0
        assert run_cli("plugin", "--kind", "system", out / f"{name}.c", "-o", out / f"{name}.so").returncode == 0
        for model, mlir in ((mlp_onnx, mlp_mlir), (other_onnx, other_mlir)):
            module = out / f"{mlir.stem}.vmfb"
            compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", name)
            if name == "fixed" and mlir == other_mlir:
                assert_clean_error(compiled, f"does not call import '{name}'")
                continue
            assert compiled.returncode == 0, compiled
            assert run_cli("verify", module, "--onnx", model, "--plugin", out / f"{name}.so").returncode == 0
    assert "tensor<?x?xf32>" in (tmp_path / "general" / "spec.mlir").read_text()


def test_dynamic_refuses_a_reshape_that_fixes_sizes(tmp_path):
    _, mlir = _imported(tmp_path, "softmax")
    refused = run_cli("replace", mlir, "--ops", "1", "--import", "k", "-o", tmp_path / "k", "--dynamic")
    assert_clean_error(refused, "tensor.expand_shape", "without --dynamic")
    assert not (tmp_path / "k").exists()


TWO_RESULTS = """
func.func @two(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %e = tensor.empty() : tensor<4xf32>
  %r:2 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                         iterator_types = ["parallel"]} ins(%x : tensor<4xf32>) outs(%e, %e : tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%in: f32, %o1: f32, %o2: f32):
    %a = arith.addf %in, %in : f32
    %m = arith.mulf %in, %in : f32
    linalg.yield %a, %m : f32, f32
  } -> (tensor<4xf32>, tensor<4xf32>)
  return %r#0, %r#1 : tensor<4xf32>, tensor<4xf32>
}
"""


def test_plain_mlir_groups_name_their_line_and_two_results_are_refused(tmp_path):
    program = tmp_path / "two.mlir"
    program.write_text(TWO_RESULTS)
    (group,) = _groups(program)
    assert group["source"] == ["linalg.generic (two.mlir:4)"], group  # the line of the op in the file
    assert not group["replaceable"] and "2 results used outside it" in group["reason"]
    refused = run_cli("replace", program, "--ops", "1", "--import", "k", "-o", tmp_path / "k")
    assert_clean_error(refused, "op group 1 (linalg.generic) cannot be replaced", "2 results")
    assert not (tmp_path / "k").exists()


def test_inputs_that_are_not_mlir_or_would_be_overwritten_are_refused(tmp_path):
    model, mlir = _imported(tmp_path, "softmax")
    for verb in (["ops", model], ["replace", model, "--ops", "1", "--import", "k", "-o", tmp_path / "k"]):
        assert_clean_error(run_cli(*verb), "expected an MLIR program", "pyree-build import")
    assert_clean_error(run_cli("replace", mlir, "--ops", "1", "--import", "a,b", "-o", tmp_path / "k"), "1 op group(s) and 2 import name(s)")
    # The program itself in the output directory, named as an output: never written over.
    inside = tmp_path / "inside"
    inside.mkdir()
    program = inside / "spec.mlir"
    program.write_bytes(mlir.read_bytes())
    assert_clean_error(run_cli("replace", program, "--ops", "1", "--import", "k", "-o", inside), "also an input")
    assert program.read_bytes() == mlir.read_bytes() and sorted(p.name for p in inside.iterdir()) == ["spec.mlir"]


def test_a_dynamic_batch_is_refused_without_dynamic_and_replaced_with_it(tmp_path):
    # A model with a dynamic batch: without --dynamic the C has no size for the result (it
    # printed `None` into the C), so ops says no and names --dynamic; with --dynamic the spec
    # writes the already-dynamic size as ? too (it wrote tensor<?x4xf32>{a, b}: "flow.dispatch
    # expected 1 operands"), compiles with the import called, and verifies.
    from onnx import TensorProto, helper

    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("x", "y", "z")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"], name="add")], "batch", info[:2], info[2:])
    model = tmp_path / "batch.onnx"
    onnx_models.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    mlir = tmp_path / "batch.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    (group,) = _groups(mlir)
    assert not group["replaceable"] and "only known at run time" in group["reason"] and "--dynamic" in group["reason"], group
    out = tmp_path / "k"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "k", "-o", out, "--dynamic").returncode == 0
    assert run_cli("plugin", "--kind", "system", out / "k.c", "-o", out / "k.so").returncode == 0
    compiled = run_cli("compile", mlir, "-o", out / "m.vmfb", "--transform-spec", out / "spec.mlir", "--expect-import", "k")
    assert compiled.returncode == 0, compiled
    # The rows are only known at run time, so the dispatch counts its workgroups from them (one
    # per 8 rows): 37 rows are 5 workgroups, the last one partial, on one core or on several.
    assert "workgroups(%rows: index)" in (out / "spec.mlir").read_text()
    for rows, device in ((3, "local-sync"), (5, "local-task"), (37, "local-sync"), (37, "local-task")):
        verified = run_cli(
            "verify", out / "m.vmfb", "--onnx", model, "--plugin", out / "k.so", "--input", f"{rows}x4xf32=1.5", "--input", f"{rows}x4xf32=-2",
            "--device", device,
        )  # fmt: skip
        assert verified.returncode == 0, verified


@pytest.mark.parametrize("form", ["static", "dynamic", "cuda"])
def test_a_replaced_groups_dispatch_reads_the_callers_buffers_with_no_copy(tmp_path, form):
    # The rewrite puts each kernel's dispatch in a function of its own; converted to streams
    # across that call, every input was first copied into a transient buffer (and that second
    # allocation per call made a 128 KB group 8x slower on local-sync). The spec inlines the
    # calls, so the program IREE schedules has the dispatches and no copy, in every form.
    _, mlir = _imported(tmp_path, "mlp")
    # Two groups where the form takes two (a general matcher of fc1 would also take fc2's matmul).
    names = ["fc1_relu"] if form == "dynamic" else ["fc1_relu", "fc2"]
    extra = {"static": [], "dynamic": ["--dynamic"], "cuda": ["--target", "cuda"]}[form]
    out = tmp_path / "kernels"
    ops = ",".join(str(k + 1) for k in range(len(names)))
    assert run_cli("replace", mlir, "--ops", ops, "--import", ",".join(names), "-o", out, *extra).returncode == 0
    target = ["--target", "cuda", "--sm", "80"] if form == "cuda" else []
    streams = tmp_path / "streams.mlir"
    compiled = run_cli("compile", mlir, "-o", streams, "--transform-spec", out / "spec.mlir", *target, "--", "--compile-to=stream")
    assert compiled.returncode == 0, compiled
    text = streams.read_text()
    assert all(f"stream.cmd.dispatch @{n}_executable" in text for n in names), text[-3000:]
    assert "stream.cmd.copy" not in text and "_call(" not in text, text[-3000:]
