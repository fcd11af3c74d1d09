"""Dump, substitution and microbenchmarks, with the real iree-compile and iree-benchmark-module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import SAMPLES, assert_clean_error

from pyree_build.actions import bench, executables

SAMPLE = SAMPLES / "substitution"
PROGRAM = SAMPLE / "program.mlir"
INPUTS = ["--input", "4x4xf32=1", "--input", "4x4xf32=2"]
ORIGINAL = "4x4xf32=[24 24 24 24][24 24 24 24][24 24 24 24][24 24 24 24]"
EDITED = "4x4xf32=[16 16 16 16][16 16 16 16][16 16 16 16][16 16 16 16]"


@pytest.fixture(scope="module")
def dumped(tmp_path_factory) -> Path:
    from conftest import run_cli

    out = tmp_path_factory.mktemp("dump") / "dumped"
    result = run_cli("dump", PROGRAM, "-o", out)
    assert result.returncode == 0, result
    assert "main_dispatch_0" in result.stdout and "main_dispatch_1" in result.stdout
    return out


def test_dump_writes_an_index_of_each_executable_and_its_files(dumped):
    index = json.loads((dumped / "index.json").read_text())
    assert [e["name"] for e in index] == ["main_dispatch_0", "main_dispatch_1"]
    for entry in index:
        assert entry["source"] == f"module_{entry['name']}.mlir"
        assert entry["binaries"] and entry["benchmarks"]
        for name in [entry["source"], *entry["binaries"], *entry["benchmarks"]]:
            assert (dumped / name).is_file(), name
    assert f"@{index[0]['name']}" in (dumped / index[0]["source"]).read_text()


def test_substitution_by_name_changes_the_result(cli, tmp_path):
    original, edited = tmp_path / "original.vmfb", tmp_path / "edited.vmfb"
    assert cli("compile", PROGRAM, "-o", original).returncode == 0
    result = cli("compile", PROGRAM, "-o", edited, "--substitute", f"main_dispatch_0={SAMPLE / 'main_dispatch_0_mul.mlir'}")
    assert result.returncode == 0, result
    assert cli("run", original, "--function", "main", *INPUTS, "--expect", ORIGINAL).returncode == 0
    assert cli("run", edited, "--function", "main", *INPUTS, "--expect", EDITED).returncode == 0


def test_substitution_from_a_directory_of_dumped_names(cli, dumped, tmp_path):
    edits = tmp_path / "edits"
    shutil.copytree(dumped, edits)
    source = edits / "module_main_dispatch_0.mlir"
    source.write_text(source.read_text().replace("arith.addf %in, %in_0", "arith.mulf %in, %in_0"))
    for other in edits.iterdir():  # keep the edit only; the other files are ignored anyway
        if other != source:
            other.unlink()
    out = tmp_path / "from_dir.vmfb"
    result = cli("compile", PROGRAM, "-o", out, "--substitute-from", edits)
    assert result.returncode == 0, result
    assert "substituting from" in result.stderr and "main_dispatch_0" in result.stderr
    assert cli("run", out, "--function", "main", *INPUTS, "--expect", EDITED).returncode == 0


def test_an_unknown_name_lists_the_executables_that_exist(cli, tmp_path):
    out = tmp_path / "x.vmfb"
    result = cli("compile", PROGRAM, "-o", out, "--substitute", f"main_dispatch_9={SAMPLE / 'main_dispatch_0_mul.mlir'}")
    assert_clean_error(result, "no executable named 'main_dispatch_9'", "main_dispatch_0, main_dispatch_1")
    assert not out.exists()


def test_object_substitution_on_llvm_cpu_is_refused_with_what_works(cli, dumped, tmp_path):
    binary = next(dumped.glob("*.so"))
    result = cli("compile", PROGRAM, "-o", tmp_path / "x.vmfb", "--substitute", f"main_dispatch_0={binary}")
    assert_clean_error(result, "not supported on llvm-cpu", "module_main_dispatch_0.mlir", "--target cuda")


def test_cuda_object_substitution_with_a_ptx_compiles_without_a_gpu(cli, tmp_path):
    out = tmp_path / "cuda.vmfb"
    result = cli("compile", PROGRAM, "-o", out, "--target", "cuda", "--sm", "80",
                 "--substitute", f"main_dispatch_0={SAMPLE / 'main_dispatch_0_mul_sm_80.ptx'}")  # fmt: skip
    assert result.returncode == 0, result
    assert b"edited: was add.rn.f32" in out.read_bytes()  # our PTX, not IREE's


def test_cuda_dump_writes_ptx(cli, tmp_path):
    result = cli("dump", PROGRAM, "-o", tmp_path / "cuda", "--target", "cuda")
    assert result.returncode == 0, result
    assert list((tmp_path / "cuda").glob("*.ptx"))


def test_bench_parses_a_real_run(tmp_path, cli):
    vmfb = tmp_path / "p.vmfb"
    assert cli("compile", PROGRAM, "-o", vmfb).returncode == 0
    result = bench.bench(vmfb, "main", inputs=["4x4xf32=1", "4x4xf32=2"], repetitions=3, min_time=0.02)
    (timing,) = result.timings
    assert "main" in timing.name and timing.repetitions == 3
    assert 0 < timing.median_ms < 100 and 0 < timing.mean_ms < 100
    printed = cli("bench", vmfb, "--function", "main", *INPUTS, "--repetitions", "2")
    assert printed.returncode == 0 and "median" in printed.stdout and "BM_main" in printed.stdout, printed


def test_bench_compare_prints_a_ratio(cli, tmp_path):
    a, b = tmp_path / "a.vmfb", tmp_path / "b.vmfb"
    assert cli("compile", PROGRAM, "-o", a).returncode == 0
    assert cli("compile", PROGRAM, "-o", b, "--substitute", f"main_dispatch_0={SAMPLE / 'main_dispatch_0_mul.mlir'}").returncode == 0
    result = cli("bench", "--compare", a, b, "--function", "main", *INPUTS, "--rounds", "2", "--repetitions", "2")
    assert result.returncode == 0, result
    ratio_line = next(line for line in result.stdout.splitlines() if line.startswith("B/A = "))
    assert 0.1 < float(ratio_line.split()[2]) < 10


def test_a_dumped_benchmark_compiles_and_benches(cli, dumped, tmp_path):
    source = next(dumped.glob("*dispatch_1*_benchmark.mlir"))
    vmfb = tmp_path / "bench.vmfb"
    assert cli("compile", source, "-o", vmfb).returncode == 0
    result = cli("bench", vmfb, "--repetitions", "2")
    assert result.returncode == 0 and "matmul" in result.stdout, result


def test_the_python_api_lists_executables():
    assert executables.executable_names(PROGRAM) == ["main_dispatch_0", "main_dispatch_1"]


def test_dump_replaces_an_earlier_dump_but_never_other_files(cli, dumped, tmp_path):
    again = tmp_path / "again"
    shutil.copytree(dumped, again)
    (again / "notes.txt").write_text("not from a dump")
    assert cli("dump", PROGRAM, "-o", again, "-q").returncode == 0
    assert (again / "notes.txt").read_text() == "not from a dump" and (again / "index.json").is_file()
    assert not [p for p in again.iterdir() if p.name.endswith(".build")]  # no staging left behind

    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    assert cli("dump", PROGRAM, "-o", precious, "-q").returncode == 0
    assert (precious / "notes.txt").read_text() == "keep me" and (precious / "index.json").is_file()

    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_clean_error(cli("dump", PROGRAM, "-o", a_file), "is a file, not a directory")
    assert a_file.read_text() == "x"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_substitution_mistakes_are_named(cli, tmp_path):
    edited = SAMPLE / "main_dispatch_0_mul.mlir"
    out = tmp_path / "x.vmfb"
    assert_clean_error(cli("compile", PROGRAM, "-o", out, "--substitute", str(edited)), "is not NAME=FILE")
    twice = tmp_path / "twice"
    twice.mkdir()
    shutil.copy(edited, twice / "module_main_dispatch_0.mlir")
    result = cli("compile", PROGRAM, "-o", out, "--substitute", f"main_dispatch_0={edited}", "--substitute-from", twice)
    assert_clean_error(result, "'main_dispatch_0' is substituted twice", str(edited))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "unrelated.mlir").write_text("// nothing")
    assert_clean_error(cli("compile", PROGRAM, "-o", out, "--substitute-from", empty), "no file in it names an executable",
                       "main_dispatch_0, main_dispatch_1")  # fmt: skip
    assert not out.exists()


def test_the_substituted_file_is_a_dependency(cli, tmp_path):
    edited = tmp_path / "edited.mlir"
    edited.write_text((SAMPLE / "main_dispatch_0_mul.mlir").read_text())
    out, dep = tmp_path / "m.vmfb", tmp_path / "m.vmfb.d"
    assert cli("compile", PROGRAM, "-o", out, "--depfile", dep, "--substitute", f"main_dispatch_0={edited}").returncode == 0
    assert str(edited) in dep.read_text()
    assert cli("run", out, "--function", "main", *INPUTS, "--expect", EDITED).returncode == 0
    # Edited again (mulf -> subf): the cache must not hand back the earlier module.
    edited.write_text(edited.read_text().replace("arith.mulf %in, %in_0", "arith.subf %in, %in_0"))
    assert cli("compile", PROGRAM, "-o", out, "--depfile", dep, "--substitute", f"main_dispatch_0={edited}").returncode == 0
    minus8 = "4x4xf32=[-8 -8 -8 -8][-8 -8 -8 -8][-8 -8 -8 -8][-8 -8 -8 -8]"  # 4 * (1 - 2) * 2
    assert cli("run", out, "--function", "main", *INPUTS, "--expect", minus8).returncode == 0


def test_bench_on_cuda_without_a_gpu_says_so(cli, tmp_path):
    from pyree_build.backends.cuda import target as cuda_target

    if cuda_target.cuda_status()[0]:
        pytest.skip("a CUDA GPU is usable here")
    module = tmp_path / "m.vmfb"
    module.write_bytes(b"not run")
    assert_clean_error(cli("bench", module, "--device", "cuda"), "device cuda is not usable")
    assert cli("bench", module, "--device", "cuda", "--skip-unavailable").returncode == 77


_CMAKE_PROJECT = """cmake_minimum_required(VERSION 3.21)
project(substitution_check LANGUAGES NONE)
find_package(pyree_build CONFIG REQUIRED)
enable_testing()
pyree_iree_module(NAME original SRC program.mlir TARGET llvm-cpu)
pyree_iree_module(NAME edited SRC program.mlir TARGET llvm-cpu SUBSTITUTE main_dispatch_0=edit.mlir)
pyree_add_run_test(NAME edited.runs MODULE edited FUNCTION main INPUTS "4x4xf32=1" "4x4xf32=2" EXPECT "@EXPECTED@")
pyree_add_benchmark(NAME edited.bench MODULE original COMPARE edited FUNCTION main
                    INPUTS "4x4xf32=1" "4x4xf32=2" REPETITIONS 2)
"""


@pytest.mark.slow
def test_cmake_substitute_rebuilds_on_edit_and_benchmarks_stay_out_of_plain_ctest(tmp_path):
    import os
    import subprocess
    import sys
    import time

    from pyree_build.cli import cmake_dir
    from pyree_build.core import toolchain

    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    shutil.copy(PROGRAM, src / "program.mlir")
    shutil.copy(SAMPLE / "main_dispatch_0_mul.mlir", src / "edit.mlir")
    (src / "CMakeLists.txt").write_text(_CMAKE_PROJECT.replace("@EXPECTED@", EDITED))

    def run(tool, *args):
        result = subprocess.run([*tool.argv, *map(os.fspath, args)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    run(toolchain.cmake(), "-G", "Ninja", "-S", src, "-B", build, f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}",
        f"-Dpyree_build_DIR={cmake_dir()}", f"-DPYREE_BUILD_PYTHON={sys.executable}")  # fmt: skip
    run(toolchain.cmake(), "--build", build)
    assert "Total Tests: 1" in run(toolchain.ctest(), "--test-dir", build, "-N")  # the benchmark is not in it
    listed = run(toolchain.ctest(), "--test-dir", build, "-C", "benchmark", "-L", "benchmark", "-N")
    assert "edited.bench" in listed and "Total Tests: 1" in listed
    run(toolchain.ctest(), "--test-dir", build, "--output-on-failure")

    time.sleep(1.1)  # coarse mtime filesystems
    edit = src / "edit.mlir"
    edit.write_text(edit.read_text().replace("arith.mulf %in, %in_0", "arith.subf %in, %in_0"))
    log = run(toolchain.cmake(), "--build", build, "-v")
    assert "-o " + str(build / "edited.vmfb") in log and "original.vmfb" not in log, log


def test_dump_takes_the_target_options_compile_takes(cli, tmp_path):
    """`dump --cpu host` dumps what `compile --cpu host` builds: the backend's options reach
    its target flags, from the CLI and from Python; an option the target lacks is refused."""
    generic, host = tmp_path / "generic", tmp_path / "host"
    assert cli("dump", PROGRAM, "-o", generic).returncode == 0
    assert cli("dump", PROGRAM, "-o", host, "--cpu", "host").returncode == 0
    source = "module_main_dispatch_0.mlir"
    assert 'cpu = "generic"' in (generic / source).read_text()
    assert 'cpu = "generic"' not in (host / source).read_text()
    python = executables.dump(PROGRAM, tmp_path / "python", target_options={"cpu": "host"})
    assert [e.name for e in python] == [e["name"] for e in json.loads((host / "index.json").read_text())]
    assert (tmp_path / "python" / source).read_text() == (host / source).read_text()
    with pytest.raises(Exception, match="target 'llvm-cpu' has no option 'gfx'"):
        executables.dump(PROGRAM, tmp_path / "refused", target_options={"gfx": "942"})
    assert not (tmp_path / "refused").exists()
