"""Embedded objects: per-arch freestanding objects linked into a hermetic module."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from conftest import SAMPLES, assert_clean_error

from pyree_build.backends.llvm_cpu.elf import read_elf

EMBEDDED = SAMPLES / "custom_dispatch" / "cpu" / "embedded"
ARCHES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "riscv64": "EM_RISCV"}
EXPECTED = "8xf32=96 96 96 96 96 96 96 96"


def defined_functions(path: Path) -> set[str]:
    """Global functions an object defines (hidden visibility included: the module links them)."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        return {
            s.name for s in symtab.iter_symbols()
            if s["st_info"]["type"] == "STT_FUNC" and s["st_info"]["bind"] == "STB_GLOBAL" and s["st_shndx"] != "SHN_UNDEF"
        }  # fmt: skip


@pytest.fixture(scope="module")
def objects_dir(tmp_path_factory) -> Path:
    from conftest import run_cli

    out = tmp_path_factory.mktemp("embedded") / "objects"
    result = run_cli("objects", EMBEDDED / "functions.c", *(a for arch in ARCHES for a in ("--arch", arch)), "-o", out)
    assert result.returncode == 0, result
    return out


def test_one_freestanding_object_per_arch_with_the_right_machine(objects_dir):
    assert sorted(p.name for p in objects_dir.iterdir()) == sorted(f"functions_{a}.o" for a in ARCHES)
    for arch, machine in ARCHES.items():
        info = read_elf(objects_dir / f"functions_{arch}.o")
        assert info.machine == machine and info.elf_type == "ET_REL"
        assert info.undefined == ()
        assert {"simple_mul_workgroup", "simple_mul_inplace_workgroup"} <= defined_functions(objects_dir / f"functions_{arch}.o")


def test_undefined_symbols_are_rejected_unless_allowed(cli, tmp_path):
    src = tmp_path / "needs.c"
    src.write_text("float host_scale(float);\nvoid f(float* x) { x[0] = host_scale(x[0]); }\n")
    result = cli("objects", src, "--arch", "x86_64", "--arch", "aarch64", "-o", tmp_path / "out")
    assert_clean_error(result, "undefined symbols: host_scale", "--allow-undefined")
    assert not list((tmp_path / "out").glob("*.o"))
    result = cli("objects", src, "--arch", "x86_64", "--allow-undefined", "host_scale", "-o", tmp_path / "out")
    assert result.returncode == 0, result
    assert read_elf(tmp_path / "out" / "needs_x86_64.o").undefined == ("host_scale",)


def test_module_runs_without_a_plugin_and_after_the_objects_are_deleted(cli, objects_dir, tmp_path):
    objects = tmp_path / "objects"
    shutil.copytree(objects_dir, objects)
    vmfb = tmp_path / "embedded.vmfb"
    assert cli("compile", EMBEDDED / "example.mlir", "--object-search-path", objects, "-o", vmfb).returncode == 0
    shutil.rmtree(objects)
    for device in ("local-sync", "local-task"):
        result = cli("run", vmfb, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4",
                     "--device", device, "--expect", EXPECTED)  # fmt: skip
        assert result.returncode == 0, result


def test_a_missing_object_is_named_with_every_path_tried(cli, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    out = tmp_path / "x.vmfb"
    result = cli("compile", EMBEDDED / "example.mlir", "--object-search-path", first, "--object-search-path", second, "-o", out)
    assert_clean_error(result, "object 'functions_x86_64.o' not found", str(first / "functions_x86_64.o"), str(second / "functions_x86_64.o"))
    assert not out.exists()


def test_cmake_rebuilds_the_module_when_the_c_changes(tmp_path):
    from support.cmake_projects import build, configure, ctest_run, write_project

    src, out = tmp_path / "src", tmp_path / "build"
    write_project(
        src, "embedded_downstream",
        "pyree_cpu_objects(NAME functions SRCS functions.c ARCHS x86_64 aarch64 riscv64)\n"
        "pyree_iree_module(NAME example SRC example.mlir TARGET llvm-cpu DEPENDS functions)\n"
        'pyree_add_run_test(NAME run MODULE example FUNCTION mixed_invocation INPUTS "8xf32=2" "8xf32=4" '
        f'EXPECT "{EXPECTED}")\n',
        {"functions.c": EMBEDDED / "functions.c", "example.mlir": EMBEDDED / "example.mlir"},
    )  # fmt: skip
    configure(src, out)
    build(out)
    assert "no work to do" in build(out)
    time.sleep(1.1)
    # Now the custom mul adds 1: p = 9, s = 13, result = 13 * 9 = 117.
    (src / "functions.c").write_text(
        (EMBEDDED / "functions.c")
        .read_text()
        .replace(
            "out[out_offset + i] = lhs[lhs_offset + i] * rhs[rhs_offset + i];",
            "out[out_offset + i] = lhs[lhs_offset + i] * rhs[rhs_offset + i] + 1.0f;",
        )
    )
    log = build(out)
    assert "pyree_build objects" in log and "pyree_build compile" in log, log
    result = ctest_run(out, "--output-on-failure")
    assert result.returncode != 0 and "117" in result.stdout, result.stdout  # the module now computes with the edited C
