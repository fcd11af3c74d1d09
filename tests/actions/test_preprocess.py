"""compile --preprocess: an iree-opt pipeline on the source first, for rewrites that must see the
input dialect (here: PDL patterns on a tosa program), keyed by the pipeline and its files."""

from __future__ import annotations

import time

from conftest import assert_clean_error

TOSA = """\
func.func @combine(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = tosa.add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""

# Rewrites tosa.add into another tosa op with the same operands.
PDL = """\
pdl.pattern @rewrite_add : benefit(1) {
  %type = pdl.type
  %lhs = pdl.operand
  %rhs = pdl.operand
  %add = pdl.operation "tosa.add"(%lhs, %rhs : !pdl.value, !pdl.value) -> (%type : !pdl.type)
  pdl.rewrite %add {
    %new = pdl.operation "tosa.OP"(%lhs, %rhs : !pdl.value, !pdl.value) -> (%type : !pdl.type)
    pdl.replace %add with %new
  }
}
"""
INPUTS = ["--function", "combine", "--input", "4xf32=5", "--input", "4xf32=2"]


def _write(tmp_path, op: str = "sub"):
    (tmp_path / "program.mlir").write_text(TOSA)
    (tmp_path / "rewrite.pdl.mlir").write_text(PDL.replace("OP", op))
    return "builtin.module(iree-preprocessing-apply-pdl-patterns{patterns-file=rewrite.pdl.mlir})"


def test_preprocess_applies_input_level_patterns_that_a_pdl_spec_misses(cli, tmp_path):
    pipeline = _write(tmp_path)
    pre, late = tmp_path / "pre.vmfb", tmp_path / "late.vmfb"
    result = cli("compile", "program.mlir", "-o", pre, "--preprocess", pipeline, "--depfile", tmp_path / "pre.d", cwd=tmp_path)
    assert result.returncode == 0, result
    assert str(tmp_path / "rewrite.pdl.mlir") in (tmp_path / "pre.d").read_text()
    assert cli("run", pre, *INPUTS, "--expect", "4xf32=3 3 3 3").returncode == 0  # 5 - 2
    # The same patterns as a --pdl-spec run after tosa is converted: they match nothing.
    assert cli("compile", tmp_path / "program.mlir", "-o", late, "--pdl-spec", tmp_path / "rewrite.pdl.mlir").returncode == 0
    assert cli("run", late, *INPUTS, "--expect", "4xf32=7 7 7 7").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.vmfb", "pre.d", "pre.vmfb", "program.mlir", "rewrite.pdl.mlir"]


def test_an_edited_pattern_file_is_a_cache_miss(cli, tmp_path):
    pipeline = _write(tmp_path)
    out = tmp_path / "m.vmfb"
    assert cli("compile", "program.mlir", "-o", out, "--preprocess", pipeline, cwd=tmp_path).returncode == 0
    _write(tmp_path, op="maximum")
    result = cli("compile", "program.mlir", "-o", out, "--preprocess", pipeline, cwd=tmp_path)
    assert result.returncode == 0 and "cache hit" not in result.output, result
    assert cli("run", out, *INPUTS, "--expect", "4xf32=5 5 5 5").returncode == 0


def test_bad_pipelines_are_clean_errors(cli, tmp_path):
    _write(tmp_path)
    missing = cli(
        "compile",
        "program.mlir",
        "-o",
        "m.vmfb",
        "--preprocess",
        "builtin.module(iree-preprocessing-apply-pdl-patterns{patterns-file=gone.pdl.mlir})",
        cwd=tmp_path,
    )
    assert_clean_error(missing, "gone.pdl.mlir", "--preprocess pipeline")
    unknown = cli("compile", "program.mlir", "-o", "m.vmfb", "--preprocess", "builtin.module(no-such-pass)", cwd=tmp_path)
    assert_clean_error(unknown, "iree-opt (--preprocess)")
    assert not (tmp_path / "m.vmfb").exists()


def test_cmake_preprocess(tmp_path):
    from support.cmake_projects import build, configure, ctest_run, write_project

    src, out = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    _write(src)
    body = """
pyree_iree_module(NAME m SRC program.mlir TARGET llvm-cpu
  PREPROCESS "builtin.module(iree-preprocessing-apply-pdl-patterns{patterns-file=${CMAKE_CURRENT_SOURCE_DIR}/rewrite.pdl.mlir})")
pyree_add_run_test(NAME m.run MODULE m FUNCTION combine INPUTS "4xf32=5" "4xf32=2" EXPECT "4xf32=3 3 3 3")
"""
    write_project(src, "preprocess", body, {})
    configure(src, out)
    build(out)
    assert ctest_run(out, "--output-on-failure").returncode == 0
    time.sleep(1.1)
    _write(src, op="maximum")  # the pattern file is a dependency: the module is rebuilt
    assert "pyree_build compile" in build(out)
    assert "no work to do" in build(out)
