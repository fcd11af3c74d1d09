"""IREE's names work as written: arm_64 / arm64 for aarch64, objects named with the spelling
the program uses, and pyree_cpu_objects(OUTPUT_DIR) for a program's relative object paths."""

from __future__ import annotations

from conftest import SAMPLES, assert_clean_error

from pyree_build.backends.llvm_cpu.elf import normalize_arch, read_elf

EMBEDDED = SAMPLES / "custom_dispatch" / "cpu" / "embedded"


def test_arm64_spellings_are_aarch64():
    assert normalize_arch("arm64") == normalize_arch("arm_64") == normalize_arch("aarch64") == "aarch64"


def test_objects_are_named_with_the_arch_as_written(cli, tmp_path):
    result = cli("objects", EMBEDDED / "functions.c", "--arch", "x86_64", "--arch", "arm_64", "-o", tmp_path)
    assert result.returncode == 0, result
    assert read_elf(tmp_path / "functions_arm_64.o").machine == "EM_AARCH64"
    assert not (tmp_path / "functions_aarch64.o").exists()


def test_a_missing_object_under_another_arch_spelling_is_pointed_at(cli, tmp_path):
    objects = tmp_path / "objects"
    assert cli("objects", EMBEDDED / "functions.c", "--arch", "aarch64", "-o", objects).returncode == 0
    program = tmp_path / "program.mlir"
    program.write_text((EMBEDDED / "example.mlir").read_text().replace("functions_aarch64.o", "functions_arm_64.o"))
    result = cli("compile", program, "-o", tmp_path / "m.vmfb", "--object-search-path", objects,
                 "--", "--iree-llvmcpu-target-triple=aarch64-unknown-linux-gnu")  # fmt: skip
    assert_clean_error(result, "object 'functions_arm_64.o' not found", "found functions_aarch64.o", "--arch arm_64")


def test_cmake_objects_output_dir_and_iree_arch_names(tmp_path):
    from support.cmake_projects import build, configure, ctest_run, write_project

    program = (EMBEDDED / "example.mlir").read_text().replace("functions_aarch64.o", "objs/functions_arm_64.o")
    program = program.replace('"functions_x86_64.o"', '"objs/functions_x86_64.o"')
    src, out = tmp_path / "src", tmp_path / "build"
    body = """
pyree_cpu_objects(NAME fns SRCS functions.c ARCHS x86_64 arm_64 OUTPUT_DIR objs)
# The program names objs/<file>: the binary dir is the search path that makes them resolve.
pyree_iree_module(NAME m SRC example.mlir TARGET llvm-cpu OBJECT_SEARCH_PATHS ${CMAKE_CURRENT_BINARY_DIR} DEPENDS fns)
pyree_add_run_test(NAME m.run MODULE m FUNCTION mixed_invocation INPUTS "8xf32=2" "8xf32=4" EXPECT "8xf32=96 96 96 96 96 96 96 96")
"""
    write_project(src, "arch_names", body, {"functions.c": EMBEDDED / "functions.c"})
    (src / "example.mlir").write_text(program)
    configure(src, out)
    build(out)
    assert read_elf(out / "objs" / "functions_arm_64.o").machine == "EM_AARCH64"
    result = ctest_run(out, "--output-on-failure")
    assert result.returncode == 0, result.stdout
