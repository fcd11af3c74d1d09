"""pb.run in process after a plugin is rebuilt or swapped: the results of the plugin as it is
now, never those of the copy IREE's runtime loaded first (issue 26, item 1), and still in this
process (issue 48: each plugin set gets a device of its own; a rebuilt system plugin is loaded
from a copy named by its content)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, run_cli

# mixed_invocation(a, b) = kernel(a, b) + b with a = 2, b = 4: 12 with the sample's multiply,
# 10 once the kernel adds instead.
MULTIPLY = "a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i]"
ADD = "a->lhs[a->lhs_offset + i] + a->rhs[a->rhs_offset + i]"


def _variant(tmp: Path, name: str, operator: str) -> Path:
    text = (PLUGIN_SAMPLE / name).read_text()
    assert MULTIPLY in text, f"the sample {name} no longer has the line this test edits"
    out = tmp / f"{operator}_{name}"
    out.write_text(text.replace(MULTIPLY, ADD) if operator == "add" else text)
    return out


def _build(kind: str, source: Path, output: Path) -> None:
    archs = ["--arch", "x86_64"] if kind == "standalone" else []
    result = run_cli("plugin", "--kind", kind, *archs, source, "-o", output)
    assert result.returncode == 0, result


# A script that runs in-process, rebuilds the plugin at the same path, then runs again.
# run_to_arrays (iree-run-module) is replaced by a refusal: every run must stay in process.
IN_PROCESS_ONLY = """
from pyree_build.actions import inprocess
def _refuse(*args, **kwargs):
    raise SystemExit("ran out of process")
inprocess.run_to_arrays = _refuse
"""
SCRIPT = (
    IN_PROCESS_ONLY
    + """
import sys, subprocess, numpy as np, pyree_build as pb
module, plugin, rebuilt_source, kind = sys.argv[1:5]
archs = ["--arch", "x86_64"] if kind == "standalone" else []
first = pb.run(module, "mixed_invocation", ["8xf32=2", "8xf32=4"], plugins=[plugin])[0]
again = pb.run(module, "mixed_invocation", ["8xf32=2", "8xf32=4"], plugins=[plugin])[0]
subprocess.run([sys.executable, "-m", "pyree_build", "plugin", "--kind", kind, *archs, rebuilt_source, "-o", plugin], check=True)
after = pb.run(module, "mixed_invocation", ["8xf32=2", "8xf32=4"], plugins=[plugin])[0]
later = pb.run(module, "mixed_invocation", ["8xf32=2", "8xf32=4"], plugins=[plugin])[0]
print(first[0], again[0], after[0], later[0])
"""
)


@pytest.mark.parametrize("kind", ["system", "standalone"])
def test_a_plugin_rebuilt_in_place_gives_its_new_results_in_process(tmp_path, system_module, kind):
    if kind == "standalone" and not sys.platform.startswith("linux"):
        pytest.skip("standalone x86_64 plugins load on Linux x86_64 only")
    name = "system_plugin.c" if kind == "system" else "standalone_plugin.c"
    plugin = tmp_path / ("p.so" if kind == "system" else "p.sos")
    _build(kind, _variant(tmp_path, name, "multiply"), plugin)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(system_module), str(plugin), str(_variant(tmp_path, name, "add")), kind],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["12.0", "12.0", "10.0", "10.0"], proc.stdout + proc.stderr
    assert "note: pb.run" not in proc.stderr


def test_another_plugin_later_in_the_same_process_is_used_not_the_first(tmp_path, system_module):
    multiply, add = tmp_path / "multiply.so", tmp_path / "add.so"
    _build("system", _variant(tmp_path, "system_plugin.c", "multiply"), multiply)
    _build("system", _variant(tmp_path, "system_plugin.c", "add"), add)
    script = IN_PROCESS_ONLY + (
        "import sys, pyree_build as pb\n"
        "for plugin in sys.argv[2:]:\n"
        "    print(pb.run(sys.argv[1], 'mixed_invocation', ['8xf32=2', '8xf32=4'], plugins=[plugin])[0][0])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(system_module), str(multiply), str(add), str(multiply)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["12.0", "10.0", "12.0"], proc.stdout + proc.stderr
    assert "note: pb.run" not in proc.stderr


def test_a_standalone_plugin_whose_file_goes_does_not_stop_later_runs(tmp_path, system_module):
    """Every driver made later loads every plugin parsed before: a standalone image is read from
    a copy of its own, so a build directory removed since (a temporary build, a cleared cache)
    breaks nothing. Where even that copy goes, the runs go to iree-run-module, saying why."""
    if not sys.platform.startswith("linux"):
        pytest.skip("standalone x86_64 plugins load on Linux x86_64 only")
    standalone, add, multiply = tmp_path / "gone.sos", tmp_path / "add.so", tmp_path / "multiply.so"
    _build("standalone", _variant(tmp_path, "standalone_plugin.c", "multiply"), standalone)
    _build("system", _variant(tmp_path, "system_plugin.c", "add"), add)
    _build("system", _variant(tmp_path, "system_plugin.c", "multiply"), multiply)
    script = IN_PROCESS_ONLY + (
        "import os, shutil, sys, pyree_build as pb\n"
        "from pyree_build.actions import inprocess as ip\n"
        "module, standalone, add, multiply = sys.argv[1:5]\n"
        "def call(plugin):\n    return pb.run(module, 'mixed_invocation', ['8xf32=2', '8xf32=4'], plugins=[plugin])[0][0]\n"
        "print(call(standalone))\n"
        "os.remove(standalone)\n"
        "print(call(add))\n"
        "for copy in os.listdir(ip._copy_dir()):\n    os.remove(os.path.join(ip._copy_dir(), copy))\n"
        "ip.run_to_arrays = _refused_before\n"
        "print(call(multiply))\n"
    )
    script = script.replace("inprocess.run_to_arrays = _refuse\n", "_refused_before = inprocess.run_to_arrays\ninprocess.run_to_arrays = _refuse\n")
    proc = subprocess.run(
        [sys.executable, "-c", script, str(system_module), str(standalone), str(add), str(multiply)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["12.0", "10.0", "12.0"], proc.stdout + proc.stderr
    assert "a plugin an earlier run loaded cannot be loaded again" in proc.stderr and "iree-run-module" in proc.stderr
