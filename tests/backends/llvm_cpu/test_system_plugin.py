"""System plugin end to end with the real tools: C -> .so -> checked -> loaded by iree-run-module."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PLUGIN_SAMPLE

import pyree_build as pb
from pyree_build.backends.llvm_cpu import elf as elfcheck
from pyree_build.core.files import parse_depfile

EXPECTED = "8xf32=12 12 12 12 12 12 12 12"


def test_plugin_exports_query_and_loads(system_plugin):
    info = elfcheck.check_plugin_elf(system_plugin, arch=elfcheck.host_arch())
    assert elfcheck.QUERY_EXPORT in info.defined_exports
    assert info.elf_type == "ET_DYN"
    name, version = elfcheck.probe_plugin(system_plugin)
    assert name == "pyree_sample_system"
    assert version == 1


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_mixed_invocation_through_the_plugin(cli, system_plugin, system_module, device):
    result = cli(
        "run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4",
        "--plugin", system_plugin, "--device", device, "--expect", EXPECTED,
    )  # fmt: skip
    assert result.returncode == 0, result
    assert EXPECTED in result.stdout


def test_without_the_plugin_the_import_is_unresolved(cli, system_module):
    result = cli("run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4")
    assert result.returncode != 0
    assert "no plugin provided" in result.stderr and "--plugin" in result.stderr
    assert "Traceback" not in result.output


def test_check_file_uses_filecheck_semantics(cli, system_plugin, system_module, tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("CHECK: EXEC @mixed_invocation\nCHECK-NEXT: result[0]: hal.buffer_view\nCHECK-NEXT: 8xf32={{(12 ?)+}}\n")
    args = ["run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--plugin", system_plugin]
    assert cli(*args, "--check-file", good).returncode == 0
    bad = tmp_path / "bad.txt"
    bad.write_text("CHECK: 8xf32=13\n")
    result = cli(*args, "--check-file", bad)
    assert result.returncode != 0
    assert "does not match the CHECK lines" in result.stderr
    assert "8xf32=12" in result.stderr  # the actual output is shown


def test_python_api_builds_runs_and_returns_arrays(tmp_path):
    so = pb.plugin([PLUGIN_SAMPLE / "system_plugin.c"], tmp_path / "p.so", kind="system", depfile=tmp_path / "p.so.d")
    vmfb = pb.compile(PLUGIN_SAMPLE / "example.mlir", tmp_path / "m.vmfb", target="llvm-cpu")
    # In this process, through iree.runtime; the plugin computes 2 * 4, generated code adds 4.
    (result,) = pb.run(vmfb, "mixed_invocation", [np.full(8, 2, np.float32), "8xf32=4"], plugins=[so])
    np.testing.assert_array_equal(result, np.full(8, 12, dtype=np.float32))
    assert result.dtype == np.float32
    # The same through iree-run-module.
    (out_of_process,) = pb.run(vmfb, "mixed_invocation", ["8xf32=2", "8xf32=4"], plugins=[so], in_process=False)
    np.testing.assert_array_equal(out_of_process, result)
    deps = parse_depfile(tmp_path / "p.so.d")
    assert str(PLUGIN_SAMPLE / "system_plugin.c") in deps
    assert any(d.endswith("iree/hal/local/executable_plugin.h") for d in deps)
    assert any(d.endswith("llvm_cpu/plugins.py") for d in deps)  # flags live there: a change must rebuild


def test_gcc_builds_the_same_plugin(cli, tmp_path, system_module):
    import shutil

    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed on this machine")
    out = tmp_path / "gcc_plugin.so"
    result = cli("plugin", "--kind", "system", "--cc", "gcc", PLUGIN_SAMPLE / "system_plugin.c", "-o", out)
    assert result.returncode == 0, result
    run = cli("run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--plugin", out, "--expect", EXPECTED)
    assert run.returncode == 0, run


def test_verbose_prints_each_tool_command(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PYREE_BUILD_CACHE", "off")  # a cache hit would run no tool
    result = cli("plugin", "-v", "--kind", "system", PLUGIN_SAMPLE / "system_plugin.c", "-o", tmp_path / "v.so")
    assert result.returncode == 0, result
    commands = [line for line in result.stderr.splitlines() if line.startswith("(cd ")]
    assert any(" cc " in c and "-c" in c for c in commands)
    assert any("-shared" in c for c in commands)


def test_in_process_runs_other_plugin_sets_and_rebuilt_plugins_each_with_its_own_code(tmp_path, system_plugin, system_module):
    """Each plugin set gets a device of its own in this process: a second set, and a plugin
    rebuilt at the same path (the notebook loop), run in process with their own code, while
    the first set keeps its own; nothing goes to iree-run-module."""
    import subprocess
    import sys

    source = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    plus = source.replace("* a->rhs[a->rhs_offset + i];", "* a->rhs[a->rhs_offset + i] + 100.0f;")
    assert plus != source
    (tmp_path / "plus.c").write_text(plus)
    other = tmp_path / "other.so"
    other.write_bytes(system_plugin.read_bytes())
    edited = tmp_path / "edited.so"
    edited.write_bytes(system_plugin.read_bytes())
    script = (
        "import numpy as np, pyree_build as pb\n"
        "from pyree_build.actions import inprocess\n"
        "def refuse(*a, **k):\n    raise SystemExit('ran out of process')\n"
        "inprocess.run_to_arrays = refuse\n"
        f"m = {str(system_module)!r}\n"
        "def call(plugin, b):\n    return pb.run(m, 'mixed_invocation', ['8xf32=1', f'8xf32={b}'], plugins=[plugin])[0][0]\n"
        f"print(call({str(system_plugin)!r}, 1))\n"
        f"print(call({str(other)!r}, 3))\n"
        f"print(call({str(edited)!r}, 3))\n"
        f"pb.plugin([{str(tmp_path / 'plus.c')!r}], {str(edited)!r}, kind='system')\n"
        f"print(call({str(edited)!r}, 3))\n"
        f"print(call({str(system_plugin)!r}, 3))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # 1*b + b from the sample; 1*b + 100 + b once rebuilt; the first plugin keeps its own code.
    assert proc.stdout.splitlines() == ["2.0", "6.0", "6.0", "106.0", "6.0"], proc.stdout
    assert "note: pb.run" not in proc.stderr
