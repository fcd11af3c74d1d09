"""The pyree_* CMake functions reject mistakes at configure time, naming what is wrong.

Each case configures a small downstream project and checks CMake's message; a misspelled
keyword used to be ignored (a test that checks nothing) or swallowed into another list.
"""

from __future__ import annotations

import pytest
from support.cmake_errors import configure_project
from support.cmake_projects import build, ctest_run

MODULE = "pyree_iree_module(NAME m SRC program.mlir TARGET llvm-cpu)\n"
PLUGIN = "pyree_cpu_plugin(NAME p SYSTEM SRCS plugin.c)\n"
RUN = "pyree_add_run_test(NAME t MODULE m FUNCTION mixed_invocation INPUTS 8xf32=2 8xf32=4 PLUGINS p {extra})\n"


CASES = {
    # item 11 of issue 13, each as it was seen
    "EXPECTED instead of EXPECT": (
        MODULE + PLUGIN + RUN.format(extra='EXPECTED "8xf32=12"'),
        ["pyree_add_run_test", "EXPECTED", "EXPECT"],
    ),
    "EXPECTED after FUNCTION": (
        MODULE + PLUGIN + 'pyree_add_run_test(NAME t MODULE m FUNCTION mixed_invocation EXPECTED "8xf32=12")\n',
        ["unknown argument(s) 'EXPECTED 8xf32=12'", "Valid keywords:"],
    ),
    "OBJECT_SEARCH_PATH": (
        "pyree_iree_module(NAME m SRC program.mlir TARGET llvm-cpu OBJECT_SEARCH_PATH objs)\n",
        ["pyree_iree_module", "OBJECT_SEARCH_PATH", "OBJECT_SEARCH_PATHS"],
    ),
    "INCLUDE_DIR swallowed into SRCS": (
        "pyree_cpu_plugin(NAME p SYSTEM SRCS plugin.c INCLUDE_DIR inc)\n",
        ["pyree_cpu_plugin", "'INCLUDE_DIR'", "misspelled keyword", "INCLUDE_DIRS"],
    ),
    "keyword without a value": (
        MODULE + "pyree_add_run_test(NAME t MODULE m FUNCTION)\n",
        ["keyword(s) given without a value: FUNCTION"],
    ),
    "MODULE that is no target": (
        "pyree_add_run_test(NAME t MODULE no_such_module FUNCTION f)\n",
        ["'no_such_module' is neither a pyree_* target", "nor an existing file"],
    ),
    "PLUGINS that is no target": (
        MODULE + "pyree_add_run_test(NAME t MODULE m FUNCTION f PLUGINS no_such_plugin)\n",
        ["'no_such_plugin' is neither a pyree_* target"],
    ),
    "missing source": (
        "pyree_cpu_plugin(NAME p SYSTEM SRCS missing.c)\n",
        ["pyree_cpu_plugin: SRCS file 'missing.c' not found"],
    ),
    "missing MLIR": (
        "pyree_iree_module(NAME m SRC missing.mlir TARGET llvm-cpu)\n",
        ["pyree_iree_module: SRC file 'missing.mlir' not found"],
    ),
    "unknown ARCHS": (
        "pyree_cpu_plugin(NAME p STANDALONE SRCS plugin.c ARCHS x86_64 mips)\n",
        ["pyree_cpu_plugin: unknown ARCHS 'mips'", "aarch64"],
    ),
    "unknown TARGET": (
        "pyree_iree_module(NAME m SRC program.mlir TARGET cpu)\n",
        ["pyree_iree_module: unknown TARGET 'cpu'", "llvm-cpu"],
    ),
    "unknown DEVICE": (
        MODULE + "pyree_add_run_test(NAME t MODULE m FUNCTION f DEVICE local)\n",
        ["pyree_add_run_test: unknown DEVICE 'local'", "local-sync"],
    ),
    "bad TIMEOUT": (
        MODULE + "pyree_add_run_test(NAME t MODULE m FUNCTION f TIMEOUT soon)\n",
        ["TIMEOUT 'soon' is not a positive number of seconds"],
    ),
    "benchmark keyword typo": (
        MODULE + "pyree_add_benchmark(NAME b MODULE m REPETITION 3)\n",
        ["pyree_add_benchmark: unknown argument(s) 'REPETITION 3'", "REPETITIONS"],
    ),
    # issue 26 item 10: every artifact function checks its sources at configure time
    "missing bitcode source": (
        "pyree_cuda_bitcode(NAME k SRCS missing.cu SMS 80)\n",
        ["pyree_cuda_bitcode: SRCS file 'missing.cu' not found"],
    ),
    "missing GLSL source": (
        "pyree_vulkan_spirv(NAME s SRCS missing.glsl)\n",
        ["pyree_vulkan_spirv: SRCS file 'missing.glsl' not found"],
    ),
    "missing HIP source": (
        "pyree_hip_hsaco(NAME h SRCS missing.cu GFX 942)\n",
        ["pyree_hip_hsaco: SRCS file 'missing.cu' not found"],
    ),
    "unknown hsaco LAYOUT": (
        "pyree_hip_hsaco(NAME h SRCS kernels.cu GFX 942 LAYOUT iree)\n",
        ["pyree_hip_hsaco: unknown LAYOUT 'iree'; use one of: dirs, flat"],
    ),
    "a keyword spirv lacks is not taken as a source": (
        "pyree_vulkan_spirv(NAME s SRCS shader.glsl OUTPUT_DIRECTORY d)\n",
        ["pyree_vulkan_spirv", "OUTPUT_DIRECTORY", "OUTPUT_DIR"],
    ),
    "bad RTOL": (
        MODULE + "pyree_add_run_test(NAME t MODULE m FUNCTION f EXPECT_CLOSE 8xf32=12 RTOL tight)\n",
        ["pyree_add_run_test: RTOL 'tight' is not a non-negative number"],
    ),
    # issue 35 item 21: a cycle at build time before
    "OUTPUT that is its own SRC": (
        "pyree_iree_module(NAME m SRC program.mlir TARGET llvm-cpu OUTPUT ${CMAKE_CURRENT_SOURCE_DIR}/program.mlir)\n",
        ["iree-compile m (llvm-cpu): the output", "program.mlir is also an input", "Choose another OUTPUT"],
    ),
    "ptx sm": (
        "pyree_cuda_ptx(NAME k SRCS plugin.c SMS ampere)\n",
        ["SMS value 'ampere' is not an sm number"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_stops_the_configure_with_its_message(tmp_path, case):
    body, fragments = CASES[case]
    result = configure_project(tmp_path, body)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    flat = " ".join(output.split())  # CMake wraps long messages
    for fragment in fragments:
        assert fragment in flat, f"{fragment!r} not in:\n{output}"


def test_valid_calls_still_configure_and_timeout_reaches_the_test(tmp_path):
    body = MODULE + PLUGIN + RUN.format(extra='EXPECT "8xf32=12 12 12 12 12 12 12 12" TIMEOUT 120 LABELS SLOWISH')
    body += "pyree_add_benchmark(NAME b MODULE m FUNCTION mixed_invocation INPUTS 8xf32=2 8xf32=4 PLUGINS p TIMEOUT 60)\n"
    body += "pyree_add_run_test(NAME close MODULE m FUNCTION mixed_invocation INPUTS 8xf32=2 8xf32=4 PLUGINS p EXPECT_CLOSE 8xf32=12 RTOL 1e-3 ATOL 0)\n"
    result = configure_project(tmp_path, body)
    assert result.returncode == 0, result.stdout + result.stderr
    listing = ctest_run(tmp_path / "build", "-N", "-V").stdout
    assert "--timeout 120" in " ".join(listing.split()).replace('"', "")
    assert "--expect-close 8xf32=12 --rtol 1e-3 --atol 0" in " ".join(listing.split()).replace('"', "")


def test_every_artifact_function_writes_into_its_output_dir(tmp_path):
    """OUTPUT_DIR (relative to the binary dir) for every artifact function, so a program whose
    objects are named by relative paths finds them without copy steps (issue 26 item 10)."""
    body = (
        "pyree_vulkan_spirv(NAME s SRCS shader.glsl OUTPUT_DIR shaders)\npyree_hip_hsaco(NAME h SRCS kernels.cu GFX 942 OUTPUT_DIR code)\n"
        "pyree_hip_hsaco(NAME hf SRCS kernels.cu GFX 942 1100 OUTPUT_DIR objects LAYOUT flat)\n"
    )
    result = configure_project(tmp_path, body)
    assert result.returncode == 0, result.stdout + result.stderr
    for target in ("s", "h", "hf"):
        build(tmp_path / "build", target)
    built = tmp_path / "build"
    assert (built / "shaders" / "shader.spv").is_file()
    assert (built / "code" / "gfx942" / "kernels.co").is_file()
    # LAYOUT flat: IREE's sample names, one directory for every gfx
    assert sorted(p.name for p in (built / "objects").glob("*.co")) == ["kernels_gfx1100.co", "kernels_gfx942.co"]
    assert (built / "objects" / "kernels_gfx942.co").read_bytes() == (built / "code" / "gfx942" / "kernels.co").read_bytes()
    assert not (built / "s").exists() and not (built / "h").exists() and not (built / "hf").exists()
