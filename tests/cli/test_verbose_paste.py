"""`-v` prints a shell script: pasted into bash in a clean directory it makes the same bytes,
both when the tools ran and on a cache hit (where it shows what would have run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE, SAMPLES

KERNELS = SAMPLES / "custom_dispatch" / "cuda" / "kernels" / "kernels.cu"


def _pyree(args: list[str], cache: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache), PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pyree_build", "-v", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _paste(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    clean = tmp_path / f"clean{len(list(tmp_path.glob('clean*')))}"
    clean.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(["bash", "-e", "-o", "pipefail"], input=script, cwd=clean, env=env, capture_output=True, text=True, timeout=600)


def _check_paste(tmp_path: Path, args: list[str], outputs: list[str]) -> None:
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    for attempt, claim in (("cold", None), ("hit", "# (cache hit)")):
        result = _pyree(args, cache, work)
        assert result.returncode == 0, result.stderr
        if claim:
            assert claim in result.stderr, result.stderr
        commands = [line for line in result.stderr.splitlines() if line and not line.startswith("#")]
        assert commands and all(line.startswith("(cd ") for line in commands), result.stderr
        made = {name: (work / name).read_bytes() for name in outputs}
        for name in outputs:
            (work / name).unlink()
        pasted = _paste(result.stderr, tmp_path)
        assert pasted.returncode == 0, f"{attempt}: pasting failed:\n{result.stderr}\n---\n{pasted.stderr}"
        for name in outputs:
            assert (work / name).read_bytes() == made[name], f"{attempt}: {name} differs when pasted"


def test_system_plugin(tmp_path):
    _check_paste(tmp_path, ["plugin", "--kind", "system", str(PLUGIN_SAMPLE / "system_plugin.c"), "-o", "out/p.so"], ["out/p.so"])


def test_standalone_fatelf_and_single_elf(tmp_path):
    src = str(PLUGIN_SAMPLE / "standalone_plugin.c")
    _check_paste(tmp_path, ["plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "riscv64", src, "-o", "p.sos"], ["p.sos"])
    one = tmp_path / "one"
    one.mkdir()
    _check_paste(one, ["plugin", "--kind", "standalone", "--arch", "aarch64", src, "-o", "p_aarch64.so"], ["p_aarch64.so"])


def test_objects(tmp_path):
    src = str(SAMPLES / "custom_dispatch" / "cpu" / "embedded" / "functions.c")
    _check_paste(tmp_path, ["objects", src, "--arch", "x86_64", "--arch", "aarch64", "-o", "objs"],
                 ["objs/functions_x86_64.o", "objs/functions_aarch64.o"])  # fmt: skip


def test_compile(tmp_path):
    _check_paste(tmp_path, ["compile", str(PLUGIN_SAMPLE / "example.mlir"), "-o", "m.vmfb"], ["m.vmfb"])


def test_ptx_through_nvrtc_with_an_isa_ceiling(tmp_path):
    from pyree_build.core import toolchain
    from pyree_build.core.errors import PyreeError

    try:
        toolchain.nvrtc()
    except PyreeError as err:
        pytest.skip(str(err.what))
    _check_paste(tmp_path, ["ptx", str(KERNELS), "--sm", "75", "--sm", "80", "--ptx-isa", "8.0", "-o", "ptx"],
                 ["ptx/kernels_sm_75.ptx", "ptx/kernels_sm_80.ptx"])  # fmt: skip


def test_run_prints_the_same_output_when_pasted(tmp_path, system_module, system_plugin):
    args = ["run", str(system_module), "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--plugin", str(system_plugin)]
    result = _pyree(args, tmp_path / "cache", tmp_path)
    assert result.returncode == 0 and "8xf32=12" in result.stdout, result
    pasted = _paste(result.stderr, tmp_path)
    assert pasted.returncode == 0 and pasted.stdout == result.stdout, pasted


def test_the_scratch_directory_is_kept_and_named(tmp_path):
    result = _pyree(["plugin", str(PLUGIN_SAMPLE / "system_plugin.c"), "-o", "p.so"], tmp_path / "cache", tmp_path)
    assert result.returncode == 0, result
    (line,) = [line for line in result.stderr.splitlines() if "kept the scratch directory" in line]
    kept = Path(tmp_path / line.split("kept the scratch directory ", 1)[1].split(" (-v)")[0])
    assert kept.is_dir() and any(kept.glob("*.o")), line


@pytest.mark.parametrize(
    ("first", "then"),
    [(["-o", "objs"], ["-o", "sub/other"]), (["-o", "objs"], ["-o", "ABS/other"]), (["-o", "ABS/objs"], ["-o", "other"])],
    ids=["another relative directory", "relative then absolute", "absolute then relative"],
)
def test_a_hit_recorded_under_other_output_names_pastes_as_this_build(tmp_path, first, then):
    """issue 26 item 11: the commands of a hit recorded by a build of another output name (or
    the same name spelled relative vs absolute) are this build's, with nothing left over."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    src = str(SAMPLES / "custom_dispatch" / "cpu" / "embedded" / "functions.c")
    spelled = [[a.replace("ABS", str(work)) for a in args] for args in (first, then)]
    assert _pyree(["objects", src, "--arch", "x86_64", *spelled[0]], cache, work).returncode == 0
    hit = _pyree(["objects", src, "--arch", "x86_64", *spelled[1]], cache, work)
    assert hit.returncode == 0 and "# (cache hit)" in hit.stderr, hit.stderr
    assert "\x00" not in hit.stderr and "T0." not in hit.stderr, hit.stderr
    out = (work / spelled[1][1]) / "functions_x86_64.o"
    made = out.read_bytes()
    for leftover in (out, out.parent):
        leftover.unlink() if leftover.is_file() else leftover.rmdir()
    pasted = _paste(hit.stderr, tmp_path)
    assert pasted.returncode == 0, f"pasting failed:\n{hit.stderr}\n---\n{pasted.stderr}"
    assert out.read_bytes() == made
