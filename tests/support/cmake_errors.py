"""Shared by the tests: configure_project, FILES (once in test_cmake_validation.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import PLUGIN_SAMPLE, SAMPLES

from pyree_build.cli import cmake_dir
from pyree_build.core import toolchain
from support.cmake_projects import cmake_run, write_project

FILES = {
    "plugin.c": PLUGIN_SAMPLE / "system_plugin.c",
    "program.mlir": PLUGIN_SAMPLE / "example.mlir",
    "shader.glsl": SAMPLES / "custom_dispatch" / "vulkan" / "shaders" / "simple_mul.glsl",
    "kernels.cu": SAMPLES / "custom_dispatch" / "hip" / "kernels" / "kernels.cu",
}


def configure_project(tmp_path: Path, body: str):  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    write_project(src, "validation", body, FILES)
    return cmake_run(
        "-G", "Ninja", "-S", src, "-B", tmp_path / "build", f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}",
        f"-Dpyree_build_DIR={cmake_dir()}", f"-DPYREE_BUILD_PYTHON={sys.executable}",
    )  # fmt: skip
