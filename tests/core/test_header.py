"""The shipped plugin ABI header: self-contained, freestanding, and with IREE's layout."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from pyree_build.core import toolchain

# Every public name of the ABI used once, as a plugin written against IREE's header would.
USES_EVERY_NAME = r"""
#include "iree/hal/local/executable_plugin.h"

#define CHECK(cond) _Static_assert(cond, #cond)
CHECK(IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1 == 1u);
CHECK(IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST == IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1);
CHECK(IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_NONE == 0 && IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE == 1 &&
      IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_FULL_STATUS == 2);
CHECK(IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE == 0 && IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_ADDRESS == 1 &&
      IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_MEMORY == 2 && IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_THREAD == 3 &&
      IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_UNDEFINED == 4);
CHECK(IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND == IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE);
CHECK(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK == 0 && IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND == 5 &&
      IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNAVAILABLE == 14 && IREE_HAL_EXECUTABLE_PLUGIN_STATUS_DEFERRED == 17 &&
      IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK == 0x1F);
CHECK(IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_MALLOC == 0 && IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_FREE == 3);
CHECK(IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL == 1);
CHECK(sizeof(iree_host_size_t) == sizeof(size_t));
#if __SIZEOF_POINTER__ == 8
CHECK(sizeof(iree_hal_executable_plugin_header_t) == 96);
CHECK(offsetof(iree_hal_executable_plugin_header_t, name) == 8);
CHECK(offsetof(iree_hal_executable_plugin_header_t, features) == 24);
CHECK(offsetof(iree_hal_executable_plugin_header_t, sanitizer) == 28);
CHECK(offsetof(iree_hal_executable_plugin_header_t, reserved) == 32);
CHECK(sizeof(iree_hal_executable_plugin_v0_t) == 32);
CHECK(offsetof(iree_hal_executable_plugin_v0_t, resolve) == 24);
CHECK(sizeof(iree_hal_executable_plugin_resolve_params_v0_t) == 32);
CHECK(offsetof(iree_hal_executable_plugin_resolve_params_v0_t, out_fn_contexts) == 24);
CHECK(sizeof(iree_hal_executable_plugin_allocator_t) == 16);
CHECK(sizeof(iree_hal_executable_plugin_environment_v0_t) == 16);
CHECK(sizeof(iree_hal_executable_plugin_string_view_t) == 16);
CHECK(sizeof(iree_hal_executable_plugin_string_pair_t) == 32);
#endif

static iree_hal_executable_plugin_status_t use_all(
    const iree_hal_executable_plugin_environment_v0_t* env,
    const iree_hal_executable_plugin_string_pair_t* pair,
    const iree_hal_executable_plugin_resolve_params_v0_t* params) {
  void* p = NULL;
  iree_hal_executable_plugin_status_t s = iree_hal_executable_plugin_allocator_malloc(env->host_allocator, 16, &p);
  if (!iree_hal_executable_plugin_status_is_ok(s)) return s;
  iree_hal_executable_plugin_allocator_free(env->host_allocator, p);
  iree_hal_executable_plugin_resolution_t r = 0;
  if (iree_hal_executable_plugin_import_is_optional(params->symbol_names[0])) r |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
  if (iree_hal_executable_plugin_strcmp(pair->key.data, pair->first.data) != 0 || pair->value.size != pair->second.size) {
    return iree_hal_executable_plugin_status_from_code(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INVALID_ARGUMENT);
  }
  (void)r;
  return iree_hal_executable_plugin_ok_status();
}

static const iree_hal_executable_plugin_header_t header = {
    IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST, "n", "d", IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE,
    IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND, {0}};

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t** iree_hal_executable_plugin_query(
    iree_hal_executable_plugin_version_t max_version, void* reserved) {
  static iree_hal_executable_plugin_query_fn_t self_check = iree_hal_executable_plugin_query;
  (void)self_check; (void)reserved; (void)use_all;
  static const iree_hal_executable_plugin_header_t* const plugin[1] = {&header};
  return max_version >= IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1 ? (const iree_hal_executable_plugin_header_t**)plugin : NULL;
}
"""


@pytest.mark.parametrize("arch", ["x86_64", "aarch64", "riscv64"])
def test_header_compiles_freestanding_for_every_arch(tmp_path, arch):
    src = tmp_path / "uses.c"
    src.write_text(USES_EVERY_NAME)
    zig = toolchain.c_compiler("zig")
    cmd = zig.command(
        "-target", f"{arch}-freestanding-none", "-std=c11", "-ffreestanding", "-Wall", "-Wextra", "-Werror",
        "-I", toolchain.include_dir(), "-c", src, "-o", tmp_path / "uses.o",
    )  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_header_compiles_as_cxx(tmp_path):
    src = tmp_path / "uses.cc"
    src.write_text('#include "iree/hal/local/executable_plugin.h"\nint main() { return IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK; }\n')
    zig = toolchain.c_compiler("zig")
    cmd = [zig.argv[0], "c++", "-std=c++17", "-Wall", "-Werror", "-I", str(toolchain.include_dir()), "-c", str(src), "-o", str(tmp_path / "uses.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_header_with_gcc_pedantic(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed on this machine")
    src = tmp_path / "uses.c"
    src.write_text(USES_EVERY_NAME)
    result = subprocess.run(
        ["gcc", "-std=c17", "-pedantic", "-Wall", "-Werror", "-I", str(toolchain.include_dir()), "-c", str(src), "-o", str(tmp_path / "u.o")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
