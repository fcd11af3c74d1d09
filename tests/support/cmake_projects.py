"""Shared by the tests: cmake_run, ctest_run, DOWNSTREAM_PLUGIN, DOWNSTREAM_CMAKE, write_downstream, write_project, configure, build (once in test_cmake.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from conftest import PLUGIN_SAMPLE

from pyree_build.cli import cmake_dir
from pyree_build.core import toolchain


def cmake_run(*args: str | os.PathLike[str], cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*toolchain.cmake().argv, *map(os.fspath, args)], cwd=cwd, capture_output=True, text=True, env=env)


def ctest_run(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*toolchain.ctest().argv, "--test-dir", str(build), *args], capture_output=True, text=True)


DOWNSTREAM_PLUGIN = r"""
#include "iree/hal/local/executable_plugin.h"
#include "scale.h"

typedef struct { const float* lhs; size_t lhs_offset; const float* rhs; size_t rhs_offset;
                 float* out; size_t out_offset; size_t count; size_t workgroup;
                 uint32_t processor_id; const uint64_t* processor_data; } args_t;

static int simple_mul_workgroup(void* params, void* context, void* reserved) {
  (void)context; (void)reserved;
  const args_t* a = (const args_t*)params;
  for (size_t i = 0; i < a->count; ++i)
    a->out[a->out_offset + i] = SCALE * a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i];
  return 0;
}

static iree_hal_executable_plugin_status_t load(const iree_hal_executable_plugin_environment_v0_t* e,
    size_t n, const iree_hal_executable_plugin_string_pair_t* p, void** out_self) {
  (void)e; (void)n; (void)p; *out_self = NULL; return iree_hal_executable_plugin_ok_status();
}
static void unload(void* self) { (void)self; }
static iree_hal_executable_plugin_status_t resolve(void* self,
    const iree_hal_executable_plugin_resolve_params_v0_t* params, iree_hal_executable_plugin_resolution_t* out) {
  (void)self; *out = 0; int missing = 0;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue;
    if (iree_hal_executable_plugin_strcmp(params->symbol_names[i], "simple_mul_workgroup") == 0) {
      params->out_fn_ptrs[i] = (void*)simple_mul_workgroup; params->out_fn_contexts[i] = NULL;
    } else { missing = 1; }
  }
  return missing ? iree_hal_executable_plugin_status_from_code(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND)
                 : iree_hal_executable_plugin_ok_status();
}

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version, void* reserved) {
  (void)reserved;
  static const iree_hal_executable_plugin_header_t header = {
      IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST, "downstream", "test", 0, IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND, {0}};
  static const iree_hal_executable_plugin_v0_t plugin = {&header, load, unload, resolve};
  return max_version <= IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST ? (const iree_hal_executable_plugin_header_t**)&plugin : NULL;
}
"""

DOWNSTREAM_CMAKE = """
cmake_minimum_required(VERSION 3.21)
project(downstream LANGUAGES NONE)
find_package(pyree_build CONFIG REQUIRED)
enable_testing()
pyree_cpu_plugin(NAME my_plugin SYSTEM SRCS plugin.c INCLUDE_DIRS include)
pyree_iree_module(NAME my_module SRC program.mlir TARGET llvm-cpu FLAGS --mlir-print-op-on-diagnostic=false)
pyree_add_run_test(NAME my_test MODULE my_module FUNCTION mixed_invocation
                   INPUTS "8xf32=2" "8xf32=4" PLUGINS my_plugin
                   EXPECT "8xf32=@EXPECTED@")
"""


def write_downstream(root: Path, scale: int = 3) -> None:
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "include" / "scale.h").write_text(f"#define SCALE {scale}.0f\n")
    (root / "plugin.c").write_text(DOWNSTREAM_PLUGIN)
    (root / "program.mlir").write_text((PLUGIN_SAMPLE / "example.mlir").read_text())
    expected = " ".join([str(2 * 4 * scale + 4)] * 8)
    (root / "CMakeLists.txt").write_text(DOWNSTREAM_CMAKE.replace("@EXPECTED@", expected))


def write_project(root: Path, name: str, body: str, files: dict[str, Path]) -> None:
    """A downstream CMake project: `files` copied in, `body` after find_package/enable_testing."""
    root.mkdir(parents=True, exist_ok=True)
    for dest, source in files.items():
        (root / dest).write_bytes(source.read_bytes())
    (root / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.21)\nproject({name} LANGUAGES NONE)\nfind_package(pyree_build CONFIG REQUIRED)\nenable_testing()\n" + body
    )


def configure(src: Path, build: Path, *, pass_python: bool = True, extra: Sequence[str] = ()) -> None:
    args = ["-G", "Ninja", "-S", src, "-B", build, f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}", f"-Dpyree_build_DIR={cmake_dir()}", *extra]
    if pass_python:
        args.append(f"-DPYREE_BUILD_PYTHON={sys.executable}")
    result = cmake_run(*args)
    assert result.returncode == 0, result.stdout + result.stderr


def build(build_dir: Path, target: str = "iree-sample-deps") -> str:
    result = cmake_run("--build", build_dir, "--target", target, "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
