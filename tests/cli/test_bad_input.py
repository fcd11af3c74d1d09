"""Each user mistake: one clear message (file, what, fix), non-zero exit, no traceback, no output."""

from __future__ import annotations

import pytest
from conftest import PLUGIN_SAMPLE, assert_clean_error

NO_EXPORT = r"""
#include "iree/hal/local/executable_plugin.h"
int simple_mul_workgroup(void* params, void* context, void* reserved) { return 0; }
"""

NULL_FOR_RUNTIME_VERSION = r"""
#include "iree/hal/local/executable_plugin.h"
IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version, void* reserved) {
  (void)max_version; (void)reserved;
  return NULL;  /* pretends to need a newer ABI than the runtime's */
}
"""


def test_missing_source_file(cli, tmp_path):
    out = tmp_path / "p.so"
    result = cli("plugin", "--kind", "system", tmp_path / "nope.c", "-o", out)
    assert_clean_error(result, "nope.c", "C source not found")
    assert not out.exists()


def test_c_that_does_not_compile_shows_file_and_line(cli, tmp_path):
    src = tmp_path / "broken.c"
    src.write_text("int f(void) {\n  return undeclared_name;\n}\n")
    out = tmp_path / "p.so"
    result = cli("plugin", "--kind", "system", src, "-o", out)
    assert_clean_error(result, "broken.c:2:", "undeclared_name", "fix:")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]  # no intermediates left either


def test_plugin_without_query_export(cli, tmp_path):
    src = tmp_path / "no_export.c"
    src.write_text(NO_EXPORT)
    out = tmp_path / "p.so"
    result = cli("plugin", "--kind", "system", src, "-o", out)
    assert_clean_error(result, "does not export 'iree_hal_executable_plugin_query'", "IREE_HAL_EXECUTABLE_PLUGIN_EXPORT")
    assert not out.exists()


def test_plugin_rejecting_the_runtime_abi_version(cli, tmp_path):
    src = tmp_path / "too_new.c"
    src.write_text(NULL_FOR_RUNTIME_VERSION)
    out = tmp_path / "p.so"
    result = cli("plugin", "--kind", "system", src, "-o", out)
    assert_clean_error(result, "returned NULL", "ABI version 1")
    assert not out.exists()


def test_mlir_that_does_not_parse(cli, tmp_path):
    src = tmp_path / "bad.mlir"
    src.write_text("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %b = arith.bogus %a : tensor<4xf32>\n  return %b : tensor<4xf32>\n}\n")
    out = tmp_path / "bad.vmfb"
    result = cli("compile", src, "-o", out, "--target", "llvm-cpu")
    assert_clean_error(result, "bad.mlir:2:", "arith.bogus", "iree-compile")
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_missing_mlir_file(cli, tmp_path):
    result = cli("compile", tmp_path / "missing.mlir", "-o", tmp_path / "x.vmfb")
    assert_clean_error(result, "missing.mlir", "MLIR source not found")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("8xf32=1 2 3", "3 values for shape 8"),
        ("8xf33=1", "unknown element type 'f33'"),
        ("8xf32=", "no values after '='"),
        ("8xf32=1 two", "'two' is not a number"),
        ("8yf32=1", "is not SHAPExTYPE"),
        ("eight", "no '='"),
        ("@missing.npy", "missing.npy not found"),
        ("2x2xf32=[1 2][3 4", "unbalanced brackets"),
    ],
)
def test_malformed_input_spec(cli, system_module, spec, fragment):
    result = cli("run", system_module, "--function", "mixed_invocation", "--input", spec, "--input", "8xf32=4")
    assert_clean_error(result, "malformed input spec", fragment, "fix:")


def test_failed_expect_shows_expected_and_actual(cli, system_plugin, system_module):
    result = cli(
        "run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4",
        "--plugin", system_plugin, "--expect", "8xf32=13",
    )  # fmt: skip
    assert_clean_error(result, "output does not match", "expected (not found)", "8xf32=13", "actual output", "8xf32=12 12", "within one output line")


def test_missing_plugin_file(cli, system_module, tmp_path):
    result = cli("run", system_module, "--function", "mixed_invocation", "--plugin", tmp_path / "gone.so")
    assert_clean_error(result, "gone.so", "plugin not found")


def test_unwritable_output_directory(cli, tmp_path):
    import os

    if os.geteuid() == 0:
        target = "/proc/pyree_cannot_write_here/p.so"  # not writable even for root
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = str(locked / "p.so")
    result = cli("plugin", "--kind", "system", PLUGIN_SAMPLE / "system_plugin.c", "-o", target)
    assert_clean_error(result, "output directory", "fix:")
