"""`pyree-build new`: a downstream project that builds and passes its ctest as written,
with plain CMake and with scikit-build-core (found through the cmake.prefix entry point)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, assert_clean_error

from pyree_build.cli import cmake_dir

pytestmark = pytest.mark.slow


def test_new_project_builds_and_passes_its_test(cli, tmp_path):
    from support.cmake_projects import build, configure, ctest_run

    project = tmp_path / "my_kernels"
    result = cli("new", project)
    assert result.returncode == 0, result
    names = sorted(p.name for p in project.iterdir())
    assert names == [".pyree_build-written.json", "CMakeLists.txt", "README.md", "plugin.c", "program.mlir", "pyproject.toml", "src"]
    assert (project / "src" / "my_kernels" / "__init__.py").is_file()  # the wheel's loader
    configure(project, tmp_path / "build")
    build(tmp_path / "build")
    result = ctest_run(tmp_path / "build", "--output-on-failure")
    assert result.returncode == 0 and "100% tests passed" in result.stdout, result.stdout


def test_new_refuses_a_non_empty_directory(cli, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert_clean_error(cli("new", tmp_path / "taken"), "directory is not empty", "--force")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_new_force_replaces_only_the_files_new_wrote_and_the_user_left_unchanged(cli, tmp_path):
    project = tmp_path / "proj"
    assert cli("new", project).returncode == 0
    assert cli("new", project, "--force").returncode == 0  # its own, unchanged files: replaced
    (project / "README.md").write_text("my notes")
    cmake = (project / "CMakeLists.txt").read_text() + "# my target\n"
    (project / "CMakeLists.txt").write_text(cmake)
    plugin = (project / "plugin.c").read_text()
    result = cli("new", project, "--force")
    assert_clean_error(result, "2 file(s) in the way", "edited since pyree_build wrote them: CMakeLists.txt, README.md", "nothing was changed")
    assert "pass --force" not in result.stderr  # --force was given: the advice is to move the edits away
    assert (project / "README.md").read_text() == "my notes" and (project / "CMakeLists.txt").read_text() == cmake
    assert (project / "plugin.c").read_text() == plugin


def test_new_force_never_replaces_a_file_it_did_not_write(cli, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "README.md").write_text("mine")
    assert_clean_error(cli("new", tmp_path / "taken", "--force"), "not written by pyree_build: README.md")
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["README.md"]
    assert (tmp_path / "taken" / "README.md").read_text() == "mine"


def _fresh_venv(where: Path) -> Path:
    """A new virtual environment that sees this one's packages through a .pth path entry (not
    its .pth files, so not an editable install's finder) and installs into its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True)
    (Path(purelib.stdout.strip()) / "parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_wheel_builds_as_its_readme_says_and_its_loader_runs_the_program(cli, tmp_path):
    """The generated README's wheel block, run as written in a fresh venv where pyree_build is
    a wheel install (built here first when this one is editable, as in development)."""
    pytest.importorskip("scikit_build_core")
    python = _fresh_venv(tmp_path / "venv")
    if "site-packages" not in str(cmake_dir()):  # editable: give the venv a real install, as CI has
        pip = [python, "-m", "pip", "--disable-pip-version-check"]
        subprocess.run([*pip, "wheel", REPO, "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "wheels"], check=True)
        subprocess.run([*pip, "install", "--no-deps", "-q", *(tmp_path / "wheels").glob("pyree_build-*.whl")], check=True)
    project = tmp_path / "axpb_wheel"
    assert cli("new", project, "--import", "axpb", "--args", "in:f32,scalar:f32,scalar:f32,out:f32").returncode == 0
    block = re.search(r"## Build a wheel\n.*?```sh\n(.*?)```", (project / "README.md").read_text(), re.S)
    assert block, "no wheel block in the README"
    script = re.sub(r"^pip ", "python -m pip ", block[1], flags=re.M).replace("-w dist", f"-w dist -C build-dir={tmp_path / 'skbuild'}", 1)
    env = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = re.search(r"^# => (.*)$", block[1], re.M)
    assert expected and proc.stdout.strip().splitlines()[-1] == expected[1] == "[7.0, 9.0, 11.0, 13.0, 15.0, 7.0, 9.0, 11.0]", proc.stdout
    (wheel,) = (project / "dist").glob("axpb_wheel-*.whl")
    assert wheel.name == f"axpb_wheel-0.1.0-py3-none-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert {"axpb_wheel/__init__.py", "axpb_wheel/axpb_wheel_plugin.so", "axpb_wheel/axpb_wheel_program.vmfb"} <= set(names), names
    # Found through the cmake.prefix entry point of the venv's pyree_build (an install, not the source tree).
    venv_cmake_dir = subprocess.run([python, "-m", "pyree_build", "--cmake-dir"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert "site-packages" in venv_cmake_dir
    assert f"pyree_build_DIR:PATH={venv_cmake_dir}" in (tmp_path / "skbuild" / "CMakeCache.txt").read_text()


def test_new_with_an_import_generates_matching_c_and_mlir_that_build_and_pass(cli, tmp_path):
    from support.cmake_projects import build, configure, ctest_run

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
        (["--import", "1op", "--args", "out:f32"], "is not a C identifier"),
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
