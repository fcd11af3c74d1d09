"""Issue 36: the kernel `replace` generates has a schedule. A dense layer (MatMul + Add + Relu)
becomes one loop nest (the fill its accumulator's start, the bias and relu its epilogue, no
scratch tensor), tiled into register blocks whose sizes are knobs the C declares for `tune`,
with its row tiles shared among as many workgroups as the spec's dispatch has.

The property: at sizes no tile divides, for any value of each declared knob, on local-sync
and local-task, the replaced model gives onnxruntime's numbers (verify), with the import
called. Real tools throughout: iree-import-onnx, iree-compile, zig cc, iree-run-module.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from support import onnx_models  # noqa: E402

from pyree_build.core import toolchain  # noqa: E402
from pyree_build.models.codegen import loopnest  # noqa: E402
from pyree_build.tuning.params import declared_params, declared_stages  # noqa: E402


def _replaced(directory: Path, m: int, k: int, n: int) -> tuple[Path, Path, Path]:
    """The dense layer at m x k @ k x n: (model, program, kernels directory)."""
    model = directory / "dense.onnx"
    onnx_models.save(onnx_models.dense_layer(m, k, n), model)
    mlir = directory / "dense.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    out = directory / "kernels"
    result = run_cli("replace", mlir, "--ops", "1", "--import", "dense", "-o", out, "--onnx", model)
    assert result.returncode == 0, result
    return model, mlir, out


def test_a_dense_layer_is_one_nest_with_knobs_and_workgroups(tmp_path):
    _, _, out = _replaced(tmp_path, 40, 24, 36)
    c_text = (out / "dense.c").read_text()
    # One nest: no scratch tensor in the argument block, one accumulator, the relu applied to it.
    assert "tmp0" not in c_text and c_text.count("acc[r][c] = ") >= 2, c_text
    assert "fused into one loop nest, tiled" in c_text and "naive" not in c_text  # the header says what the body is
    assert "restrict" in c_text and "PYREE_VECTORIZE" in c_text
    # The knobs are declared as tune reads them, with their defaults as macros: the tile first
    # (every combination), then the vectorized loops' hints, each alone at the winning tile (and
    # the packing block only where a load is packed).
    stages = declared_stages([out / "dense.c"])
    later = [*([loopnest.PACK_K] if "PYREE_PACK_K" in c_text else []), loopnest.VECTOR_WIDTH, loopnest.INTERLEAVE]
    assert [{name: sorted(map(int, values)) for name, values in stage.items()} for stage in stages] == [
        {k.name: sorted(k.candidates) for k in (loopnest.TILE_ROWS, loopnest.TILE_COLS)},
        *({k.name: sorted(k.candidates)} for k in later),
    ]
    # Each knob's default is declared first: among variants noise cannot tell apart, tune keeps
    # the first declared, so a tuned kernel is the untuned one unless another is clearly faster.
    declared = declared_params([out / "dense.c"])
    knobs = (*loopnest.REDUCING_TILE, *later)  # a product over a reduction: the tile that keeps its accumulators in registers
    assert [values[0] for values in declared.values()] == [str(k.default) for k in knobs]
    assert f"#define PYREE_TILE_ROWS {loopnest.REDUCING_TILE[0].default}" in c_text
    # Outside AVX-512 and SSE-only x86-64 (AVX2: 16 registers of 8 floats) the accumulators take at
    # most half the registers; 8 x 32 took all and twice over, and the encoder's projections spilled.
    assert loopnest.REDUCING_TILE[0].default * loopnest.REDUCING_TILE[1].default // 8 <= 16 // 2
    # 40 rows of 36 columns by 24 steps: a workgroup takes ROWS_PER_WORKGROUP rows, or more to
    # make ELEMENTS_PER_WORKGROUP steps (10 rows here), each told its id and the count.
    spec_text = (out / "spec.mlir").read_text()
    per = max(loopnest.ROWS_PER_WORKGROUP, -(-loopnest.ELEMENTS_PER_WORKGROUP // (36 * 24)))
    assert per == 10 and re.search(rf"%count = arith.constant {-(-40 // per)} : index", spec_text), spec_text
    assert "stream.dispatch.workgroup.id[0]" in spec_text and "stream.dispatch.workgroup.count[0]" in spec_text


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.tuples(st.integers(1, 37), st.integers(1, 29), st.integers(1, 70)),
    rows=st.sampled_from(loopnest.TILE_ROWS.candidates),
    cols=st.sampled_from(loopnest.TILE_COLS.candidates),
    hints=st.tuples(
        st.sampled_from(loopnest.VECTOR_WIDTH.candidates), st.sampled_from(loopnest.INTERLEAVE.candidates), st.sampled_from(loopnest.PACK_K.candidates)
    ),
    device=st.sampled_from(["local-sync", "local-task"]),
)
def test_every_size_and_knob_value_verifies(tmp_path_factory, size, rows, cols, hints, device):
    directory = tmp_path_factory.mktemp("dense")
    model, mlir, out = _replaced(directory, *size)
    plugin = out / "dense.so"
    width, interleave, pack = hints
    knobs = [f"PYREE_TILE_ROWS={rows}", f"PYREE_TILE_COLS={cols}", f"PYREE_VECTOR_WIDTH={width}", f"PYREE_INTERLEAVE={interleave}", f"PYREE_PACK_K={pack}"]
    built = run_cli("plugin", "--kind", "system", out / "dense.c", "-o", plugin, *(x for k in knobs for x in ("-D", k)))
    assert built.returncode == 0, built
    module = out / "dense.vmfb"
    compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "dense")
    assert compiled.returncode == 0, compiled
    verified = run_cli("verify", module, "--onnx", model, "--plugin", plugin, "--device", device)
    assert verified.returncode == 0, verified


def _row_model(kind: str, shape: tuple[int, ...], axis: int = -1) -> Any:
    """Softmax, LogSoftmax or LayerNormalization (with scale and bias) of x[shape] over `axis`."""
    from onnx import helper

    if kind == "layer_norm":
        width = shape[-1]
        nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], name="norm", axis=-1, epsilon=1e-5)]
        weights = [onnx_models._weights(3, "scale", (width,), scale=1.0), onnx_models._weights(4, "bias", (width,))]
        return onnx_models._model("rows", nodes, {"x": shape}, {"y": shape}, weights)
    op = {"softmax": "Softmax", "logsoftmax": "LogSoftmax"}[kind]
    return onnx_models._model("rows", [helper.make_node(op, ["x"], ["y"], name=kind, axis=axis)], {"x": shape}, {"y": shape})


def _replaced_rows(directory: Path, proto: Any) -> tuple[Path, Path, Path]:
    model = directory / "rows.onnx"
    onnx_models.save(proto, model)
    mlir = directory / "rows.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    out = directory / "kernels"
    result = run_cli("replace", mlir, "--ops", "1", "--import", "rows", "-o", out, "--onnx", model)
    assert result.returncode == 0, result
    return model, mlir, out


def test_a_softmax_is_one_nest_per_row_with_lanes_and_workgroups(tmp_path):
    # The attention block's softmax group (max, exp(x - max) summed, divide) as one pass per
    # reduction over each row and one for the result, no scratch tensor; exp computed once per
    # element (stored in the result's row by the sum's pass, read back by the division's).
    _, _, out = _replaced_rows(tmp_path, _row_model("softmax", (2, 64, 100)))
    c_text = (out / "rows.c").read_text()
    assert "One row at a time" in c_text and "tmp0" not in c_text, c_text
    assert "fused row by row" in c_text and "naive" not in c_text
    assert c_text.count("reduction 1 (") == 1 and c_text.count("reduction 2 (") == 1 and "reduction 3 (" not in c_text
    assert re.search(r"const float s\d+ = out0\[", c_text), c_text
    # The max's index result (ONNX's softmax lowers through an argmax) is not computed.
    assert not re.search(r"const int64_t v\d+ = ", c_text), c_text
    lanes = declared_params([out / "rows.c"])["PYREE_LANES"]
    assert sorted(map(int, lanes)) == sorted(loopnest.LANES.candidates) and lanes[0] == str(loopnest.LANES.default)
    rows = 2 * 64
    workgroups = min(rows, -(-rows * 100 // loopnest.ELEMENTS_PER_WORKGROUP))
    assert f"%count = arith.constant {workgroups} : index" in (out / "spec.mlir").read_text()


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["softmax", "logsoftmax", "layer_norm"]),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(2, 90)),
    lanes=st.sampled_from(loopnest.LANES.candidates),
    device=st.sampled_from(["local-sync", "local-task"]),
)
def test_every_row_wise_group_size_and_lane_count_verifies(tmp_path_factory, kind, shape, lanes, device):
    # At sizes no lane count divides (a tail) or below it (the IR's order), for each value of the
    # knob: the replaced model gives onnxruntime's numbers, with the import called.
    directory = tmp_path_factory.mktemp("rows")
    model, mlir, out = _replaced_rows(directory, _row_model(kind, shape))
    assert "One row at a time" in (out / "rows.c").read_text()
    plugin = out / "rows.so"
    built = run_cli("plugin", "--kind", "system", out / "rows.c", "-o", plugin, "-D", f"PYREE_LANES={lanes}")
    assert built.returncode == 0, built
    module = out / "rows.vmfb"
    compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "rows")
    assert compiled.returncode == 0, compiled
    verified = run_cli("verify", module, "--onnx", model, "--plugin", plugin, "--device", device)
    assert verified.returncode == 0, verified


def test_a_reduction_over_another_loop_than_the_last_keeps_the_per_op_path(tmp_path):
    # Softmax over the first axis reduces a loop that is not the contiguous one: neither nest
    # covers it, so the per-op reference body is generated (and verifies).
    model, mlir, out = _replaced_rows(tmp_path, _row_model("softmax", (5, 7), axis=0))
    c_text = (out / "rows.c").read_text()
    assert "pyree-tune:" not in c_text and "tmp0" in c_text and "naive reference: one loop nest per op" in c_text
    module = out / "rows.vmfb"
    assert run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "rows").returncode == 0
    assert run_cli("plugin", "--kind", "system", out / "rows.c", "-o", out / "rows.so").returncode == 0
    verified = run_cli("verify", module, "--onnx", model, "--plugin", out / "rows.so")
    assert verified.returncode == 0, verified


def test_a_plugin_built_for_another_cpu_than_the_module_is_noted(tmp_path):
    model, mlir, out = _replaced(tmp_path, 8, 16, 24)
    plugins = {cpu: out / f"dense_{cpu}.so" for cpu in ("baseline", "host")}
    for cpu, plugin in plugins.items():
        assert run_cli("plugin", "--kind", "system", out / "dense.c", "-o", plugin, "--cpu", cpu).returncode == 0
    modules = {cpu: out / f"dense_{cpu}.vmfb" for cpu in ("generic", "host")}
    for cpu, module in modules.items():
        compiled = run_cli("compile", mlir, "-o", module, "--cpu", cpu, "--transform-spec", out / "spec.mlir", "--expect-import", "dense")
        assert compiled.returncode == 0, compiled
    notes = {}
    for module_cpu, plugin_cpu in (("host", "baseline"), ("generic", "host"), ("generic", "baseline"), ("host", "host")):
        ran = run_cli("run", modules[module_cpu], "--function", "dense", "--input", "8x16xf32=1", "--plugin", plugins[plugin_cpu])
        assert ran.returncode == 0, ran
        notes[module_cpu, plugin_cpu] = [line for line in ran.stderr.splitlines() if line.startswith("note:")]
    assert len(notes["host", "baseline"]) == 1 and "for the arch's baseline" in notes["host", "baseline"][0] and "--cpu host" in notes["host", "baseline"][0]
    assert len(notes["generic", "host"]) == 1 and "built for this CPU only" in notes["generic", "host"][0]
    assert notes["generic", "baseline"] == notes["host", "host"] == []


def test_the_nest_builds_standalone_and_embedded_and_runs_in_workgroups_there(tmp_path):
    # The same scheduled C, freestanding: a standalone plugin for three arches, and objects
    # linked into the module (hal.import.static takes the workgroup's id and count too).
    model = tmp_path / "dense.onnx"
    onnx_models.save(onnx_models.dense_layer(27, 19, 45), model)
    mlir = tmp_path / "dense.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    out = tmp_path / "k"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "dense", "-o", out, "--kind", "embedded").returncode == 0
    # 27 rows of 45 columns by 19 steps: 10 rows a workgroup make its 8,192 steps, so 3 workgroups.
    assert "%count = arith.constant 3 : index" in (out / "spec.mlir").read_text()
    standalone = run_cli("plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", "--arch", "riscv64", out / "dense.c", "-o", out / "d.sos")
    assert standalone.returncode == 0, standalone
    objects = run_cli("objects", out / "dense.c", "--arch", "x86_64", "--arch", "aarch64", "-o", out)
    assert objects.returncode == 0, objects
    module = out / "m.vmfb"
    compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--object-search-path", out)
    assert compiled.returncode == 0, compiled
    for device in ("local-sync", "local-task"):
        verified = run_cli("verify", module, "--onnx", model, "--device", device)
        assert verified.returncode == 0, verified


def test_tune_sweeps_the_generated_knobs_with_no_param_against_onnxruntime(tmp_path):
    # The command, as is: no --param, no hand-added #define. The reference is onnxruntime,
    # whose sums run in another order: tune compares as verify does (1e-4, 1e-5 x the largest
    # magnitude), where its old default (1e-5, 1e-8) called every variant wrong.
    model, mlir, out = _replaced(tmp_path, 24, 160, 40)
    module = out / "dense.vmfb"
    assert run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "dense").returncode == 0
    best = tmp_path / "best.json"
    tuned = run_cli("tune", out / "dense.c", "--module", module, "--function", "dense", "--onnx", model, "--budget", "0.3", "--repetitions", "1", "-o", best)
    assert tuned.returncode == 0, tuned
    record = json.loads(best.read_text())
    swept = {tuple(sorted(v["params"].items())) for v in record["variants"]}
    later = [*([loopnest.PACK_K] if "PYREE_PACK_K" in (out / "dense.c").read_text() else []), loopnest.VECTOR_WIDTH, loopnest.INTERLEAVE]
    # The tile's every combination, then each later knob alone at the winner: a sum, not a product.
    assert len(swept) == len(loopnest.TILE_ROWS.candidates) * len(loopnest.TILE_COLS.candidates) + sum(len(k.candidates) for k in later)
    assert all(v["status"] == "ok" for v in record["variants"]), [v["reason"] for v in record["variants"] if v["status"] != "ok"]
    winner = record["winner"]["params"]
    # (a later knob the winner does not set keeps its default: no value of it was clearly faster)
    assert {loopnest.TILE_ROWS.name, loopnest.TILE_COLS.name} <= set(winner) <= {k.name for k in (loopnest.TILE_ROWS, loopnest.TILE_COLS, *later)}
    # The later knobs ran at the tile chosen when their stage began (more rounds may later pick
    # another winner among the tiles): one tile for all of them, one the first stage swept.
    at_the_tile = {
        (v["params"][loopnest.TILE_ROWS.name], v["params"][loopnest.TILE_COLS.name]) for v in record["variants"] if loopnest.VECTOR_WIDTH.name in v["params"]
    }
    tiles = {(v["params"][loopnest.TILE_ROWS.name], v["params"][loopnest.TILE_COLS.name]) for v in record["variants"] if len(v["params"]) == 2}
    assert len(at_the_tile) == 1 and at_the_tile <= tiles, (at_the_tile, tiles)


def _instructions(zig: toolchain.Tool, source: Path, cpu: str, *defines: str) -> str:
    """The source's x86-64 assembly for `cpu`, instructions only (no directives, labels or comments)."""
    include = Path(__file__).resolve().parents[2] / "pyree_build" / "include"
    asm = source.with_suffix(".s")
    command = [*zig.argv, "-target", "x86_64-linux-gnu", f"-mcpu={cpu}", "-O3", "-S", "-o", str(asm), "-I", str(include), *(f"-D{d}" for d in defines)]
    subprocess.run([*command, str(source)], check=True)
    text = asm.read_text(errors="replace")
    return "\n".join(line for line in text.splitlines() if line.startswith("\t") and not line.startswith("\t."))


def _counts(assembly: str, instruction: str) -> dict[str, int]:
    """How many of `instruction` (a regex) work on each register class: zmm, ymm, xmm, and scalar (ss)."""
    found = re.findall(rf"\b{instruction}(ps|ss)\b[^\n]*?%(zmm|ymm|xmm)", assembly)
    return {
        kind: sum(1 for form, register in found if (form == "ss") == (kind == "ss") and (kind == "ss" or register == kind))
        for kind in ("zmm", "ymm", "xmm", "ss")
    }


@pytest.mark.parametrize(("cpu", "register"), [("x86_64_v3", "ymm"), ("znver4", "zmm")])
def test_the_full_tile_vectorizes_with_no_scatter(tmp_path, cpu, register):
    # The accumulator's update is packed multiplies and adds on the CPU's widest registers; the
    # row loop kept from the vectorizer (it had become scatters into the accumulator: 30x slower).
    _, _, out = _replaced(tmp_path, 16, 32, 64)
    zig = toolchain.c_compiler("zig")
    for cols in (loopnest.TILE_COLS.default, 16):  # 16 columns on AVX-512: where the scatters were
        text = _instructions(zig, out / "dense.c", cpu, f"PYREE_TILE_COLS={cols}")
        assert re.search(rf"\bv(fmadd\w*ps|mulps)\b[^\n]*%{register}", text), (cpu, cols)
        assert "scatter" not in text and "gather" not in text, (cpu, cols)


def test_under_avx512_a_full_tile_is_whole_vectors_where_the_compiler_prefers_256_bits(tmp_path_factory):
    # The AVX-512 tile (4 x 64 floats: 16 accumulators of 512 bits) counts on 32 registers of 16
    # floats. clang's Intel server CPUs prefer 256-bit vectors: built as the compiler chose, the
    # tile took 32 accumulators of 8 floats and spilled (the encoder block on an Emerald Rapids
    # host: 1.55x IREE's time, 0.77x asked). The kernel's functions ask for 512 bits, and a full
    # tile is covered by one vector width per step, no interleave, the width taking the fewest
    # steps: a 56-column tile (ResNet-50's row as one tile) in 8-lane vectors, where 16 lanes
    # left 8 columns to scalar multiply-adds at every reduction step. (By default a reduction's
    # row of 56 is two overlapping tiles of 32: test_under_avx512_a_row_whole_vectors_do_not_cover...)
    zig = toolchain.c_compiler("zig")
    compiler_choice = ("PYREE_WIDE_VECTORS=", f"{loopnest.VECTOR_WIDTH.name}=0", f"{loopnest.INTERLEAVE.name}=0")
    whole_row = f"{loopnest.TILE_COLS.name}={max(loopnest.TILE_COLS.candidates)}"
    for columns, register in ((64, "zmm"), (56, "ymm")):
        _, _, out = _replaced(tmp_path_factory.mktemp(f"dense{columns}"), 16, 32, columns)
        for cpu in ("sapphirerapids", "znver4"):
            fmas = _counts(_instructions(zig, out / "dense.c", cpu, whole_row), r"vfmadd\d+")
            assert fmas[register] > 0 and sum(fmas.values()) == fmas[register], (columns, cpu, fmas)
        as_preferred = _counts(_instructions(zig, out / "dense.c", "sapphirerapids", whole_row, *compiler_choice), r"vfmadd\d+")
        assert as_preferred["zmm"] == 0, as_preferred  # what asking changes
    forced = _counts(_instructions(zig, out / "dense.c", "sapphirerapids", whole_row, f"{loopnest.VECTOR_WIDTH.name}=16"), r"vfmadd\d+")
    assert forced["ss"] > 0, forced  # 16 lanes over 56 columns: the scalar remainder the width rule avoids
    _, _, rows = _replaced_rows(tmp_path_factory.mktemp("rows"), _row_model("softmax", (2, 8, 256)))
    assert _counts(_instructions(zig, rows / "rows.c", "sapphirerapids"), r"v(?:add|max|mul)")["zmm"] > 0
    # Below AVX-512 nothing is asked: the x86-64-v3 build is the compiler's own.
    assert _instructions(zig, out / "dense.c", "x86_64_v3") == _instructions(zig, out / "dense.c", "x86_64_v3", *compiler_choice)


@pytest.mark.parametrize(("columns", "tile"), [(55, 32), (27, 16), (56, 32)])
def test_under_avx512_a_row_whole_vectors_do_not_cover_is_overlapping_tiles_of_vectors(tmp_path, columns, tile):
    # A row of 55 (SqueezeNet's 3x3 convolutions) as one tile left 7 columns to scalar
    # multiply-adds at every reduction step (0.78x IREE's time; 0.32x in tiles of 32). By
    # default with AVX-512 such a row is tiles of a candidate width (at least 16 floats), the last
    # one ending at the row's edge (overlapping the one before), so every multiply-add is a vector; the tile
    # verifies at every width (test_every_size_and_knob_value_verifies draws sizes no tile divides).
    # A reduction's row of 56 (ResNet-50's) that 7 vectors of 8 cover is tiles of 32 too: 28
    # accumulators of 8 for 4 rows spilled; its convolutions took 0.52x-0.69x the time in tiles of 32.
    _, _, out = _replaced(tmp_path, 16, 32, columns)
    c_text = (out / "dense.c").read_text()
    assert f"#if defined(__AVX512F__)\n#define PYREE_TILE_COLS {tile}\n" in c_text, c_text
    assert "cols - PYREE_FULL_COLS : next" in c_text  # the last tile moved back to the row's edge
    zig = toolchain.c_compiler("zig")
    for cpu in ("sapphirerapids", "znver4"):
        fmas = _counts(_instructions(zig, out / "dense.c", cpu), r"vfmadd\d+")
        assert fmas["ss"] == 0 and sum(fmas.values()) > 0, (cpu, fmas)
    if columns % 4:
        whole_row = _counts(_instructions(zig, out / "dense.c", "sapphirerapids", f"PYREE_TILE_COLS={max(loopnest.TILE_COLS.candidates)}"), r"vfmadd\d+")
        assert whole_row["ss"] > 0, whole_row  # what the default avoids


@pytest.mark.parametrize("columns", [1000, 1001])
def test_a_row_wider_than_the_default_tile_keeps_it(tmp_path, columns):
    # A classifier's one row of 1,000 columns is already tiles of 64 (the last overlapping the
    # one before): tiles of 16 took 2 fewer vector steps in 63 but left one accumulator's chain
    # of multiply-adds (ResNet-50's classifier alone: 1.42x the time).
    _, _, out = _replaced(tmp_path, 1, 32, columns)
    c_text = (out / "dense.c").read_text()
    assert f"#if defined(__AVX512F__)\n#define PYREE_TILE_COLS {loopnest.TILE_COLS.wide_default}\n" in c_text, c_text[:3000]


def test_the_accumulators_update_is_a_fused_multiply_add_where_the_cpu_has_one(tmp_path):
    # Unfused, a matmul on an FMA CPU issued a multiply and an add per step: 1.28x IREE's time,
    # whose matmul is FMA instructions. The math helpers above the pragma stay as written.
    model, mlir, out = _replaced(tmp_path, 16, 32, 64)
    zig = toolchain.c_compiler("zig")

    def assembly(cpu: str, *defines: str) -> str:
        return _instructions(zig, out / "dense.c", cpu, *defines)

    assert re.search(r"\bvfmadd\w*ps\b", assembly("x86_64_v3"))
    unfused = assembly("x86_64_v3", "PYREE_FP_CONTRACT=0")
    assert not re.search(r"\bvfmadd", unfused) and re.search(r"\bvmulps\b", unfused)
    # A CPU without FMA multiplies and adds: no call to a software fma.
    assert not re.search(r"\bcall\w*\s+\w*fma", assembly("x86_64"))
    # Fused on this machine's CPU (FMA where it has one), the kernel still verifies.
    _builds_compiles_and_verifies(out, "dense", mlir, model, plugin_args=["--cpu", "host"])


@pytest.mark.parametrize(("pack", "rows", "cols"), [("64", "8", "32"), ("1", "2", "8"), ("16", "6", "64")])
def test_a_transposed_weight_is_packed_and_verifies(tmp_path, pack, rows, cols):
    # Gemm with transB (PyTorch's Linear): the weight is read B[column][k], strided along the
    # contiguous loop, so each block of PYREE_PACK_K steps first packs its panel (14x faster at
    # 128x512x512). Sizes no tile or block divides: 13 rows, 70 steps, 37 columns.
    from onnx import helper

    nodes = [helper.make_node("Gemm", ["a", "B", "C"], ["y"], name="gemm", transB=1)]
    weights = [onnx_models._weights(0, "B", (37, 70)), onnx_models._weights(1, "C", (37,))]
    model = tmp_path / "gemm.onnx"
    onnx_models.save(onnx_models._model("gemm", nodes, {"a": (13, 70)}, {"y": (13, 37)}, weights), model)
    mlir = tmp_path / "gemm.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    out = tmp_path / "k"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "gemm", "-o", out).returncode == 0
    c_text = (out / "gemm.c").read_text()
    assert "panel0[k2 - kb][c]" in c_text and "panel1" not in c_text, c_text
    defines = [a for d in (f"PYREE_PACK_K={pack}", f"PYREE_TILE_ROWS={rows}", f"PYREE_TILE_COLS={cols}") for a in ("-D", d)]
    _builds_compiles_and_verifies(out, "gemm", mlir, model, plugin_args=defines, device="local-task")


def test_the_float_exp_the_row_nests_use_is_within_one_ulp(tmp_path):
    # pyree_expf (branch-free, so the passes vectorize) against exp rounded from double, over
    # every range it meets: overflow, the largest and smallest normal results, subnormal
    # results, underflow to 0, infinities and NaN.

    from pyree_build.models.codegen import c_reference

    program = tmp_path / "expf.c"
    kernel = c_reference.Kernel()
    c_reference._helper(kernel, "pyree_expf")
    program.write_text(
        "#include <stdint.h>\n#include <stdio.h>\n"
        + "\n".join(c_reference.helpers_text(kernel))
        + "\nint main(void) { float x; while (fread(&x, 4, 1, stdin) == 1) { float y = pyree_expf(x); fwrite(&y, 4, 1, stdout); } return 0; }\n"
    )
    exe = tmp_path / "expf"
    zig = toolchain.c_compiler("zig")
    subprocess.run([*zig.argv, "-O2", str(program), "-o", str(exe)], check=True)
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-110, 90, 200_001), rng.uniform(-1, 1, 50_000), [88.72283, 88.7229, -87.33655, -103.97, -104.5, 0.0, -0.0]]).astype(
        np.float32
    )
    special = np.array([np.inf, -np.inf, np.nan], np.float32)
    got = np.frombuffer(subprocess.run([str(exe)], input=np.concatenate([x, special]).tobytes(), capture_output=True, check=True).stdout, np.float32)
    with np.errstate(over="ignore"):  # past the largest float: inf, as it should be
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got[: len(x)].view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1, (x[ulps.argmax()], got[ulps.argmax()], want[ulps.argmax()])
    assert got[-3] == np.inf and got[-2] == 0.0 and np.isnan(got[-1])


def _heads_model(tokens: int, heads: int, width: int, kind: str) -> Any:
    """Attention's layout changes: x[tokens, heads*width] @ W + b split into heads (Reshape, then
    Transpose to [heads, tokens, width]); `bias`: x + b alone split so (an elementwise group);
    `merge`: batched scores (per head, x_h @ x_h^T' as a MatMul of [heads, tokens, width] by
    [heads, width, tokens]) transposed back and merged."""
    from onnx import TensorProto, helper

    merge = kind == "merge"
    if not merge:
        d = heads * width
        nodes = [
            *([helper.make_node("MatMul", ["x", "w"], ["p"], name="proj")] if kind == "project" else []),
            helper.make_node("Add", ["p" if kind == "project" else "x", "b"], ["pb"], name="bias"),
            helper.make_node("Reshape", ["pb", "split_shape"], ["s"], name="split"),
            helper.make_node("Transpose", ["s"], ["y"], name="heads", perm=[1, 0, 2]),
        ]
        weights = [
            *([onnx_models._weights(1, "w", (d, d))] if kind == "project" else []),
            onnx_models._weights(2, "b", (d,)),
            helper.make_tensor("split_shape", TensorProto.INT64, [3], [tokens, heads, width]),
        ]
        return onnx_models._model("heads", nodes, {"x": (tokens, d)}, {"y": (heads, tokens, width)}, weights)
    nodes = [
        helper.make_node("MatMul", ["q", "k"], ["c"], name="context"),
        helper.make_node("Transpose", ["c"], ["t"], name="ctx_t", perm=[1, 0, 2]),
        helper.make_node("Reshape", ["t", "merge_shape"], ["y"], name="merge"),
    ]
    weights = [helper.make_tensor("merge_shape", TensorProto.INT64, [2], [tokens, heads * tokens])]
    return onnx_models._model("heads", nodes, {"q": (heads, tokens, width), "k": (heads, width, tokens)}, {"y": (tokens, heads * tokens)}, weights)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.integers(1, 19), heads=st.integers(1, 4), width=st.integers(1, 12), kind=st.sampled_from(["project", "bias", "merge"]))
@example(tokens=16, heads=2, width=8, kind="bias")
def test_a_group_ending_in_a_reshape_and_transpose_is_one_tiled_nest_that_verifies(tmp_path_factory, tokens, heads, width, kind):
    # Attention's head split and merge: the nest computes the matmul (and its bias) and stores
    # each element where the reshape and transpose move it, instead of the per-op reference.
    # An elementwise group (the bias alone) is a nest over the result instead: each element is
    # computed from where it came from, so its store is contiguous, not a scatter.
    directory = tmp_path_factory.mktemp("heads")
    model = directory / "heads.onnx"
    onnx_models.save(_heads_model(tokens, heads, width, kind), model)
    mlir = directory / "heads.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    out = directory / "kernels"
    result = run_cli("replace", mlir, "--ops", "1", "--import", "heads", "-o", out, "--onnx", model)
    assert result.returncode == 0, result
    c_text = (out / "heads.c").read_text()
    assert "fused into one loop nest, tiled" in c_text and "tmp0" not in c_text, c_text[:600]
    if kind == "bias":
        store = re.search(r"out0\[(.*)\] = ", c_text)
        assert store and "/" not in store.group(1) and "%" not in store.group(1), store
    _builds_compiles_and_verifies(out, "heads", mlir, model)


def test_a_kernel_calling_exp_or_erf_declares_their_faster_forms_which_verify_and_change_the_code(tmp_path):
    # Issue 47: where a function has a faster form (math_inline.h's *_fast), the generated kernel
    # declares PYREE_FAST_MATH as a later knob; built at 1, the calls take those forms (the
    # numbers move by an ulp or two) and the group still verifies against onnxruntime. A kernel
    # calling none of them declares nothing more (the dense layer's stages above are unchanged).

    import pyree_build as pb

    (tmp_path / "softmax").mkdir()
    model, mlir, out = _replaced_rows(tmp_path / "softmax", _row_model("softmax", (2, 16, 300)))
    c_text = (out / "rows.c").read_text()
    assert {"PYREE_FAST_MATH": ["0", "1"]} in declared_stages([out / "rows.c"])  # a later stage of its own
    assert "#define pyree_expf pyree_expf_fast" in c_text and "static inline float pyree_expf_fast(" in c_text
    module = out / "rows.vmfb"
    assert run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "rows").returncode == 0
    x = np.random.default_rng(0).uniform(-8, 8, (2, 16, 300)).astype(np.float32)
    results = []
    for fast in ("0", "1"):
        plugin = out / f"rows{fast}.so"
        assert run_cli("plugin", "--kind", "system", out / "rows.c", "-o", plugin, "-D", f"PYREE_FAST_MATH={fast}").returncode == 0
        verified = run_cli("verify", module, "--onnx", model, "--plugin", plugin)
        assert verified.returncode == 0, verified
        results.append(pb.run(module, "rows", [x], plugins=[plugin])[0])
    assert not np.array_equal(results[0], results[1])  # the knob reaches the calls
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-7)
    # GELU's erf, merged with the Linear before it: the fast erf keeps the block verified.
    gelu = tmp_path / "gelu"
    gelu.mkdir()
    model = gelu / "user.onnx"
    onnx_models.save(onnx_models.gemm_gelu_norm(), model)
    mlir = gelu / "user.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    assert run_cli("replace", mlir, "--ops", "1+2+3", "--import", "fc_gelu", "-o", gelu / "k", "--onnx", model).returncode == 0
    assert "#define pyree_erff pyree_erff_fast" in (gelu / "k" / "fc_gelu.c").read_text()
    _builds_compiles_and_verifies(gelu / "k", "fc_gelu", mlir, model, plugin_args=["-D", "PYREE_FAST_MATH=1"])


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    channels=st.tuples(st.integers(1, 9), st.integers(2, 12)),
    size=st.integers(3, 11),
    kernel=st.sampled_from([1, 3]),
    order=st.sampled_from(["0", "1"]),
    rows=st.sampled_from(loopnest.TILE_ROWS.candidates),
)
@example(channels=(3, 8), size=9, kernel=3, order="0", rows=6)
@example(channels=(3, 8), size=9, kernel=1, order="1", rows=4)
@example(channels=(3, 8), size=8, kernel=3, order="0", rows=4)  # rows of a tile share the channel and the image row
@example(channels=(2, 12), size=5, kernel=1, order="1", rows=6)  # rows of a tile share the image row
def test_a_convolution_declares_its_row_order_and_every_order_verifies(tmp_path_factory, channels, size, kernel, order, rows):
    # A tile's rows step over the output channel first by default (PYREE_ROW_ORDER=1: they read
    # the same input row, the weights differ), or in the result's order (0). Both verify at
    # sizes no tile divides, and the row coordinates cover every element either way.
    directory = tmp_path_factory.mktemp("conv")
    cin, cout = channels
    nodes, weights = onnx_models._conv(0, "conv", "x", cin, cout, kernel, pad=kernel // 2)
    proto = onnx_models._model("conv", nodes, {"x": (1, cin, size, size)}, {"conv": (1, cout, size, size)}, weights)
    model = directory / "conv.onnx"
    onnx_models.save(proto, model)
    mlir = directory / "conv.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    import pyree_build as pb

    groups = [g for g in pb.ops(mlir) if g.replaceable and "linalg.conv_2d_nchw_fchw" in g.ops]
    assert groups, "the convolution is replaceable"
    out = directory / "k"
    assert run_cli("replace", mlir, "--ops", str(groups[0].index), "--import", "conv", "-o", out, "--onnx", model).returncode == 0
    c_text = (out / "conv.c").read_text()
    # The knob exists where the largest input is the image (the output channel is a row loop it
    # does not index); where the weights are larger, the result's order already reuses them.
    padded = size + 2 * (kernel // 2)  # the convolution reads the padded image
    if cin * padded * padded > cout * cin * kernel * kernel:
        assert declared_params([out / "conv.c"])["PYREE_ROW_ORDER"] == ["1", "0"] and "#if PYREE_ROW_ORDER" in c_text
    else:
        assert "PYREE_ROW_ORDER" not in c_text
    knobs = ["-D", f"PYREE_ROW_ORDER={order}", "-D", f"PYREE_TILE_ROWS={rows}"]
    _builds_compiles_and_verifies(out, "conv", mlir, model, plugin_args=knobs, work=directory)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["Conv", "MaxPool"]),
    stride=st.sampled_from([2, 3]),
    kernel=st.sampled_from([1, 3, 5]),
    size=st.integers(6, 40),
    order=st.sampled_from(["0", "1"]),
    rows=st.sampled_from(loopnest.TILE_ROWS.candidates),
    cols=st.sampled_from(loopnest.TILE_COLS.candidates),
)
@example(kind="Conv", stride=2, kernel=5, size=40, order="1", rows=4, cols=16)  # the rows share the input row: one panel
@example(kind="Conv", stride=2, kernel=3, size=15, order="0", rows=6, cols=8)  # rows cross image rows: a panel per row
@example(kind="MaxPool", stride=3, kernel=3, size=23, order="1", rows=8, cols=64)
def test_a_load_strided_along_the_columns_is_packed_or_not_as_the_knob_says_and_both_give_the_same_numbers(
    tmp_path_factory, kind, stride, kernel, size, order, rows, cols
):
    # A strided convolution or pooling reads its input row every `stride` elements. Under
    # PYREE_PACK_STRIDED=1 each block of the innermost reduction loop first copies those reads
    # into a contiguous panel (one for all the tile's rows where they share the input row, else
    # one per row); at 0 they are read in place. Both verify against onnxruntime, at sizes no
    # tile divides, and give the same numbers: the copy moves values, it computes nothing.
    from onnx import helper

    import pyree_build as pb

    directory = tmp_path_factory.mktemp("strided")
    cin, cout, pad = 3, 10, kernel // 2
    if kind == "Conv":
        nodes, weights = onnx_models._conv(0, "y", "x", cin, cout, kernel, stride=stride, pad=pad)
    else:
        nodes = [helper.make_node("MaxPool", ["x"], ["y"], name="y", kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=[pad] * 4)]
        weights, cout = [], cin
    side = (size + 2 * pad - kernel) // stride + 1
    proto = onnx_models._model("strided", nodes, {"x": (1, cin, size, size)}, {"y": (1, cout, side, side)}, weights)
    model = directory / "strided.onnx"
    onnx_models.save(proto, model)
    mlir = directory / "strided.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    op = "linalg.conv_2d_nchw_fchw" if kind == "Conv" else "linalg.pooling_nchw_max"
    groups = [g for g in pb.ops(mlir) if g.replaceable and op in g.ops]
    assert groups, f"the {kind} is replaceable"
    out = directory / "k"
    assert run_cli("replace", mlir, "--ops", str(groups[0].index), "--import", "strided", "-o", out, "--onnx", model).returncode == 0
    assert declared_params([out / "strided.c"])["PYREE_PACK_STRIDED"] == ["1", "0"]
    assert "if (PYREE_PACK_STRIDED) {" in (out / "strided.c").read_text()
    module = directory / "strided.vmfb"
    assert run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "strided").returncode == 0
    x = np.random.default_rng(size).standard_normal((1, cin, size, size)).astype(np.float32)
    results = []
    for packed in ("1", "0"):
        plugin = directory / f"strided{packed}.so"
        knobs = [f"PYREE_PACK_STRIDED={packed}", f"PYREE_ROW_ORDER={order}", f"PYREE_TILE_ROWS={rows}", f"PYREE_TILE_COLS={cols}"]
        built = run_cli("plugin", "--kind", "system", out / "strided.c", "-o", plugin, *(a for k in knobs for a in ("-D", k)))
        assert built.returncode == 0, built
        verified = run_cli("verify", module, "--onnx", model, "--plugin", plugin)
        assert verified.returncode == 0, verified
        results.append(pb.run(module, "strided", [x], plugins=[plugin])[0])
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("rows", ["4", "8"])
def test_a_batched_matmuls_tile_reads_its_heads_operand_once_where_the_tile_never_crosses_heads(tmp_path, rows):
    # Per head, x_h @ k_h: a tile's rows all lie in one head where its rows divide the tokens
    # (12 at 4), so the right-hand operand's address is the same for every row and loaded once
    # (1.33x IREE's time on AVX-512 when reloaded per row, 1.01x once). At 8 rows a tile spans
    # two heads and each row reads its own: both verify.
    model = tmp_path / "heads.onnx"
    onnx_models.save(_heads_model(12, 2, 5, "merge"), model)
    mlir = tmp_path / "heads.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    out = tmp_path / "kernels"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "heads", "-o", out, "--onnx", model).returncode == 0
    c_text = (out / "heads.c").read_text()
    assert "#define PYREE_SHARED_AT0 (12 % PYREE_TILE_ROWS == 0)" in c_text, c_text
    assert re.search(r"in1\[\(\(at0\[PYREE_SHARED_AT0 \? 0 : r\]", c_text), c_text
    _builds_compiles_and_verifies(out, "heads", mlir, model, plugin_args=["-D", f"PYREE_TILE_ROWS={rows}"])


def _sum_relu(directory: Path, x: tuple[int, ...], y: tuple[int, ...]) -> tuple[Path, Path, Path]:
    """Add(x, y) + Relu, y broadcast to x's shape: (model, program, kernels directory of its one group)."""
    from onnx import helper

    nodes = [helper.make_node("Add", ["x", "y"], ["s"], name="sum"), helper.make_node("Relu", ["s"], ["z"], name="relu")]
    model = directory / "sum.onnx"
    onnx_models.save(onnx_models._model("sum", nodes, {"x": x, "y": y}, {"z": x}), model)
    mlir = directory / "sum.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    out = directory / "k"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "sum", "-o", out, "--onnx", model).returncode == 0
    return model, mlir, out


@pytest.mark.parametrize("width", [20, 56, 100])
def test_an_elementwise_nest_takes_a_narrow_row_as_one_tile_and_big_workgroups(tmp_path, width):
    # Sum + Relu over rows of `width`: a row no wider than the widest column tile is one tile
    # (rows of 56 at 32 columns were a tile and an edge tile: 1.41x IREE's time, 1.06x as one), and
    # a workgroup gets at least ELEMENTS_PER_WORKGROUP elements (its fixed cost showed at 56 each).
    # y is broadcast along the rows' last dimension, so the row is not folded into a wider one.
    model, mlir, out = _sum_relu(tmp_path, (1, 64, 56, width), (1, 64, 1, width))
    c_text = (out / "sum.c").read_text()
    default = max(loopnest.TILE_COLS.candidates) if loopnest.TILE_COLS.default < width <= max(loopnest.TILE_COLS.candidates) else loopnest.TILE_COLS.default
    assert f"#else\n#define PYREE_TILE_COLS {default}\n" in c_text, c_text
    assert f"#define PYREE_FULL_COLS ({width} < PYREE_TILE_COLS ? {width} : PYREE_TILE_COLS)" in c_text
    rows = 64 * 56
    per = max(loopnest.ROWS_PER_WORKGROUP, -(-loopnest.ELEMENTS_PER_WORKGROUP // width))
    assert f"%count = arith.constant {-(-rows // per)} : index" in (out / "spec.mlir").read_text()
    _builds_compiles_and_verifies(out, "sum", mlir, model, device="local-task")


@pytest.mark.parametrize(
    ("x", "y", "width"),
    [
        ((1, 256, 7, 7), (1, 256, 7, 7), 49),  # ResNet-50's residual sum: rows of 7 took 2.83x IREE's time
        ((1, 256, 7, 7), (1, 256, 1, 1), 49),  # a per-channel operand (BatchNorm's) reads none of the folded loops
        ((1, 256, 28, 28), (1, 256, 28, 28), 784),  # 28 < WIDE_ROW: folded once, then wide enough
        ((2, 96, 40, 12), (2, 96, 40, 12), 480),  # 480 < WIDE_ROW, but folding 96 more leaves 2 rows for 12 workgroups
        ((1, 64, 56, 56), (1, 64, 56, 56), 56),  # 64 rows of 3,136 would be 8 workgroups, not 25
        ((1, 256, 7, 7), (1, 256, 1, 7), 7),  # y reads the last loop but not the one before: not contiguous
        ((1, 256, 7, 7), (1, 256, 7, 1), 7),  # y reads the loop before but not the last one
        ((1, 32, 7, 7), (1, 32, 7, 7), 49),  # one workgroup either way
        ((1, 4, 3, 5), (1, 4, 3, 5), 5),  # 4 rows left: fewer than one workgroup's
    ],
)
def test_an_elementwise_nests_last_loops_fold_into_one_contiguous_row_where_every_operand_reads_them_so(tmp_path, x, y, width):
    # The row is the result's last dimensions taken as one where every operand reads them
    # contiguously (or not at all), so a tile is whole vectors and one offset per load; a row of
    # 7 is 4 lanes and 3 scalar steps. Folded or not, the kernel gives IREE's numbers (the
    # property below draws the shapes and the knobs).
    _, _, out = _sum_relu(tmp_path, x, y)
    c_text = (out / "sum.c").read_text()
    assert f"#define PYREE_FULL_COLS ({width} < PYREE_TILE_COLS ? {width} : PYREE_TILE_COLS)" in c_text, c_text
    folded = width != x[-1]
    assert ("A row is the result's last" in c_text) == folded
    if folded:
        # Every load and the store take the column index itself: no quotient or remainder of it.
        assert "(col0 + c) /" not in c_text and "(col0 + c) %" not in c_text, c_text
        assert c_text.count(" + (col0 + c))]") == (3 if y == x else 2), c_text  # x, the store, and y where it reads the row
        rows = int(np.prod(x)) // width
        per = max(loopnest.ROWS_PER_WORKGROUP, -(-loopnest.ELEMENTS_PER_WORKGROUP // width))
        assert f"%count = arith.constant {min(loopnest.MAX_WORKGROUPS, -(-rows // per))} : index" in (out / "spec.mlir").read_text()


def test_a_spec_for_any_sizes_keeps_its_rows_unfolded_and_verifies_at_other_sizes(tmp_path):
    # --dynamic: the kernel reads every size from its arguments, so the IR's sizes (which would
    # fold 7 x 7 into 49) are not the row it runs; folded, another model's sizes were wrong.
    _, mlir, _ = _sum_relu(tmp_path, (1, 256, 7, 7), (1, 256, 7, 7))
    other_model, other_mlir, _ = _sum_relu(tmp_path / "other", (2, 96, 5, 3), (2, 96, 5, 3))
    out = tmp_path / "any"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "sum", "-o", out, "--dynamic").returncode == 0
    assert "A row is" not in (out / "sum.c").read_text()
    _builds_compiles_and_verifies(out, "sum", other_mlir, other_model)


def test_a_batchnorm_folds_though_its_per_channel_values_are_stages_over_unit_dimensions(tmp_path):
    # BatchNormalization's rsqrt(var + eps) is a stage of its own over 1 x C x 1 x 1, read per
    # channel: its loops are not the result's, so its unit dimensions do not stop the fold (as
    # they did at first: DenseNet-121's BatchNorm over 992 x 7 x 7 alone stayed 2.77x IREE's
    # time; 0.97x folded). The property below covers the folded tile's numbers at any knob value.
    from onnx import helper

    x = (1, 256, 7, 7)
    nodes, weights = onnx_models._batch_norm(1, "bn", "x", x[1])
    relu = helper.make_node("Relu", ["bn"], ["y"], name="relu")
    model = tmp_path / "bn.onnx"
    onnx_models.save(onnx_models._model("bn", [*nodes, relu], {"x": x}, {"y": x}, weights), model)
    mlir = tmp_path / "bn.mlir"
    assert run_cli("import", model, "-o", mlir).returncode == 0
    out = tmp_path / "k"
    assert run_cli("replace", mlir, "--ops", "1", "--import", "bn", "-o", out, "--onnx", model).returncode == 0
    c_text = (out / "bn.c").read_text()
    assert "rsqrt" in c_text and "A row is the result's last 2 dimensions (7 x 7)" in c_text, c_text
    assert "(col0 + c) /" not in c_text and "(col0 + c) %" not in c_text, c_text
    assert run_cli("plugin", "--kind", "system", out / "bn.c", "-o", out / "bn.so").returncode == 0
    module = out / "bn.vmfb"
    assert run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "bn").returncode == 0
    verified = run_cli("verify", module, "--onnx", model, "--plugin", out / "bn.so", "--device", "local-task")
    assert verified.returncode == 0, verified


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.tuples(st.integers(1, 2), st.integers(60, 130), st.integers(1, 9), st.integers(1, 9)),
    broadcast=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
    rows=st.sampled_from(loopnest.TILE_ROWS.candidates),
    cols=st.sampled_from(loopnest.TILE_COLS.candidates),
    device=st.sampled_from(["local-sync", "local-task"]),
)
@example(shape=(1, 64, 7, 7), broadcast=(False, False, False, False), rows=6, cols=16, device="local-task")
@example(shape=(2, 65, 5, 3), broadcast=(False, False, True, True), rows=4, cols=8, device="local-sync")
def test_a_folded_or_unfolded_elementwise_nest_verifies_at_every_knob_value(tmp_path_factory, shape, broadcast, rows, cols, device):
    # y broadcast along the dimensions drawn: some fold (a per-channel y), some do not (a y that
    # reads the last loop but not the one before); tiles that do not divide the folded row.
    directory = tmp_path_factory.mktemp("fold")
    y = tuple(1 if flat else d for d, flat in zip(shape, broadcast))
    model, mlir, out = _sum_relu(directory, shape, y)
    plugin = out / "sum.so"
    built = run_cli("plugin", "--kind", "system", out / "sum.c", "-o", plugin, "-D", f"PYREE_TILE_ROWS={rows}", "-D", f"PYREE_TILE_COLS={cols}")
    assert built.returncode == 0, built
    module = out / "sum.vmfb"
    assert run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "sum").returncode == 0
    verified = run_cli("verify", module, "--onnx", model, "--plugin", plugin, "--device", device)
    assert verified.returncode == 0, verified


def test_a_group_reading_inputs_through_reshapes_is_one_tiled_nest_that_verifies(tmp_path):
    # ResNet's blocks: every group whose ops read a BatchNorm's 1-D parameters through a
    # tensor.expand_shape (their unit dimensions added) is one tiled nest now, the reshape's
    # result read from the input's own buffer at its sizes; before, the whole group got the
    # per-op reference body (4.3x IREE's time for ResNet-50's shortcut conv + BatchNorm).
    import pyree_build as pb

    # 128 channels: the parameters are 128-element weights, which import keeps in the archive
    # (100 or more elements), read as 1-D globals and reshaped in the program.
    nodes, weights = onnx_models._conv(0, "conv", "x", 3, 128, 1, bias=False)
    bn_nodes, bn_weights = onnx_models._batch_norm(1, "bn", "conv", 128)
    relu = onnx_models.helper.make_node("Relu", ["bn"], ["y"], name="relu")
    model = tmp_path / "block.onnx"
    onnx_models.save(onnx_models._model("block", [*nodes, *bn_nodes, relu], {"x": (1, 3, 5, 7)}, {"y": (1, 128, 5, 7)}, [*weights, *bn_weights]), model)
    mlir = pb.import_onnx(model, tmp_path / "block.mlir")
    reshaping = [g for g in pb.ops(mlir) if g.replaceable and "tensor.expand_shape" in g.ops]
    assert reshaping, [(g.index, g.ops) for g in pb.ops(mlir)]
    names = [f"g{g.index}" for g in reshaping]
    pb.replace(mlir, tmp_path / "k", ops=[g.index for g in reshaping], imports=names, onnx=model)
    for name in names:
        c_text = (tmp_path / "k" / f"{name}.c").read_text()
        assert "fused into one loop nest, tiled" in c_text and "naive" not in c_text, name
    plugins = [pb.plugin(tmp_path / "k" / f"{n}.c", tmp_path / f"{n}.so") for n in names]
    module = pb.compile(mlir, tmp_path / "m.vmfb", transform_spec=tmp_path / "k" / "spec.mlir", expect_imports=names)
    verdict = pb.verify(module, model, plugins=plugins)
    assert verdict.passed, verdict.render()


def _shapes_of_one_size(draw: Any) -> tuple[list[int], list[int]]:
    """Two shapes of the same element count: one drawn, the other its dims regrouped (split
    into factors, merged with neighbours, unit dims added)."""
    source = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    target: list[int] = []
    for d in source:
        factors = [f for f in range(2, d + 1) if d % f == 0]
        if factors and draw(st.booleans()):
            f = draw(st.sampled_from(factors))
            target += [f, d // f]
        elif target and draw(st.booleans()):
            target[-1] *= d
        else:
            target.append(d)
        if draw(st.integers(0, 5)) == 0:
            target.append(1)
    return source, target


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_reshapes_coordinates_are_the_row_major_order_kept_both_ways(data):
    # loopnest._reshape writes a reshape's coordinates group by group of dims (a split is a / and
    # a % of its own coordinate, a merge a sum); whatever the grouping, they must be numpy's
    # (unravel of ravel), and the reverse reshape must give the coordinates back.
    source, target = _shapes_of_one_size(data.draw)
    if data.draw(st.booleans()):
        source, target = target, source
    coords = [data.draw(st.integers(0, d - 1)) for d in source]
    moved = loopnest._reshape(source, target)([str(c) for c in coords])
    got = [eval(e.replace("/", "//")) for e in moved]  # noqa: S307 - integer expressions written above
    want = list(np.unravel_index(np.ravel_multi_index(coords, source), target))
    assert got == want, (source, target, coords, moved)
    back = loopnest._reshape(target, source)([str(c) for c in got])
    assert [eval(e.replace("/", "//")) for e in back] == coords  # noqa: S307


def _builds_compiles_and_verifies(
    kernels: Path, name: str, mlir: Path, model: Path, *, plugin_args: Sequence[str] = (), device: str | None = None, work: Path | None = None
) -> None:
    """What a user does with `replace`'s output: build kernels/<name>.c as a system plugin
    (`plugin_args`: knobs, a CPU), compile `mlir` with the spec expecting the import to be
    called, and verify the module against onnxruntime (on `device`). The plugin and module go
    to `work` (default: the kernels' directory)."""
    work = work or kernels
    plugin = work / f"{name}.so"
    built = run_cli("plugin", "--kind", "system", kernels / f"{name}.c", "-o", plugin, *plugin_args)
    assert built.returncode == 0, built
    module = work / f"{name}.vmfb"
    compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", kernels / "spec.mlir", "--expect-import", name)
    assert compiled.returncode == 0, compiled
    verified = run_cli("verify", module, "--onnx", model, "--plugin", plugin, *(["--device", device] if device else []))
    assert verified.returncode == 0, verified
