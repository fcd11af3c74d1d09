"""`pyree-build new --import NAME --args ...` for scalars, f16 and N-D buffers: the generated
C and MLIR agree on the argument block, the project builds and its test passes, and the
generated layout carries a real kernel (a·x+b, a row-wise softmax) to the right numbers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyree_build as pb
from pyree_build.actions import import_stub
from pyree_build.core import toolchain

pytestmark = pytest.mark.slow

LOOP = re.compile(r"  for \(size_t i = 0; i < a->count.*?\n  \}\n", re.S)


def _build_and_ctest(project: Path, build_dir: Path) -> None:
    from support.cmake_projects import build, configure, ctest_run

    configure(project, build_dir)
    build(build_dir)
    result = ctest_run(build_dir, "--output-on-failure")
    assert result.returncode == 0 and "100% tests passed" in result.stdout, result.stdout


def _build_by_hand(project: Path, *, kind: str = "system", archs: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """The generated README's "by hand" steps: the plugin and the module, via the CLI."""
    plugin = project / ("plugin.sos" if kind == "standalone" else "plugin.so")
    arch_flags = [f"--arch={a}" for a in archs]
    result = run_cli("plugin", "--kind", kind, *arch_flags, project / "plugin.c", "-o", plugin, "-q")
    assert result.returncode == 0, result
    module = project / "program.vmfb"
    result = run_cli("compile", project / "program.mlir", "-o", module, "--target", "llvm-cpu", "-q")
    assert result.returncode == 0, result
    return plugin, module


@pytest.mark.parametrize(
    "spec",
    ["in:f16,out:f16", "in:f32,scalar:f32,scalar:f32,out:f32", "in:f32[?x?],scalar:i32,inout:i16[?x?]"],
    ids=["f16", "scalars", "2-D"],
)
def test_new_import_with_f16_scalars_and_2d_builds_and_its_test_passes(cli, tmp_path, spec):
    project = tmp_path / "p"
    result = cli("new", project, "--import", "op", "--args", spec)  # before issue 26, each was refused
    assert result.returncode == 0, result
    _build_and_ctest(project, tmp_path / "build")


def test_scalars_follow_the_buffers_in_the_argument_block_and_compute_a_x_plus_b(cli, tmp_path):
    project = tmp_path / "axpb"
    assert cli("new", project, "--import", "axpb", "--args", "in:f32,scalar:f32,scalar:f32,out:f32").returncode == 0
    c_text, mlir = (project / "plugin.c").read_text(), (project / "program.mlir").read_text()
    assert "func.func private @axpb(memref<f32>, index, memref<f32>, index, f32, f32, index)" in mlir
    assert re.search(r"float\* out0;.*\n.*out0_offset;.*\n\s*float s0;.*\n\s*float s1;.*\n\s*size_t count;", c_text), c_text
    assert "acc = acc * (float)a->s0 + (float)a->s1;" in c_text  # the placeholder is a·x+b already
    plugin, module = _build_by_hand(project)
    x = np.linspace(-3, 3, 100, dtype=np.float32)  # 100 elements: two workgroups of 64
    (y,) = pb.run(module, "run", [x, 3.0, 0.5], plugins=[plugin])
    np.testing.assert_array_equal(y, 3 * x + np.float32(0.5))
    (y,) = pb.run(module, "run", [x, 0.5, 3.0], plugins=[plugin])  # a and b swapped: another result
    np.testing.assert_array_equal(y, x * np.float32(0.5) + 3)


SOFTMAX = """\
  const size_t cols = a->dim1;
  for (size_t r = 0; r < a->count; ++r) {
    const float* x = a->in0 + a->in0_offset + r * cols;
    float* y = a->out0 + a->out0_offset + r * cols;
    float top = x[0], total = 0.0f;
    for (size_t c = 1; c < cols; ++c) top = x[c] > top ? x[c] : top;
    for (size_t c = 0; c < cols; ++c) total += (y[c] = expf(x[c] - top));
    for (size_t c = 0; c < cols; ++c) y[c] /= total;
  }
"""


def test_a_row_wise_softmax_written_into_the_2d_stub_matches_numpy(cli, tmp_path):
    project = tmp_path / "softmax"
    assert cli("new", project, "--import", "softmax", "--args", "in:f32[?x?],out:f32[?x?]").returncode == 0
    c_text = (project / "plugin.c").read_text()
    assert "size_t count;  // rows" in c_text and "size_t dim1;" in c_text
    assert "func.func private @softmax(memref<f32>, index, memref<f32>, index, index, index)" in (project / "program.mlir").read_text()
    c_text, replaced = LOOP.subn(SOFTMAX, c_text)
    assert replaced == 1, c_text
    (project / "plugin.c").write_text(c_text.replace("#include <stdint.h>", "#include <stdint.h>\n#include <math.h>"))
    plugin, module = _build_by_hand(project)  # a system plugin: expf comes from libm
    x = np.random.default_rng(0).standard_normal((13, 7)).astype(np.float32)  # 13 rows: two tiles of 8
    (y,) = pb.run(module, "run", [x], plugins=[plugin])
    expected = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, expected / expected.sum(axis=1, keepdims=True), rtol=1e-6)


def test_the_f16_stub_builds_standalone_for_every_arch_and_runs(cli, tmp_path):
    """A cast to or from _Float16 calls compiler-rt on x86_64/riscv64 baselines, which a
    standalone plugin cannot link; the generated code converts by bits instead."""
    project = tmp_path / "half"
    assert cli("new", project, "--import", "half", "--args", "in:f16[?x?],scalar:f32,inout:f16[?x?],out:f32[?x?]").returncode == 0
    plugin, module = _build_by_hand(project, kind="standalone", archs=("x86_64", "aarch64", "riscv64"))
    arguments = import_stub.parse_args("half", "in:f16[?x?],scalar:f32,inout:f16[?x?],out:f32[?x?]")
    inputs, expected = import_stub.test_values(arguments)
    result = cli("run", module, "--function", "run", "--plugin", plugin, *(f"--input={i}" for i in inputs), *(f"--expect={e}" for e in expected))
    assert result.returncode == 0, result


def test_the_generated_f16_conversions_match_clangs_for_every_half_and_a_sweep_of_floats(tmp_path):
    source = tmp_path / "check.c"
    source.write_text(
        "#include <stdint.h>\n#include <stdio.h>\n#include <string.h>\n"
        + import_stub._F16_HELPERS
        + r"""
int main(void) {
  long bad = 0;
  for (uint32_t u = 0; u < 65536; ++u) {
    uint16_t b = (uint16_t)u; _Float16 h; memcpy(&h, &b, 2);
    float mine = f16_to_f32(h), ref = (float)h;
    if (memcmp(&mine, &ref, 4) != 0 && !(mine != mine && ref != ref)) ++bad;
  }
  for (uint64_t u = 0; u < 0x100000000ull; u += 4099) {
    uint32_t b = (uint32_t)u; float f; memcpy(&f, &b, 4);
    _Float16 mine = f32_to_f16(f), ref = (_Float16)f;
    if (memcmp(&mine, &ref, 2) != 0 && !(f != f)) ++bad;
  }
  printf("mismatches: %ld\n", bad);
  return bad != 0;
}
"""
    )
    exe = tmp_path / "check"
    subprocess.run([*toolchain.c_compiler("zig").argv, "-O1", str(source), "-o", str(exe)], check=True)
    result = subprocess.run([exe], capture_output=True, text=True)
    assert result.returncode == 0 and "mismatches: 0" in result.stdout, result.stdout


BUFFER = st.tuples(st.sampled_from(["in", "out", "inout"]), st.sampled_from(sorted(import_stub.C_TYPES)))
SCALAR = st.sampled_from(import_stub.SCALAR_TYPES)


@st.composite
def arg_lists(draw: st.DrawFn) -> str:
    """A random --args list: 1-5 buffers of one rank (at least one written), 0-3 scalars, shuffled."""
    shape = draw(st.sampled_from(["", "[?x?]", "[?x?x?]"]))
    buffers = draw(st.lists(BUFFER, min_size=1, max_size=5))
    if all(kind == "in" for kind, _ in buffers):
        buffers.append(("out", draw(st.sampled_from(sorted(import_stub.C_TYPES)))))
    items = [f"{kind}:{etype}{shape}" for kind, etype in buffers] + [f"scalar:{t}" for t in draw(st.lists(SCALAR, max_size=3))]
    return ",".join(draw(st.permutations(items)))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=arg_lists())
def test_every_generated_import_of_random_arguments_builds_and_gets_its_expected_results(tmp_path_factory, spec):
    project = tmp_path_factory.mktemp("random") / "p"
    assert run_cli("new", project, "--import", "op", "--args", spec).returncode == 0
    arguments = import_stub.parse_args("op", spec)
    inputs, expected = import_stub.test_values(arguments)
    plugin, module = _build_by_hand(project)
    result = run_cli("run", module, "--function", "run", "--plugin", plugin, *(f"--input={i}" for i in inputs), *(f"--expect={e}" for e in expected))
    assert result.returncode == 0, (spec, result)


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ("in:f32,in:f32", ["no out or inout"]),
        ("in:f64,out:f32", ["--args item 1 'in:f64'", "iree-compile demotes f64"]),
        ("inn:f32,out:f32", ["--args item 1 'inn:f32'", "'inn' is not a kind"]),
        ("in:f32,out", ["--args item 2 'out' is not KIND:TYPE"]),
        ("in:f32,,out:f32", ["--args item 2 is empty"]),
        ("in:bf16,out:f32", ["'bf16' is not an element type"]),
        ("in:f32,scalar:f16,out:f32", ["--args item 2 'scalar:f16'", "a scalar is one of f32"]),
        ("in:f32,scalar:f32[?],out:f32", ["a scalar has no shape"]),
        ("in:f32[4x?],out:f32[4x?]", ["write each dimension as ?"]),
        ("in:f32[?x?x?x?x?],out:f32", ["has 5 dimensions"]),
        ("in:f32[?x?],out:f32", ["--args item 2 'out:f32' is 1-D but item 1 'in:f32[?x?]' is 2-D"]),
        ("scalar:i32,scalar:i32,scalar:i32,scalar:i32,scalar:i32,out:f32", ["5 scalars"]),
    ],
)
def test_bad_args_name_the_item_what_is_wrong_and_the_syntax(cli, tmp_path, spec, fragments):
    result = cli("new", tmp_path / "p", "--import", "op", "--args", spec)
    assert_clean_error(result, *fragments)
    if not any(f in fragments[0] for f in ("no out or inout", "scalars", "-D but")):
        assert "KIND:TYPE[?x?]" in result.stderr and "scalar:STYPE" in result.stderr  # the accepted syntax
    assert not (tmp_path / "p").exists()


def test_the_readmes_by_hand_steps_run_as_written_and_print_the_expected_result(cli, tmp_path):
    project = tmp_path / "by_hand"
    assert cli("new", project, "--import", "op", "--args", "in:f32[?x?],scalar:f32,out:f32[?x?]").returncode == 0
    block = re.search(r"## By hand\n+```sh\n(.*?)```", (project / "README.md").read_text(), re.S)
    assert block, "no 'By hand' block"
    script = "mkdir -p build\n" + re.sub(r"^pyree-build ", f"{sys.executable} -m pyree_build ", block[1], flags=re.M)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=project, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (expected,) = import_stub.test_values(import_stub.parse_args("op", "in:f32[?x?],scalar:f32,out:f32[?x?]"))[1]
    assert expected in proc.stdout, proc.stdout


# --- the signature form (issue 48): a plain C function, `--args "in:f32[n], out:f32[n]"` ---------


@pytest.mark.parametrize(
    "spec",
    ["in:f32[n], in:f32[n], in:f32, out:f32[n]", "in:f64[m, k], in:f64[k, n], inout:f64[m], in:i32, out:f64[m, n], out:f64[m, k]", "inout:i16[r, 4]"],
    ids=["axpy", "f64-2-D", "inout-only"],
)
def test_new_with_a_signature_writes_a_plain_c_function_whose_project_builds_and_passes(cli, tmp_path, spec):
    project = tmp_path / "p"
    result = cli("new", project, "--import", "op", "--args", spec)
    assert result.returncode == 0, result
    assert "kernel.c" in result.stderr  # the listing names the function's file
    kernel = (project / "kernel.c").read_text()
    assert re.search(r"^void op\(", kernel, re.M) and "iree" not in kernel  # the user's file is plain C
    assert "pyree_call_op" in (project / "program.mlir").read_text()
    _build_and_ctest(project, tmp_path / "build")


def test_the_generated_function_is_the_one_load_inline_takes(cli, tmp_path):
    """The project's kernel.c, edited into a real kernel, gives the same numbers from the
    project's module and plugin as from pb.load_inline with the same signature."""
    spec = "in:f32[rows, cols], out:f32[rows, cols]"
    project = tmp_path / "p"
    assert cli("new", project, "--import", "double_it", "--args", spec).returncode == 0
    kernel = project / "kernel.c"
    body = "  for (size_t i = 0; i < rows * cols; ++i) p2[i] = 2 * p1[i];\n"
    text = re.sub(r"\{\n.*\n\}\n", "{\n" + body + "}\n", kernel.read_text(), flags=re.S)
    kernel.write_text(text)
    plugin, module = _build_by_hand(project)
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    (from_project,) = pb.run(module, "double_it", [x], plugins=[plugin])
    from_inline = pb.load_inline(c_source=text, function="double_it", args=spec)(x)
    np.testing.assert_array_equal(from_project, 2 * x)
    np.testing.assert_array_equal(from_inline, 2 * x)


def test_a_bad_signature_for_new_names_the_item(cli, tmp_path):
    result = cli("new", tmp_path / "p", "--import", "op", "--args", "in:f32[n], out:f32[m]")
    assert_clean_error(result, "size 'm' is used by no input")
    assert not (tmp_path / "p").exists()
