"""Tool discovery and the installed package layout (header, CMake config)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pyree_build.core import toolchain
from pyree_build.core.errors import PyreeError


@pytest.mark.parametrize(
    "finder", [toolchain.iree_compile, toolchain.iree_lld, toolchain.iree_run_module, toolchain.iree_benchmark_module, lambda: toolchain.c_compiler("zig")]
)
def test_required_tools_are_found_with_a_version(finder):
    tool = finder()
    assert tool.path.is_file()
    assert os.access(tool.path, os.X_OK)
    assert tool.version and tool.version != "unknown"


def test_iree_tools_come_from_the_pinned_wheels():
    assert toolchain.iree_compile().version.startswith("3.13.")
    assert toolchain.iree_run_module().version.startswith("3.13.")


def test_iree_lld_is_found_although_it_is_not_on_path():
    lld = toolchain.iree_lld()
    assert lld.path.name == "iree-lld"
    assert "_mlir_libs" in str(lld.path)


def test_unknown_c_compiler_is_a_clear_error():
    with pytest.raises(PyreeError) as info:
        toolchain.c_compiler("tcc")
    assert "unknown C compiler" in info.value.what
    assert "zig" in (info.value.fix or "")


def test_gcc_found_when_present():
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed on this machine")
    assert toolchain.c_compiler("gcc").version[0].isdigit()


def test_doctor_lists_tools_and_gpu_status(cli):
    result = cli("doctor")
    assert result.returncode == 0, result
    for name in ("iree-compile", "iree-lld", "iree-run-module", "iree-benchmark-module", "zig cc", "cmake", "cuda GPU"):
        assert name in result.stdout
    assert "3.13" in result.stdout


def test_include_dir_holds_the_plugin_header(cli):
    result = cli("--include-dir")
    assert result.returncode == 0, result
    header = Path(result.stdout.strip()) / "iree" / "hal" / "local" / "executable_plugin.h"
    assert header.is_file()
    assert "iree_hal_executable_plugin_query_fn_t" in header.read_text()


def test_cmake_dir_holds_the_package_config(cli):
    result = cli("--cmake-dir")
    assert result.returncode == 0, result
    config = Path(result.stdout.strip())
    assert (config / "pyree_buildConfig.cmake").is_file()
    assert (config / "PyreeBuildFunctions.cmake").is_file()


def test_no_verb_prints_help_and_fails(cli):
    result = cli()
    assert result.returncode == 2
    assert "plugin" in result.stdout and "compile" in result.stdout


def test_extra_flags_only_for_compile(cli, tmp_path):
    result = cli("run", tmp_path / "x.vmfb", "--function", "f", "--", "--bogus")
    assert result.returncode != 0
    assert "only `compile` and `dump` take them" in result.stderr


def test_wheel_versions_are_read_without_importing_importlib_metadata():
    """Every verb reads the IREE and zig wheel versions; the fast path (the dist-info
    directory's name) must find them, or each verb pays for importlib.metadata."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pyree_build.core import toolchain\n"
        "versions = [toolchain._dist_version(d) for d in ('iree-base-compiler', 'iree-base-runtime', 'ziglang')]\n"
        "assert all(versions), versions\n"
        "assert 'importlib.metadata' not in sys.modules\n"
        "print(versions)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "3.13" in result.stdout
