"""A backend from another package: written here as a toy (llvm-cpu under another name, with a
tool, a workflow and an option of its own), installed through a real `pyree_build.backends`
entry point, and reached from `doctor`, `compile --target`, `pb.compile` and `run`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE, install_backend

import pyree_build as pb
from pyree_build.core.errors import PyreeError

TOY = "llvm-cpu-toy"
RUN_ARGS = ["--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--expect", "8xf32=12 12 12 12 12 12 12 12"]

TOY_MODULE = '''
"""A toy pyree_build backend: llvm-cpu under another name."""
from pathlib import Path

from pyree_build.backends.base import Option, ToolCheck, Workflow
from pyree_build.backends.llvm_cpu import LlvmCpuBackend
from pyree_build.core import toolchain


class ToyBackend(LlvmCpuBackend):
    name = "llvm-cpu-toy"
    description = "llvm-cpu under another name (a test backend)"
    devices = ()
    verbs = ()
    compile_options = (
        *LlvmCpuBackend.compile_options,
        Option(("--toy-marker",), {"default": None, "help": "a file the toy's target_flags writes"}),
    )
    tools = (ToolCheck("toy-tool", toolchain.iree_compile, False, "the toy backend's own tool", "nothing to install"),)
    workflows = (Workflow("toy workflow", build=("toy-tool", "iree-compile"), run=("iree-run-module",)),)

    def target_flags(self, options):
        marker = options.get("toy_marker")
        if marker:
            Path(marker).write_text("target_flags saw toy_marker\\n")
        return super().target_flags(options)


BACKEND = ToyBackend()
'''


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the toy backend and its distribution's metadata (an entry point)."""
    return install_backend(tmp_path_factory.mktemp("toy_backend"), TOY, TOY_MODULE)


def _python(toy_path: Path, *args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(toy_path), str(PACKAGE_ROOT)]))
    return subprocess.run([sys.executable, *map(os.fspath, args)], capture_output=True, text=True, timeout=300, env=env)


def test_doctor_lists_the_toy_backend_tool_and_workflow(toy_path):
    result = _python(toy_path, "-m", "pyree_build", "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    tools, table = result.stdout.split("workflows:\n", 1)
    assert "toy-tool" in tools.split("tools:\n", 1)[1]
    (row,) = [line for line in table.splitlines() if line.strip().startswith("toy workflow  ")]
    assert "  yes  " in row, row


def test_compile_target_toy_builds_a_module_that_runs(toy_path, system_plugin, tmp_path):
    out = tmp_path / "toy.vmfb"
    result = _python(toy_path, "-m", "pyree_build", "compile", PLUGIN_SAMPLE / "example.mlir", "-o", out, "--target", TOY)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = _python(toy_path, "-m", "pyree_build", "run", out, *RUN_ARGS, "--plugin", system_plugin)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_pb_compile_passes_the_toy_option_to_its_target_flags(toy_path, system_plugin, tmp_path):
    out, marker = tmp_path / "toy_py.vmfb", tmp_path / "marker.txt"
    code = textwrap.dedent(
        """
        import sys
        import pyree_build as pb
        out = pb.compile(sys.argv[1], sys.argv[2], target="llvm-cpu-toy", target_options={"toy_marker": sys.argv[3]})
        print(out)
        """
    )
    result = _python(toy_path, "-c", code, PLUGIN_SAMPLE / "example.mlir", out, marker)
    assert result.returncode == 0, result.stdout + result.stderr
    assert marker.read_text() == "target_flags saw toy_marker\n"
    ran = _python(toy_path, "-m", "pyree_build", "run", out, *RUN_ARGS, "--plugin", system_plugin)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_an_option_the_backend_does_not_declare_is_refused(tmp_path):
    with pytest.raises(PyreeError) as err:
        pb.compile(PLUGIN_SAMPLE / "example.mlir", tmp_path / "m.vmfb", target="llvm-cpu", target_options={"toy_marker": "x"})
    assert "target 'llvm-cpu' has no option 'toy_marker'" in str(err.value)
    assert not (tmp_path / "m.vmfb").exists()
