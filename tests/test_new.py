"""`pyree-build new`: a downstream project that builds and passes its ctest as written,
with plain CMake and with scikit-build-core (found through the cmake.prefix entry point)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
from conftest import assert_clean_error

from pyree_build.cli import cmake_dir

pytestmark = pytest.mark.slow


def test_new_project_builds_and_passes_its_test(cli, tmp_path):
    from test_cmake import build, configure, ctest_run

    project = tmp_path / "my_kernels"
    result = cli("new", project)
    assert result.returncode == 0, result
    assert sorted(p.name for p in project.iterdir()) == ["CMakeLists.txt", "README.md", "plugin.c", "program.mlir", "pyproject.toml"]
    configure(project, tmp_path / "build")
    build(tmp_path / "build")
    result = ctest_run(tmp_path / "build", "--output-on-failure")
    assert result.returncode == 0 and "100% tests passed" in result.stdout, result.stdout


def test_new_refuses_a_non_empty_directory(cli, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert_clean_error(cli("new", tmp_path / "taken"), "directory is not empty", "--force")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_scikit_build_core_finds_pyree_build_without_flags(cli, tmp_path):
    pytest.importorskip("scikit_build_core")
    if "site-packages" not in str(cmake_dir()):
        pytest.skip("pyree_build is installed editable here; the cmake.prefix entry point needs a wheel install (as in CI)")
    project = tmp_path / "wheel_project"
    assert cli("new", project).returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", tmp_path / "dist", project],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("wheel_project-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "wheel_project/wheel_project_plugin.so" in names and "wheel_project/wheel_project_program.vmfb" in names, names


def test_new_with_an_import_generates_matching_c_and_mlir_that_build_and_pass(cli, tmp_path):
    from test_cmake import build, configure, ctest_run

    project = tmp_path / "axpy"
    result = cli("new", project, "--import", "my_axpy", "--args", "in:f32,inout:f32,out:i32")
    assert result.returncode == 0, result
    c_text, mlir_text = (project / "plugin.c").read_text(), (project / "program.mlir").read_text()
    assert "} my_axpy_args_t;" in c_text and '"my_axpy"' in c_text
    assert "func.func private @my_axpy(memref<f32>, index, memref<f32>, index, memref<i32>, index, index)" in mlir_text
    assert "llvm.bareptr = true" in mlir_text
    configure(project, tmp_path / "build")
    build(tmp_path / "build")
    result = ctest_run(tmp_path / "build", "--output-on-failure")
    assert result.returncode == 0 and "100% tests passed" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--import", "op", "--args", "in:f32,in:f32"], "no out or inout"),
        (["--import", "op", "--args", "in:f64,out:f32"], "--args item 1 'in:f64': f64 is not supported"),
        (["--import", "1op", "--args", "out:f32"], "cannot name an import"),
        (["--import", "op"], "--import and --args go together"),
    ],
)
def test_new_with_a_bad_import_says_what_to_write(cli, tmp_path, args, fragment):
    result = cli("new", tmp_path / "p", *args)
    assert_clean_error(result, fragment)
    assert not (tmp_path / "p").exists()


def test_stdio_in_a_standalone_plugin_gets_a_hint_to_use_a_system_plugin(cli, tmp_path):
    src = tmp_path / "p.c"
    src.write_text('#include <stdio.h>\nint f(void) { return printf("x"); }\n')
    result = cli("plugin", "--kind", "standalone", src, "-o", tmp_path / "p.so")
    assert_clean_error(result, "'stdio.h' file not found", "<stdio.h> is part of libc", "--kind system")
