"""The CMake functions for the GPU kernel languages in a downstream project:
pyree_vulkan_spirv, pyree_hip_hsaco, pyree_cuda_bitcode and pyree_iree_module's
VULKAN_TARGET / GFX / LINK_BITCODE; ctest labels and skips; rebuilds; unknown keywords."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES

from pyree_build.backends.vulkan import devices as vulkan
from pyree_build.cli import cmake_dir
from pyree_build.core import toolchain

pytestmark = pytest.mark.slow

VULKAN = SAMPLES / "custom_dispatch" / "vulkan" / "shaders"
HIP = SAMPLES / "custom_dispatch" / "hip" / "kernels"
UKERNEL = SAMPLES / "custom_dispatch" / "cuda" / "ukernel"

BODY = """
pyree_vulkan_spirv(NAME shaders SRCS simple_mul.glsl simple_mul_inplace.glsl)
pyree_iree_module(NAME vk SRC example.mlir TARGET vulkan VULKAN_TARGET auto DEPENDS shaders)
pyree_add_run_test(NAME vk_run MODULE vk FUNCTION mixed_invocation INPUTS "8xf32=2" "8xf32=4"
                   DEVICE vulkan EXPECT "8xf32=96 96 96 96 96 96 96 96")
pyree_hip_hsaco(NAME hsaco SRCS kernels.cu GFX gfx942 1100)
pyree_iree_module(NAME hip1100 SRC hip_example.mlir TARGET hip GFX 1100 DEPENDS hsaco)
pyree_cuda_bitcode(NAME ukbc SRCS ukernel.cu SMS 75 80)
pyree_iree_module(NAME uk SRC ukernel_example.mlir TARGET cuda SM 80 LINK_BITCODE ukbc)
"""


def cmake(*args) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*toolchain.cmake().argv, *map(os.fspath, args)], capture_output=True, text=True)


def project(root: Path, body: str) -> None:
    root.mkdir(parents=True)
    files = {
        "simple_mul.glsl": VULKAN / "simple_mul.glsl", "simple_mul_inplace.glsl": VULKAN / "simple_mul_inplace.glsl",
        "example.mlir": VULKAN / "example.mlir", "kernels.cu": HIP / "kernels.cu", "hip_example.mlir": HIP / "example.mlir",
        "ukernel.cu": UKERNEL / "ukernel.cu", "ukernel_example.mlir": UKERNEL / "ukernel_example.mlir",
    }  # fmt: skip
    for name, source in files.items():
        (root / name).write_bytes(source.read_bytes())
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(langs LANGUAGES NONE)\nfind_package(pyree_build CONFIG REQUIRED)\nenable_testing()\n" + body
    )


def configure(src: Path, build: Path) -> subprocess.CompletedProcess[str]:
    return cmake("-G", "Ninja", "-S", src, "-B", build, f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}",
                 f"-Dpyree_build_DIR={cmake_dir()}", f"-DPYREE_BUILD_PYTHON={sys.executable}")  # fmt: skip


def test_gpu_language_functions_build_test_and_rebuild(tmp_path):
    src, build = tmp_path / "src", tmp_path / "build"
    project(src, BODY)
    assert configure(src, build).returncode == 0
    result = cmake("--build", build, "--target", "iree-sample-deps")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (build / "shaders" / "simple_mul.spv").is_file() and (build / "vk.vmfb").is_file()
    assert (build / "hsaco" / "gfx942" / "kernels.co").is_file() and (build / "hsaco" / "gfx1100" / "kernels.co").is_file()
    assert (build / "ukbc" / "ukernel_sm_75.bc").is_file() and (build / "uk.vmfb").is_file()
    from pyree_build.backends.hip import hsaco as hip

    assert {o.gfx for o in hip.embedded_code_objects(build / "hip1100.vmfb")} == {"gfx1100"}
    ctest = subprocess.run([*toolchain.ctest().argv, "--test-dir", build, "-L", "vulkan", "--output-on-failure"], capture_output=True, text=True)
    assert ctest.returncode == 0, ctest.stdout
    assert ("1 tests passed" in ctest.stdout or "100% tests passed" in ctest.stdout) if vulkan.status()[0] else "Skipped" in ctest.stdout
    # An edited shader rebuilds its SPIR-V and the module; nothing else.
    shader = src / "simple_mul_inplace.glsl"
    shader.write_text(shader.read_text().replace("acc.values[i] *= factor.values[i];", "acc.values[i] *= 2.0 * factor.values[i];"))
    again = cmake("--build", build, "--target", "iree-sample-deps", "-v")
    assert again.returncode == 0, again.stdout
    ran = again.stdout
    assert "pyree_build spirv" in ran and "pyree_build compile" in ran and "vk.vmfb" in ran, ran
    assert "pyree_build hsaco" not in ran and "pyree_build bitcode" not in ran and "uk.vmfb" not in ran, ran


@pytest.mark.parametrize(
    "call, word",
    [
        ("pyree_vulkan_spirv(NAME s SHADERS simple_mul.glsl)", "SHADERS"),
        ("pyree_hip_hsaco(NAME h ARCH gfx942 SRCS kernels.cu GFX 942)", "ARCH"),
        ("pyree_cuda_bitcode(NAME b SM 80 SRCS ukernel.cu SMS 80)", "SM"),
    ],
)
def test_new_functions_reject_unknown_keywords(tmp_path, call, word):
    project(tmp_path / "src", call + "\n")
    result = configure(tmp_path / "src", tmp_path / "build")
    assert result.returncode != 0
    said = " ".join(result.stderr.split())
    assert f"unknown argument(s) '{word}" in said and "Valid keywords:" in said, result.stderr


def test_link_bitcode_without_the_modules_sm_says_which_to_add(tmp_path):
    project(tmp_path / "src", "pyree_cuda_bitcode(NAME ukbc SRCS ukernel.cu SMS 75)\n"
            "pyree_iree_module(NAME uk SRC ukernel_example.mlir TARGET cuda SM 80 LINK_BITCODE ukbc)\n")  # fmt: skip
    result = configure(tmp_path / "src", tmp_path / "build")
    said = " ".join(result.stderr.split())
    assert result.returncode != 0 and "LINK_BITCODE ukbc has no bitcode for sm_80; add 80 to its SMS" in said, result.stderr
