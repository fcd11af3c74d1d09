"""CUDA bitcode: device code -> NVPTX LLVM bitcode with zig clang and no CUDA SDK, linked
into generated kernels (--link-bitcode / LINK_BITCODE), and the build-time check that no
call is left unresolved (which iree-compile lets through and only the driver would catch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES, assert_clean_error

from pyree_build.actions import compile as compile_action
from pyree_build.actions import run as run_action
from pyree_build.backends.cuda import bitcode
from pyree_build.backends.cuda import target as cuda_target
from pyree_build.core import toolchain

SAMPLE = SAMPLES / "custom_dispatch" / "cuda" / "ukernel"
UKERNEL = SAMPLE / "ukernel.cu"
PROGRAM = SAMPLE / "ukernel_example.mlir"


@pytest.fixture(scope="module")
def bc(tmp_path_factory) -> Path:
    return bitcode.bitcode(UKERNEL, [80], tmp_path_factory.mktemp("bc"))[0]


def test_bitcode_writes_llvm_bitcode_per_sm_and_tracks_the_header(cli, tmp_path):
    result = cli("bitcode", UKERNEL, "--sm", "80", "--sm", "sm_75", "-o", tmp_path / "bc", "--depfile", tmp_path / "bc.d")
    assert result.returncode == 0, result
    files = {sm: (tmp_path / "bc" / f"ukernel_sm_{sm}.bc").read_bytes() for sm in (80, 75)}
    for data in files.values():
        assert data[:4] == b"BC\xc0\xde" and b"nvptx64-nvidia-cuda" in data and b"scaled_add_workgroup" in data
    assert files[80] != files[75]  # compiled for each sm
    deps = (tmp_path / "bc.d").read_text()
    assert str(UKERNEL) in deps and "cuda_device.h" in deps


def test_bitcode_never_reads_a_system_cuda(tmp_path):
    """The command points clang at an empty CUDA path, so an installed toolkit is not used."""
    result = subprocess.run(
        [sys.executable, "-m", "pyree_build", "bitcode", UKERNEL, "--sm", "80", "-o", tmp_path, "-v"],
        capture_output=True, text=True, env={**os.environ, "PYREE_BUILD_CACHE": "off", "CUDA_HOME": "/usr/local/cuda", "CUDA_PATH": "/usr/local/cuda"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    command = next(line for line in result.stderr.splitlines() if "--cuda-gpu-arch=sm_80" in line)
    assert "-nocudainc" in command and "-nocudalib" in command
    path = command.split("--cuda-path=", 1)[1].split()[0]
    assert "no-cuda-sdk" in path and "/usr/local/cuda" not in path


def test_generated_kernel_links_the_microkernel_and_leaves_no_extern_call(cli, bc, tmp_path):
    module = tmp_path / "uk.vmfb"
    result = cli("compile", PROGRAM, "-o", module, "--target", "cuda", "--sm", "80", "--link-bitcode", bc, "-v")
    assert result.returncode == 0, result
    assert "ptxas" in result.stderr or "no ptxas found" in result.stderr  # assembled where a ptxas exists
    dump = tmp_path / "dump"
    subprocess.run(
        toolchain.iree_compile().command(PROGRAM, *compile_action.target_flags("cuda", sm=80), f"--iree-link-bitcode={bc}",
                                     f"--iree-hal-dump-executable-binaries-to={dump}", "-o", tmp_path / "x.vmfb"),
        check=True, capture_output=True,
    )  # fmt: skip
    (ptx,) = dump.glob("*.ptx")
    assert bitcode.unresolved_functions(ptx.read_text()) == []


def test_without_the_bitcode_the_unresolved_call_is_named_and_nothing_is_written(cli, tmp_path):
    module = tmp_path / "uk.vmfb"
    result = cli("compile", PROGRAM, "-o", module, "--target", "cuda", "--sm", "80")
    assert_clean_error(result, "the generated CUDA code calls scaled_add_workgroup, which no linked bitcode defines", "--link-bitcode")
    assert not module.exists()


def test_bitcode_defining_another_name_is_a_missing_symbol(cli, tmp_path):
    other = tmp_path / "other.cu"
    other.write_text('extern "C" __device__ void scaled_add(float* x) { x[threadIdx.x] += 1.0f; }\n')
    (bc,) = bitcode.bitcode(other, [80], tmp_path / "bc")
    result = cli("compile", PROGRAM, "-o", tmp_path / "uk.vmfb", "--target", "cuda", "--link-bitcode", bc)
    assert_clean_error(result, "calls scaled_add_workgroup, which no linked bitcode defines", "other_sm_80.bc")
    assert not (tmp_path / "uk.vmfb").exists()


def test_cuda_that_does_not_compile_names_file_and_line(cli, tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __device__ void f(float* x) {\n  x[0] = undefined_x;\n}\n')
    result = cli("bitcode", bad, "--sm", "80", "-o", tmp_path / "bc")
    assert_clean_error(
        result, "bad.cu: compiling bad.cu to sm_80 bitcode with zig clang failed", "bad.cu:2:10: error: use of undeclared identifier 'undefined_x'"
    )
    assert not list((tmp_path / "bc").glob("*.bc")) if (tmp_path / "bc").exists() else True


def test_missing_bitcode_file_is_named(cli, tmp_path):
    result = cli("compile", PROGRAM, "-o", tmp_path / "uk.vmfb", "--target", "cuda", "--link-bitcode", tmp_path / "nope.bc")
    assert_clean_error(result, "nope.bc: bitcode not found")


def test_the_sample_runs_on_a_gpu_or_is_skipped_with_the_reason(cli, bc, tmp_path):
    module = compile_action.compile(PROGRAM, tmp_path / "uk.vmfb", target="cuda", sm=80, link_bitcode=[bc])
    result = cli("run", module, "--device", "cuda", "--function", "scaled_add_squared", "--input", "32xf32=1", "--input", "32xf32=3",
                 "--expect", "32xf32=" + " ".join(["25"] * 32), "--skip-unavailable")  # fmt: skip
    usable, reason = cuda_target.cuda_status()
    if usable:
        assert result.returncode == 0, result
    else:
        assert result.returncode == run_action.SKIP_EXIT_CODE and reason in result.stderr, result
