"""CMake end to end: the samples through `pyree-build samples`, ctest, rebuild rules, and a
downstream project that uses find_package(pyree_build)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from support.cmake_projects import build, cmake_run, configure, ctest_run, write_downstream

from pyree_build.cli import cmake_dir
from pyree_build.core import toolchain

pytestmark = pytest.mark.slow


def test_samples_main_job_builds_and_passes(cli, tmp_path):
    result = cli("samples", "--build-dir", tmp_path / "build", timeout=1200)
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["sample", "test", "result", "time"]
    rows = {line.split()[1]: line for line in lines[2:] if line.strip() and not line.startswith(" ")}
    for device in ("local-sync", "local-task"):
        row = rows[f"cpu_plugin.system.{device}"]
        assert "custom_dispatch/cpu/plugin" in row and "passed" in row
    for name, row in rows.items():
        if "cuda" in name:
            assert "passed" in row or "skipped:" in row, row
    assert "0 failed" in result.stdout


def test_downstream_project_builds_and_tests_its_own_plugin(tmp_path):
    src, out = tmp_path / "src", tmp_path / "build"
    write_downstream(src)
    configure(src, out)
    build(out)
    result = ctest_run(out, "--output-on-failure")
    assert result.returncode == 0, result.stdout
    assert "100% tests passed" in result.stdout
    assert (out / "my_plugin.so").is_file() and (out / "my_module.vmfb").is_file()


def test_rebuilds_when_a_header_source_or_mlir_changes_and_not_otherwise(tmp_path):
    src, out = tmp_path / "src", tmp_path / "build"
    write_downstream(src)
    configure(src, out)
    build(out)
    assert "no work to do" in build(out)

    time.sleep(1.1)  # coarse mtime filesystems
    write_downstream(src, scale=5)  # rewrites the included header, the .c, the .mlir
    log = build(out)
    assert "pyree_build plugin" in log and "pyree_build compile" in log, log
    assert "no work to do" in build(out)
    result = ctest_run(out, "--output-on-failure")  # CMakeLists.txt now expects 2*4*5+4 = 44
    assert result.returncode == 0, result.stdout

    time.sleep(1.1)
    (src / "include" / "scale.h").write_text("#define SCALE 5.0f\n/* comment only */\n")
    log = build(out)
    assert "pyree_build plugin" in log, log
    assert "pyree_build compile" not in log  # the module does not depend on the plugin's header


def test_find_package_discovers_python_without_hints(tmp_path):
    cfg = cmake_dir()
    if "site-packages" not in str(cfg):
        pytest.skip("pyree_build is not installed from a wheel here (editable or source checkout)")
    src, out = tmp_path / "src", tmp_path / "build"
    write_downstream(src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYREE_BUILD_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    result = cmake_run("-G", "Ninja", "-S", src, "-B", out, f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}", f"-Dpyree_build_DIR={cfg}", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    cache = (out / "CMakeCache.txt").read_text()
    assert f"PYREE_BUILD_PYTHON:FILEPATH={Path(sys.executable).parent}" in cache


def test_find_package_without_a_usable_python_says_what_to_do(tmp_path):
    src, out = tmp_path / "src", tmp_path / "build"
    write_downstream(src)
    result = cmake_run(
        "-G",
        "Ninja",
        "-S",
        src,
        "-B",
        out,
        f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}",
        f"-Dpyree_build_DIR={cmake_dir()}",
        "-DPYREE_BUILD_PYTHON=",
        "-DPython3_EXECUTABLE=/nonexistent",
        env={**{k: v for k, v in os.environ.items() if k != "PYREE_BUILD_PYTHON"}, "PATH": "/nonexistent"},
    )
    if result.returncode == 0:
        pytest.skip("an interpreter with pyree_build was still found through the install layout")
    assert "-DPYREE_BUILD_PYTHON=" in result.stderr


def test_without_pyree_build_dir_cmake_names_the_package_and_the_fix_is_in_the_docs(tmp_path):
    src = tmp_path / "src"
    write_downstream(src)
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith(("pyree_build", "cmake_prefix"))}
    result = cmake_run("-G", "Ninja", "-S", src, "-B", tmp_path / "build", f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}", env=env)
    assert result.returncode != 0
    assert "pyree_build" in result.stderr
    checkout = Path(__file__).resolve().parents[2]
    for page in ("README.md", "docs/cmake.md"):  # the README's CMake screen and the CMake reference
        assert '-Dpyree_build_DIR="$(pyree-build --cmake-dir)"' in (checkout / page).read_text(), page
