"""pyree-build tune / pb.tune with real tools: a sweep over a -D parameter of a small kernel in
which one value computes a wrong result, one crashes, one hangs and one is slow; best.json; the
chosen variant built by `tune --apply`, by pb.tune.build_tuned and by CMake's TUNED."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import PLUGIN_SAMPLE, assert_clean_error, run_cli
from support.cmake_projects import build, cmake_run, write_project
from support.tune_kernels import CRASH, EXPECTED, HANG, INPUTS, QUICK, SLOW, WRONG, tune_args, two_kernel_model, write_kernel

import pyree_build as pb
from pyree_build.cli import cmake_dir
from pyree_build.core import toolchain
from pyree_build.core.files import parse_depfile


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_kernel(tmp_path_factory.mktemp("tune_kernel"))


def test_sweep_rejects_wrong_crashing_and_hanging_variants_and_never_picks_the_slow_one(kernel, system_module, tmp_path):
    out = tmp_path / "best.json"
    result = run_cli(*tune_args(kernel, system_module, out, f"1,2,{WRONG},{CRASH},{HANG},{SLOW}"))
    assert result.returncode == 0, result
    table = result.stdout
    assert "WRONG RESULT" in table and "CRASHED" in table and "HUNG" in table, table
    assert f"UNROLL={WRONG} WRONG RESULT" in " ".join(table.split()), table
    assert "killed by SIGSEGV" in table and "timed out after 3 s" in table, table
    best = json.loads(out.read_text())
    assert best["format"] == "pyree_build.tune.v1"
    assert best["winner"]["params"]["UNROLL"] in ("1", "2")
    assert best["flags"] == [f"-DUNROLL={best['winner']['params']['UNROLL']}"]
    status = {v["params"]["UNROLL"]: v for v in best["variants"]}
    assert (status[WRONG]["status"], status[CRASH]["status"], status[HANG]["status"]) == ("wrong result", "crashed", "hung")
    assert status[SLOW]["status"] == "ok" and status[SLOW]["median_ms"] > 5 * best["winner"]["median_ms"]
    # The table lists the chosen variant first (the first declared that none is clearly faster
    # than, so under noise it need not have the lowest median), then the other measured ones by
    # median, then the rejected; each measured one with min - max.
    measured = [v for v in best["variants"] if v["status"] == "ok"]
    assert measured[0]["params"] == best["winner"]["params"], best["variants"]
    assert [v["median_ms"] for v in measured[1:]] == sorted(v["median_ms"] for v in measured[1:])
    assert [v["status"] for v in best["variants"]][: len(measured)] == ["ok"] * len(measured)
    assert all(v["min_ms"] <= v["median_ms"] <= v["max_ms"] and len(v["samples_ms"]) >= 1 for v in measured)
    assert table.splitlines()[1].split()[:2] == ["1", f"UNROLL={best['winner']['params']['UNROLL']}"], table
    # The chosen variant, built again by --apply: byte for byte the variant the sweep measured.
    plugin = tmp_path / "tuned.so"
    applied = run_cli("tune", kernel, "--apply", out, "-o", plugin)
    assert applied.returncode == 0, applied
    variant = tmp_path / "best.variants" / f"UNROLL={best['winner']['params']['UNROLL']}" / "kernel.so"
    assert plugin.read_bytes() == variant.read_bytes()
    ran = run_cli("run", system_module, "--function", "mixed_invocation", "--input", INPUTS[0], "--input", INPUTS[1], "--plugin", plugin,
                  "--expect-close", EXPECTED)  # fmt: skip
    assert ran.returncode == 0, ran


def test_python_equals_cli(kernel, system_module, tmp_path):
    values = f"1,{WRONG},{SLOW}"
    cli_out, py_out = tmp_path / "cli" / "best.json", tmp_path / "py" / "best.json"
    result = run_cli(*tune_args(kernel, system_module, cli_out, values))
    assert result.returncode == 0, result
    # The Python API in a process of its own, as a user's script runs it (not in this test
    # process, whose earlier tests may have left state a user's process never has).
    script = (
        "import json, sys, pyree_build as pb\n"
        "t = pb.tune(sys.argv[1], sys.argv[2], params={'UNROLL': sys.argv[3].split(',')}, module=sys.argv[4], function='mixed_invocation',\n"
        f"           inputs={INPUTS!r}, expect_output=[{EXPECTED!r}], timeout=3, budget=1.5, repetitions=2)\n"
        "print(json.dumps(t.best.params if t.best else None))\n"
        "print(t.render())\n"
    )
    python = subprocess.run([sys.executable, "-c", script, kernel, py_out, values, system_module], capture_output=True, text=True)
    assert python.returncode == 0, python.stderr
    best_params, rendered = python.stdout.split("\n", 1)
    cli_best, py_best = json.loads(cli_out.read_text()), json.loads(py_out.read_text())
    assert json.loads(best_params) == py_best["winner"]["params"] == cli_best["winner"]["params"] == {"UNROLL": "1"}
    assert {v["params"]["UNROLL"]: v["status"] for v in cli_best["variants"]} == {v["params"]["UNROLL"]: v["status"] for v in py_best["variants"]}
    assert cli_best["flags"] == py_best["flags"] and cli_best["build"] == py_best["build"]
    for value in values.split(","):  # each sweep kept every variant's plugin, and they compute alike
        name = f"UNROLL={value}/kernel.so"
        cli_plugin, py_plugin = cli_out.parent / "best.variants" / name, py_out.parent / "best.variants" / name
        assert cli_plugin.read_bytes()[:4] == py_plugin.read_bytes()[:4] == b"\x7fELF", name
        runs = [
            run_cli("run", system_module, "--function", "mixed_invocation", *[f"--input={i}" for i in INPUTS], "--plugin", p) for p in (cli_plugin, py_plugin)
        ]
        assert runs[0].returncode == runs[1].returncode == 0 and runs[0].stdout == runs[1].stdout, name
    assert pb.tune.tuned_defines(py_out) == ["UNROLL=1"]
    built = pb.tune.build_tuned([kernel], tmp_path / "k.so", tuned=py_out, depfile=tmp_path / "k.d")
    # The tune's result is a dependency of the plugin it chose the defines of, in the same depfile.
    listed = parse_depfile(tmp_path / "k.d")
    assert str(py_out.resolve()) in listed and str(kernel.resolve()) in listed, listed
    ran = run_cli("run", system_module, "--function", "mixed_invocation", *[f"--input={i}" for i in INPUTS], "--plugin", built, "--expect-close", EXPECTED)
    assert ran.returncode == 0, ran
    assert "UNROLL=1" in rendered and f"UNROLL={WRONG}" in rendered


def test_a_sweep_where_every_variant_is_wrong_fails_and_writes_nothing(kernel, system_module, tmp_path):
    out = tmp_path / "best.json"
    result = run_cli(*tune_args(kernel, system_module, out, WRONG))
    assert_clean_error(result, "no variant of kernel.c both computed the right result", "WRONG RESULT")
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--param", "UNROLL"], ["is not NAME=V1,V2"]),
        (["--param", "9X=1"], ["is not a C macro name"]),
        (["--param", "UNROLL=1", "--expect-output", EXPECTED, "--reference", "r.vmfb"], ["exactly one reference"]),
        (["--param", "UNROLL=1"], ["exactly one reference"]),
        ([], ["no --param given, and the source declares no knob", "// pyree-tune: TILE=1,2,4,8"]),
    ],
)
def test_mistakes_are_named(kernel, system_module, tmp_path, args, fragments):
    result = run_cli("tune", kernel, "--module", system_module, "--function", "mixed_invocation", *args, "-o", tmp_path / "b.json")
    assert_clean_error(result, *fragments)


def test_without_param_the_knobs_the_source_declares_are_swept(kernel, system_module, tmp_path):
    # What `replace` writes above each schedule macro: tune needs no --param to sweep it.
    declared = tmp_path / "declared.c"
    declared.write_text(f"// pyree-tune: UNROLL=1,2,{WRONG}  (elements a step)\n" + kernel.read_text(), encoding="utf-8")
    out = tmp_path / "best.json"
    args = [a for a in tune_args(declared, system_module, out, "1") if not str(a).startswith(("--param", "UNROLL="))]
    result = run_cli(*args)
    assert result.returncode == 0, result
    swept = {v["params"]["UNROLL"]: v["status"] for v in json.loads(out.read_text())["variants"]}
    assert set(swept) == {"1", "2", WRONG} and swept[WRONG] != "ok", swept
    # --param still wins over the declaration.
    chosen = run_cli(*tune_args(declared, system_module, tmp_path / "only.json", "2"))
    assert chosen.returncode == 0, chosen
    assert [v["params"] for v in json.loads((tmp_path / "only.json").read_text())["variants"]] == [{"UNROLL": "2"}]


def test_a_knob_declared_after_is_swept_alone_at_the_winner_of_the_others(kernel, system_module, tmp_path):
    # Stage 1 sweeps UNROLL (SLOW loses); then SHIFT, declared `after`, alone at UNROLL's winner:
    # 2 + 2 variants, not 2 x 2, and SHIFT=1 (a wrong result) never wins.
    shifted = kernel.read_text().replace("  return 0;", "#if SHIFT == 1\n  a->out[a->out_offset] += 1.0f;\n#endif\n  return 0;", 1)
    declared = tmp_path / "staged.c"
    declared.write_text(f"// pyree-tune: UNROLL=2,{SLOW}\n// pyree-tune after: SHIFT=0,1\n#ifndef SHIFT\n#define SHIFT 0\n#endif\n" + shifted, encoding="utf-8")
    out = tmp_path / "best.json"
    args = [a for a in tune_args(declared, system_module, out, "1") if not str(a).startswith(("--param", "UNROLL="))]
    result = run_cli(*args)
    assert result.returncode == 0, result
    recorded = json.loads(out.read_text())
    ran = {tuple(sorted(v["params"].items())): v["status"] for v in recorded["variants"]}
    assert set(ran) == {(("UNROLL", "2"),), (("UNROLL", SLOW),), (("SHIFT", "0"), ("UNROLL", "2")), (("SHIFT", "1"), ("UNROLL", "2"))}, ran
    assert ran[(("SHIFT", "1"), ("UNROLL", "2"))] != "ok" and recorded["winner"]["params"]["UNROLL"] == "2", recorded["winner"]


def test_among_variants_noise_cannot_tell_apart_the_kernel_as_written_wins(kernel, system_module, tmp_path):
    """Issue 47: a generated kernel picks some knobs per CPU (`#if defined(__AVX512F__)`), so the
    first value a declaration lists need not be the one it is built with. The variant whose
    plugin is byte for byte the kernel as written goes first in the order ties are decided by,
    so a tune on a noisy machine keeps the kernel as written, not the first value listed."""
    from pyree_build.tuning.choice import choose
    from pyree_build.tuning.plan import Variant

    written = tmp_path / "as_written.c"
    written.write_text(kernel.read_text(encoding="utf-8").replace("#define UNROLL 1\n", "#define UNROLL 2\n", 1), encoding="utf-8")
    out = tmp_path / "best.json"
    result = run_cli(*tune_args(written, system_module, out, "1,2,4"))
    assert result.returncode == 0, result
    order = {v["params"]["UNROLL"]: v["order"] for v in json.loads(out.read_text())["variants"]}
    assert order == {"2": -1, "1": 0, "4": 2}, order
    tied = [Variant({"UNROLL": value}, status="ok", samples_ms=[1.0, 1.1, 0.9, 1.0, 1.05], order=o) for value, o in order.items()]
    assert choose(tied)[0].params == {"UNROLL": "2"}
    # A knob with no default: the sources do not build as written; the declared order alone.
    no_default = tmp_path / "no_default.c"
    no_default.write_text(kernel.read_text(encoding="utf-8").replace("#define UNROLL 1\n", "#error UNROLL has no default\n", 1), encoding="utf-8")
    result = run_cli(*tune_args(no_default, system_module, out, "2,1"))
    assert result.returncode == 0, result
    assert {v["params"]["UNROLL"]: v["order"] for v in json.loads(out.read_text())["variants"]} == {"2": 0, "1": 1}


def test_a_winner_other_than_the_kernel_as_written_is_timed_again_in_turn_with_it(kernel, system_module, tmp_path):
    """The variants' own rounds run one variant after another, so drift between them can make
    one look faster; a winner that is not the kernel as written is kept only after rounds in turn
    with it. Here the kernel as written is the slow one (a busy loop each call): UNROLL=1 stays
    the winner, both its rounds and the kernel as written's are the ones taken in turn."""
    written = tmp_path / "slow_as_written.c"
    written.write_text(kernel.read_text(encoding="utf-8").replace("#define UNROLL 1\n", f"#define UNROLL {SLOW}\n", 1), encoding="utf-8")
    out = tmp_path / "best.json"
    result = run_cli(*tune_args(written, system_module, out, f"1,{SLOW}"))
    assert result.returncode == 0, result
    assert "alternated with the kernel as written" in result.stdout, result.stdout
    best = json.loads(out.read_text())
    assert best["winner"]["params"] == {"UNROLL": "1"} and best["winner"]["alternated"], best["winner"]
    by_value = {v["params"]["UNROLL"]: v for v in best["variants"]}
    assert by_value[SLOW]["order"] == -1 and by_value[SLOW]["alternated"], by_value[SLOW]
    assert len(by_value["1"]["samples_ms"]) == len(by_value[SLOW]["samples_ms"]) >= 3
    assert max(by_value["1"]["samples_ms"]) < min(by_value[SLOW]["samples_ms"])


def test_apply_refuses_a_file_no_tune_wrote(kernel, tmp_path):
    bogus = tmp_path / "best.json"
    bogus.write_text('{"winner": 1}')
    assert_clean_error(run_cli("tune", kernel, "--apply", bogus, "-o", tmp_path / "k.so"), "not a tune result")


def test_ray_without_ray_says_how_to_install_it(kernel, system_module, tmp_path):
    code = "import sys; sys.modules['ray'] = None; from pyree_build.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [str(a) for a in tune_args(kernel, system_module, tmp_path / "b.json", "1")] + ["--ray", "auto"]
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert 'pip install "pyree_build[ray]"' in proc.stderr, proc.stderr


@pytest.mark.slow
def test_cmake_tuned_builds_the_chosen_variant(kernel, tmp_path):
    body = (
        "pyree_iree_module(NAME m SRC program.mlir TARGET llvm-cpu)\n"
        f'pyree_tune(NAME k_tune SYSTEM SRCS kernel.c PARAMS "UNROLL=1,{WRONG},{SLOW}" MODULE m FUNCTION mixed_invocation\n'
        f"           INPUTS {' '.join(INPUTS)} EXPECT_OUTPUT {EXPECTED} BUDGET 1 TIMEOUT 3)\n"
        "pyree_cpu_plugin(NAME k SYSTEM SRCS kernel.c TUNED k_tune)\n"
    )
    src = tmp_path / "src"
    write_project(src, "tuned", body, {"kernel.c": kernel, "program.mlir": PLUGIN_SAMPLE / "example.mlir"})
    configured = cmake_run(
        "-G", "Ninja", "-S", src, "-B", tmp_path / "build", f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}",
        f"-Dpyree_build_DIR={cmake_dir()}", f"-DPYREE_BUILD_PYTHON={sys.executable}",
    )  # fmt: skip
    assert configured.returncode == 0, configured
    build(tmp_path / "build")
    best = json.loads((tmp_path / "build" / "k_tune.json").read_text())
    assert best["winner"]["params"] == {"UNROLL": "1"}
    variant = tmp_path / "build" / "k_tune.variants" / "UNROLL=1" / "kernel.so"
    assert (tmp_path / "build" / "k.so").read_bytes() == variant.read_bytes()


def test_the_mlp_samples_tiles_all_reproduce_the_reference_module(tmp_path):
    """--reference: the program compiled without the spec (IREE's own code) gives the numbers."""
    mlp = PLUGIN_SAMPLE.parent / "mlp_plugin"
    with_plugin, reference = tmp_path / "with.vmfb", tmp_path / "ref.vmfb"
    compiled = [
        run_cli("compile", mlp / "mlp.mlir", "-o", with_plugin, "--transform-spec", mlp / "matmul_relu_spec.mlir", "--expect-import", "fused_matmul_relu"),
        run_cli("compile", mlp / "mlp.mlir", "-o", reference),
    ]
    assert all(r.returncode == 0 for r in compiled), compiled
    inputs = ["4x3xf32=[[1,2,3],[-1,-2,-3],[0.5,0.5,0.5],[2,0,-2]]", "3x5xf32=1", "5xf32=[0 1 2 3 4]"]
    tuned = pb.tune(mlp / "matmul_relu_plugin.c", tmp_path / "best.json", params=["MATMUL_RELU_TILE=1,4,5"], module=with_plugin, function="mlp",
                    inputs=inputs, reference=reference, budget=1, repetitions=2)  # fmt: skip
    assert [v.status for v in tuned.variants] == ["ok"] * 3, tuned.render()


def test_onnx_without_inputs_draws_them_as_verify_does(kernel, system_module, tmp_path):
    # Issue 33: `tune --onnx` with no --input draws verify's wide inputs (saved beside the
    # variants) and takes onnxruntime's outputs on them as the results to reproduce.
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Mul", ["a", "b"], ["p"], name="mul"), helper.make_node("Add", ["p", "b"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes,
        "mixed_invocation",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "mul_add.onnx")
    out = tmp_path / "best.json"
    result = run_cli("tune", kernel, "--param", f"UNROLL=1,{WRONG}", "--module", system_module, "--function", "mixed_invocation",
                     "--onnx", tmp_path / "mul_add.onnx", *QUICK, "-o", out)  # fmt: skip
    assert result.returncode == 0, result
    best = json.loads(out.read_text())
    assert best["winner"]["params"] == {"UNROLL": "1"}
    drawn = sorted((tmp_path / "best.variants" / "inputs").glob("input_*.npy"))
    assert [p.name for p in drawn] == ["input_0.npy", "input_1.npy"]
    assert np.abs(np.load(drawn[0])).max() > 1.0  # the wide draw, not floats in [-1, 1]


def test_a_tune_result_is_kept_while_its_content_is_the_same(system_module, tmp_path):
    """A build re-runs `tune` when a source's time changes (`touch`): the sweep is not run again
    while the sources, module and settings are the same bytes; an edit tunes again."""
    kernel = write_kernel(tmp_path)
    out = tmp_path / "best.json"
    args = tune_args(kernel, system_module, out, "1,2")
    first = run_cli(*args)
    assert first.returncode == 0, first
    tuned = out.read_bytes()
    os.utime(kernel, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    # Up to date, it still writes the depfile it is asked for: a tune stopped between its result and
    # its depfile is run again by Ninja, and the run that finds the result must list the inputs.
    depfile = tmp_path / "best.d"
    again = run_cli(*args, "--depfile", depfile)
    assert again.returncode == 0 and "is up to date" in again.stdout and "not tuned again" in again.stdout, again
    assert out.read_bytes() == tuned
    assert {str(kernel.resolve()), str(system_module.resolve())} <= set(parse_depfile(depfile)), depfile.read_text()
    kernel.write_text(kernel.read_text(encoding="utf-8") + "\n/* edited */\n", encoding="utf-8")
    edited = run_cli(*args)
    assert edited.returncode == 0 and "is up to date" not in edited.stdout, edited
    assert json.loads(out.read_text())["key"] != json.loads(tuned)["key"]
    other = run_cli(*tune_args(kernel, system_module, out, "1,2,4"))
    assert other.returncode == 0 and "is up to date" not in other.stdout, other


def test_a_kernel_of_several_is_tuned_inside_the_whole_module_with_the_others_loaded(tmp_path):
    """Issue 47: a model's kernels replaced together make one module that calls every import,
    so one kernel is tuned in it with the others' plugins loaded (--plugin; Python: plugins=).
    Without them every variant is refused and the error says what to load; with them the
    winner, applied, verifies with the others against onnxruntime; the result is keyed by the
    other plugins' bytes too."""
    pytest.importorskip("onnx", reason='onnx is not installed (pip install "pyree_build[onnx]")')
    pytest.importorskip("onnxruntime", reason='onnxruntime is not installed (pip install "pyree_build[onnx]")')
    two = two_kernel_model(tmp_path)
    out = tmp_path / "fc1.json"
    alone = run_cli(*two.tune_args(out))
    assert_clean_error(alone, "no plugin resolves import 'sm', which the module calls", "load the plugins that do with --plugin PATH")
    assert not out.exists()

    tuned = run_cli(*two.tune_args(out), "--plugin", two.sm_plugin)
    assert tuned.returncode == 0, tuned
    assert [v["status"] for v in json.loads(out.read_text())["variants"]] == ["ok", "ok"], out.read_text()
    applied = run_cli("tune", two.fc1, "--apply", out, "-o", tmp_path / "fc1.so")
    verified = run_cli("verify", two.module, "--onnx", two.model, "--plugin", two.sm_plugin, "--plugin", tmp_path / "fc1.so")
    assert applied.returncode == 0 and verified.returncode == 0, (applied, verified)

    # Python, with the same content: up to date; another build of the other kernel: tuned again.
    same = dict(params=["PYREE_TILE_ROWS=8,2"], module=two.module, function="mlp", inputs=["4x16xf32=0.5"], reference=two.reference, timeout=3,
                budget=1.5, repetitions=2)  # fmt: skip
    assert "is up to date" in pb.tune(two.fc1, out, plugins=two.sm_plugin, **same).render()
    other = pb.plugin(two.sm_plugin.parent / "kernels" / "sm.c", tmp_path / "sm_other.so", defines=["PYREE_FAST_MATH=1"])
    assert other.read_bytes() != two.sm_plugin.read_bytes()
    again = pb.tune(two.fc1, out, plugins=[other], **same)
    assert "is up to date" not in again.render() and [v.status for v in again.variants] == ["ok", "ok"], again.render()
