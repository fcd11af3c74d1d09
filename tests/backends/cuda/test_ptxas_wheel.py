"""ptxas without a CUDA SDK: the nvidia-cuda-nvcc wheel's (pip install "pyree_build[ptxas]"),
found through cuda.pathfinder, used by `ptx --verify`, with the PTX ISA matched to it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES

from pyree_build.backends.cuda import ptx as cuda
from pyree_build.core import toolchain

KERNELS = SAMPLES / "custom_dispatch" / "cuda" / "kernels" / "kernels.cu"
HAS_WHEEL = toolchain._dist_version("nvidia-cuda-nvcc") is not None
pytestmark = pytest.mark.skipif(not HAS_WHEEL, reason='the nvidia-cuda-nvcc wheel is not installed (pip install "pyree_build[ptxas]")')


def without_sdk() -> dict[str, str]:
    """This environment with no CUDA toolkit on PATH and no $CUDA_HOME, as on a fresh machine."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "ptxas").exists() and not (Path(d) / "nvcc").exists()
    )
    return env


def test_ptxas_is_found_in_the_wheel_without_an_sdk():
    code = "from pyree_build.core import toolchain; t = toolchain.ptxas(); print(t.path); print(t.version); print(t.note)"
    out = subprocess.run([sys.executable, "-c", code], env=without_sdk(), capture_output=True, text=True, check=True).stdout.split("\n")
    from cuda import pathfinder

    assert Path(out[0]) == Path(pathfinder.find_nvidia_binary_utility("ptxas"))
    assert out[1] == ".".join(toolchain._dist_version("nvidia-cuda-nvcc").split(".")[:2])  # ptxas's release = the wheel's
    assert out[2] == "from the nvidia-cuda-nvcc wheel"


def test_verify_uses_the_wheel_ptxas_and_marks_the_ptx_with_the_isa_it_reads(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pyree_build", "ptx", KERNELS, "--sm", "80", "--verify", "-o", tmp_path],
        env=without_sdk(), capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    major, minor = map(int, toolchain._dist_version("nvidia-cuda-nvcc").split(".")[:2])
    ceiling = cuda.isa_for_cuda_release(major, minor)
    driver = cuda.driver_release()
    if driver is not None:
        ceiling = min(ceiling, cuda.isa_for_cuda_release(*driver))
    isa = cuda.read_ptx(tmp_path / "kernels_sm_80.ptx").isa
    assert isa is not None and isa <= ceiling
    assert f"ptxas {major}.{minor}" in proc.stderr or driver is not None, proc.stderr
