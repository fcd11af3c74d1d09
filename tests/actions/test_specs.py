"""Transform / PDL specs on compile and dump: passed to iree-compile, keyed by content, in the depfile."""

from __future__ import annotations

import json
import shutil

from conftest import SAMPLES, assert_clean_error

MLP = SAMPLES / "custom_dispatch" / "cpu" / "mlp_plugin"
PROGRAM = MLP / "mlp.mlir"
SPEC = MLP / "matmul_relu_spec.mlir"
IMPORT = b"fused_matmul_relu"


def test_transform_spec_replaces_the_matched_ops_and_is_in_the_depfile(cli, tmp_path):
    out, plain = tmp_path / "mlp.vmfb", tmp_path / "plain.vmfb"
    result = cli("compile", PROGRAM, "-o", out, "--transform-spec", SPEC, "--depfile", tmp_path / "mlp.d")
    assert result.returncode == 0, result
    assert IMPORT in out.read_bytes()
    assert str(SPEC) in (tmp_path / "mlp.d").read_text()
    assert cli("compile", PROGRAM, "-o", plain).returncode == 0
    assert IMPORT not in plain.read_bytes()


def test_an_edited_spec_is_a_cache_miss(cli, tmp_path):
    spec = tmp_path / "spec.mlir"
    shutil.copy(SPEC, spec)
    out = tmp_path / "mlp.vmfb"
    assert cli("compile", PROGRAM, "-o", out, "--transform-spec", spec).returncode == 0
    assert IMPORT in out.read_bytes()
    # Same path, same flags, different bytes: the matcher now looks for min, which the
    # program does not contain, so nothing is replaced. A stale cache hit would keep the import.
    spec.write_text(spec.read_text().replace("arith.maximumf %v, %zero", "arith.minimumf %v, %zero"))
    result = cli("compile", PROGRAM, "-o", out, "--transform-spec", spec)
    assert result.returncode == 0, result
    assert "cache hit" not in result.output
    assert IMPORT not in out.read_bytes()


def test_a_missing_spec_is_a_clean_error(cli, tmp_path):
    result = cli("compile", PROGRAM, "-o", tmp_path / "x.vmfb", "--pdl-spec", tmp_path / "nope.mlir")
    assert_clean_error(result, "PDL spec", "nope.mlir")
    assert not (tmp_path / "x.vmfb").exists()


def test_dump_takes_the_spec_search_paths_and_pass_through_flags(cli, tmp_path):
    out = tmp_path / "dumped"
    result = cli("dump", PROGRAM, "-o", out, "--transform-spec", SPEC, "--object-search-path", tmp_path, "--", "--iree-llvmcpu-target-cpu=generic")
    assert result.returncode == 0, result
    names = [e["name"] for e in json.loads((out / "index.json").read_text())]
    assert any("matmul_relu_executable" in n for n in names), names
    bad = cli("dump", PROGRAM, "-o", tmp_path / "d2", "--object-search-path", tmp_path / "missing")
    assert_clean_error(bad, "object search path is not a directory")


def test_only_compile_and_dump_take_pass_through_flags(cli, tmp_path):
    result = cli("run", tmp_path / "m.vmfb", "--function", "f", "--", "--x")
    assert result.returncode != 0
    assert "only `compile` and `dump` take them" in result.stderr


def test_cmake_transform_spec_rebuilds_on_edit_and_expect_imports_fails_the_build(tmp_path):
    import time

    from support.cmake_projects import cmake_run, configure, write_project

    src, out = tmp_path / "src", tmp_path / "build"
    body = "pyree_iree_module(NAME m SRC mlp.mlir TARGET llvm-cpu TRANSFORM_SPEC spec.mlir EXPECT_IMPORTS fused_matmul_relu)\n"
    write_project(src, "specs", body, {"mlp.mlir": PROGRAM, "spec.mlir": SPEC})
    configure(src, out)
    first = cmake_run("--build", out)
    assert first.returncode == 0, first.stdout + first.stderr
    assert IMPORT in (out / "m.vmfb").read_bytes()
    time.sleep(1.1)
    spec = src / "spec.mlir"
    spec.write_text(spec.read_text().replace("arith.maximumf %v, %zero", "arith.minimumf %v, %zero"))
    second = cmake_run("--build", out)
    assert second.returncode != 0
    assert "does not call import 'fused_matmul_relu'" in second.stdout + second.stderr
    assert not (out / "m.vmfb").exists()
