"""Standalone plugins: freestanding ELFs per arch, linked by iree-lld, checked by reading them,
packed into a FatELF the runtime loads; and the plugin search order."""

from __future__ import annotations

import pytest
from conftest import PLUGIN_SAMPLE, assert_clean_error

from pyree_build.backends.llvm_cpu import elf as elfcheck

ARCHES = ("x86_64", "aarch64", "riscv64")

STRUCT_COPY = r"""
#include "iree/hal/local/executable_plugin.h"
typedef struct { char bytes[4096]; } big_t;
void copy_big(big_t* dst, const big_t* src) { *dst = *src; }  /* the compiler emits memcpy */
extern void host_log(const char* message);                      /* a libc-style import */
IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t v, void* r) {
  (void)v; host_log("queried"); copy_big((big_t*)r, (const big_t*)r + 1); return NULL;
}
"""


@pytest.fixture(scope="module")
def standalone_sos(tmp_path_factory):
    from conftest import run_cli

    out = tmp_path_factory.mktemp("standalone") / "standalone_plugin.sos"
    args = [a for arch in ARCHES for a in ("--arch", arch)]
    result = run_cli("plugin", "--kind", "standalone", *args, PLUGIN_SAMPLE / "standalone_plugin.c", "-o", out)
    assert result.returncode == 0, result
    return out


@pytest.mark.parametrize("arch", ARCHES)
def test_single_arch_elf_is_checked_by_reading_it(cli, tmp_path, arch):
    out = tmp_path / f"plugin_{arch}.so"
    result = cli("plugin", "--kind", "standalone", "--arch", arch, PLUGIN_SAMPLE / "standalone_plugin.c", "-o", out)
    assert result.returncode == 0, result
    info = elfcheck.check_plugin_elf(out, arch=arch, standalone=True)
    assert info.machine == elfcheck.ELF_MACHINES[arch]
    assert info.elf_class == 64 and info.little_endian
    assert info.undefined == ()
    assert elfcheck.QUERY_EXPORT in info.defined_exports
    assert elfcheck.is_standalone_elf(out)
    assert not [p for p in tmp_path.iterdir() if p != out]  # intermediates are not left beside the output


def test_undefined_symbols_are_named_and_explained(cli, tmp_path):
    src = tmp_path / "imports.c"
    src.write_text(STRUCT_COPY)
    out = tmp_path / "bad.so"
    result = cli("plugin", "--kind", "standalone", "--arch", "x86_64", src, "-o", out)
    assert_clean_error(result, "bad.so (x86_64)", "undefined symbols", "memcpy", "host_log", "struct copy", "libc")
    assert not out.exists()


def test_unknown_arch_is_a_clear_error(cli, tmp_path):
    result = cli("plugin", "--kind", "standalone", "--arch", "mips", PLUGIN_SAMPLE / "standalone_plugin.c", "-o", tmp_path / "x.so")
    assert_clean_error(result, "unknown architecture 'mips'", "x86_64")


def test_system_kind_refuses_foreign_arch(cli, tmp_path):
    result = cli("plugin", "--kind", "system", "--arch", "riscv64", PLUGIN_SAMPLE / "system_plugin.c", "-o", tmp_path / "x.so")
    assert_clean_error(result, "this host only", "--kind standalone")


def test_fatelf_holds_every_arch_and_runs(cli, standalone_sos, system_module):
    from pyree_build.backends.llvm_cpu import fatelf

    records = fatelf.read(standalone_sos)
    assert sorted(r.arch for r in records) == sorted(ARCHES)
    assert all(r.offset % 4096 == 0 for r in records)
    for device in ("local-sync", "local-task"):
        result = cli(
            "run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4",
            "--plugin", standalone_sos, "--device", device, "--expect", "8xf32=12 12 12 12 12 12 12 12",
        )  # fmt: skip
        assert result.returncode == 0, result


def test_ukernel_program_with_the_fatelf(cli, standalone_sos, tmp_path):
    vmfb = tmp_path / "ukernel.vmfb"
    assert cli("compile", PLUGIN_SAMPLE / "ukernel_example.mlir", "-o", vmfb).returncode == 0
    result = cli(
        "run", vmfb, "--function", "ukernel_example", "--input", "8xf32=2", "--input", "8xf32=4",
        "--plugin", standalone_sos, "--expect", "8xf32=8 8 8 8 8 8 8 8",
    )  # fmt: skip
    assert result.returncode == 0, result


@pytest.fixture(scope="module")
def fallback_setup(tmp_path_factory):
    from conftest import run_cli

    d = tmp_path_factory.mktemp("fallback")
    src = PLUGIN_SAMPLE / "fallback_plugin.c"
    assert run_cli("plugin", "--kind", "standalone", src, "-o", d / "fallback.so").returncode == 0
    r = run_cli("plugin", "--kind", "standalone", src, "-o", d / "override.so", "-D", 'PLUGIN_NAME="override"', "-D", "MUL_SCALE=10.0f", "-D", "PROVIDE_ADD=0")
    assert r.returncode == 0, r
    assert run_cli("compile", PLUGIN_SAMPLE / "fallback_example.mlir", "-o", d / "fallback.vmfb").returncode == 0
    return d


@pytest.mark.parametrize(
    ("order", "expected"),
    [(("fallback", "override"), "84"), (("override", "fallback"), "12"), (("fallback",), "12")],
)
def test_later_plugin_wins_and_earlier_fills_the_rest(cli, fallback_setup, order, expected):
    d = fallback_setup
    plugins = [a for name in order for a in ("--plugin", d / f"{name}.so")]
    result = cli(
        "run",
        d / "fallback.vmfb",
        "--function",
        "fallback_invocation",
        "--input",
        "8xf32=2",
        "--input",
        "8xf32=4",
        *plugins,
        "--expect",
        "8xf32=" + " ".join([expected] * 8),
    )
    assert result.returncode == 0, result


def test_override_alone_leaves_an_import_unresolved(cli, fallback_setup):
    d = fallback_setup
    result = cli("run", d / "fallback.vmfb", "--function", "fallback_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--plugin", d / "override.so")
    assert result.returncode != 0
    # Checked before running: the message names the import and the plugin that was asked.
    assert "no plugin resolves import 'simple_add_workgroup'" in result.stderr
    assert "override.so" in result.stderr
