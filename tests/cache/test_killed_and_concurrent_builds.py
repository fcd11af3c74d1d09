"""Faults: builds killed midway, concurrent builds sharing a cache, awkward paths, missing tools.

A killed build must leave no final output (nothing a later build would trust), and the
next build, through the same cache, must succeed with the same bytes as a clean build.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE, SAMPLES, assert_clean_error, run_cli

from pyree_build.core import processes
from pyree_build.core.errors import PyreeError

CUDA_KERNELS = SAMPLES / "custom_dispatch" / "cuda" / "kernels" / "kernels.cu"
ARCH_ARGS = ["--arch", "x86_64", "--arch", "aarch64", "--arch", "riscv64"]


def _argv(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "pyree_build", *map(os.fspath, args)]


def _build_actions(out: Path) -> dict[str, tuple[list[str], list[Path]]]:
    """Each long action: its command line and its final outputs."""
    return {
        "standalone plugin": (
            _argv("plugin", "-q", "--kind", "standalone", *ARCH_ARGS, PLUGIN_SAMPLE / "standalone_plugin.c", "-o", out / "p.sos"),
            [out / "p.sos"],
        ),
        "system plugin": (
            _argv("plugin", "-q", "--kind", "system", PLUGIN_SAMPLE / "system_plugin.c", "-o", out / "s.so"),
            [out / "s.so"],
        ),
        "dump": (
            _argv("dump", "-q", SAMPLES / "substitution" / "program.mlir", "-o", out / "dumped"),
            [out / "dumped" / "index.json"],
        ),
        "objects": (
            _argv("objects", "-q", *ARCH_ARGS, SAMPLES / "custom_dispatch" / "cpu" / "embedded" / "functions.c", "-o", out / "obj"),
            [out / "obj" / f"functions_{a}.o" for a in ("x86_64", "aarch64", "riscv64")],
        ),
        "compile": (
            _argv("compile", "-q", PLUGIN_SAMPLE / "example.mlir", "-o", out / "e.vmfb"),
            [out / "e.vmfb"],
        ),
        "ptx": (
            _argv("ptx", "-q", "--sm", "75", "--sm", "80", "--sm", "90", CUDA_KERNELS, "-o", out / "ptx"),
            [out / "ptx" / f"kernels_sm_{sm}.ptx" for sm in (75, 80, 90)],
        ),
    }


def _kill_midway(argv: list[str], env: dict[str, str], delay: float) -> bool:
    """Start the build, SIGKILL it and its tools after `delay`; True if it was still running."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(delay)
    running = proc.poll() is None
    if running:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return running


@pytest.mark.parametrize("action", ["system plugin", "standalone plugin", "objects", "compile", "ptx", "dump"])
def test_a_killed_build_leaves_no_output_and_the_next_build_succeeds(tmp_path, action):
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    argv_ref, outputs_ref = _build_actions(reference_dir)[action]
    clean = subprocess.run(argv_ref, env=dict(os.environ, PYREE_BUILD_CACHE="off"), capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr
    argv, outputs = _build_actions(killed_dir)[action]
    env = dict(os.environ, PYREE_BUILD_CACHE=str(tmp_path / "cache"))

    kills = 0
    for delay in (0.02, 0.05, 0.1, 0.15, 0.25, 0.4):
        if _kill_midway(argv, env, delay):
            kills += 1
            present = [o for o in outputs if o.exists()]
            # Killed before the outputs were published: none. Killed after (while storing to the
            # cache, or exiting): all of them, complete. Never a part, never a damaged file.
            assert present in ([], outputs), f"{action}: {len(present)} of {len(outputs)} outputs after a kill at {delay} s"
            for got, want in zip(present, outputs_ref):
                assert got.read_bytes() == want.read_bytes(), f"{action}: damaged {got.name} after a kill at {delay} s"
        for o in outputs:  # the next round starts from nothing, as after a kill
            o.unlink(missing_ok=True)
        if action == "dump":
            shutil.rmtree(outputs[0].parent, ignore_errors=True)
    assert kills, f"{action} finished before every kill; nothing was tested"

    rebuilt = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert rebuilt.returncode == 0, rebuilt.stderr
    for got, want in zip(outputs, outputs_ref):
        assert got.read_bytes() == want.read_bytes(), f"{got.name} differs from a clean build"
    if action == "dump":  # a directory: complete, with every file its index names
        for entry in json.loads(outputs[0].read_text()):
            assert all((outputs[0].parent / f).is_file() for f in [entry["source"], *entry["binaries"], *entry["benchmarks"]])
    # Temporaries of the killed writers are swept by the next build of the same outputs.
    leftovers = [p.name for p in killed_dir.rglob("*") if p.name.endswith((".tmp", ".build"))]
    assert leftovers == []


def test_the_cache_survives_kills_while_storing(tmp_path):
    """Kill many builds at random points, all sharing one cache; every later hit is correct."""
    cache = tmp_path / "cache"
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache))
    argv, outputs = _build_actions(tmp_path / "out")["standalone plugin"]
    for delay in (0.1, 0.2, 0.3, 0.35, 0.45, 0.6):
        _kill_midway(argv, env, delay)
        outputs[0].unlink(missing_ok=True)
    ref_argv, ref_outputs = _build_actions(tmp_path / "ref")["standalone plugin"]
    assert subprocess.run(ref_argv, env=dict(os.environ, PYREE_BUILD_CACHE="off"), capture_output=True).returncode == 0
    for _ in range(2):  # a miss or a hit, then surely a hit
        result = subprocess.run([*argv[:4], *argv[5:]], env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert outputs[0].read_bytes() == ref_outputs[0].read_bytes()
    assert "cache hit" in result.stderr


def test_a_damaged_cache_entry_is_rebuilt_not_trusted(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache))
    argv, outputs = _build_actions(tmp_path / "out")["objects"]
    assert subprocess.run(argv, env=env, capture_output=True).returncode == 0
    good = outputs[0].read_bytes()
    for entry_file in (cache / "entries").rglob("*"):
        if entry_file.is_file():
            entry_file.unlink()
            entry_file.write_bytes(b"garbage")  # not the hard-linked output: a new inode
    for o in outputs:
        o.unlink()
    result = subprocess.run([a for a in argv if a != "-q"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "cache hit" not in result.stderr
    assert outputs[0].read_bytes() == good


def test_two_builds_of_the_same_outputs_at_once_share_one_cache(tmp_path):
    env = dict(os.environ, PYREE_BUILD_CACHE=str(tmp_path / "cache"))
    argv, outputs = _build_actions(tmp_path / "shared")["standalone plugin"]

    def build(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=env, capture_output=True, text=True)

    for _ in range(3):
        outputs[0].unlink(missing_ok=True)
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(build, range(2)))
        assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
        from pyree_build.backends.llvm_cpu import fatelf

        assert len(fatelf.read(outputs[0])) == 3


@pytest.mark.slow
def test_two_cmake_builds_at_once_sharing_a_cache_give_identical_outputs(tmp_path):
    from support.cmake_projects import configure, write_downstream

    from pyree_build.core import toolchain

    src = tmp_path / "src"
    write_downstream(src)
    builds = [tmp_path / "build_a", tmp_path / "build_b"]
    for b in builds:
        configure(src, b)
    env = dict(os.environ, PYREE_BUILD_CACHE=str(tmp_path / "cache"))
    procs = [subprocess.Popen([*toolchain.cmake().argv, "--build", b], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for b in builds]
    logs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    for name in ("my_plugin.so", "my_module.vmfb"):
        assert (builds[0] / name).read_bytes() == (builds[1] / name).read_bytes()


@pytest.mark.slow
def test_paths_with_spaces_and_non_ascii_characters(tmp_path):
    from support.cmake_projects import build, configure, ctest_run, write_downstream

    root = tmp_path / "my dir ü 日本"
    src = root / "src files"
    write_downstream(src)
    out = root / "build dir"
    # The CLI alone.
    so = root / "out put" / "plügin.so"
    assert run_cli("plugin", src / "plugin.c", "-I", src / "include", "-o", so).returncode == 0
    vmfb = root / "out put" / "prögram.vmfb"
    assert run_cli("compile", src / "program.mlir", "-o", vmfb).returncode == 0
    result = run_cli("run", vmfb, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--plugin", so,
                     "--expect", "8xf32=28 28 28 28 28 28 28 28")  # fmt: skip
    assert result.returncode == 0, result
    # CMake, whose depfiles must escape the spaces.
    configure(src, out)
    build(out)
    assert "no work to do" in build(out)
    assert ctest_run(out, "--output-on-failure").returncode == 0


def test_a_missing_c_compiler_says_how_to_install_it(cli, tmp_path):
    if shutil.which("clang"):
        pytest.skip("clang is installed here")
    result = cli("plugin", PLUGIN_SAMPLE / "system_plugin.c", "--cc", "clang", "-o", tmp_path / "p.so")
    assert_clean_error(result, "clang not found", "apt-get install clang")
    assert not (tmp_path / "p.so").exists()


def test_a_missing_iree_compiler_says_how_to_install_it(tmp_path):
    """Run the CLI in a Python that has pyree_build but not the IREE compiler wheel."""
    shadow = tmp_path / "shadow" / "iree" / "compiler"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('iree-base-compiler hidden by the test')\n")
    # ... and a PATH without the venv's iree-compile script.
    bin_dir = Path(sys.executable).parent
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if Path(d) != bin_dir and not (Path(d) / "iree-compile").exists())
    env = dict(os.environ, PATH=path, PYTHONPATH=os.pathsep.join([str(tmp_path / "shadow"), str(PACKAGE_ROOT)]))
    # A namespace package `iree` in the shadow dir would merge with the real one; make it a plain package.
    (tmp_path / "shadow" / "iree" / "__init__.py").write_text("")
    proc = subprocess.run(_argv("compile", PLUGIN_SAMPLE / "example.mlir", "-o", tmp_path / "x.vmfb"), env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "iree-compile not found" in proc.stderr and "pip install" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.vmfb").exists()


def test_an_iree_compile_crash_is_named_a_crash_with_what_it_said_not_blamed_on_the_mlir(cli, tmp_path):
    """iree-compile 3.13 crashes (SIGSEGV, LLVM's backtrace, no location) on an unknown Vulkan
    target given as a raw flag; the message must not send the user to a location in the file."""
    out = tmp_path / "m.vmfb"
    flags = ["--", "--iree-hal-target-device=vulkan", "--iree-vulkan-target=bogus"]
    result = cli("compile", PLUGIN_SAMPLE / "example.mlir", "-o", out, *flags)
    assert_clean_error(
        result, "iree-compile (llvm-cpu) was killed by SIGSEGV: the tool itself crashed", "what it said before crashing:",
        "Unknown Vulkan target 'bogus'", "its backtrace begins:", "report the crash with this command and the input to https://github.com/iree-org/iree/issues",
    )  # fmt: skip
    assert "fix the MLIR at the location shown" not in result.stderr and "Stack dump:" not in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".m.vmfb*"))


@pytest.mark.parametrize("exit_how", ["signal", "banner"])
def test_a_tool_crash_is_told_from_an_error_and_a_user_code_crash_keeps_its_hint(exit_how):
    crash = "import os, signal, sys; print('error: lost its way', file=sys.stderr); " + (
        "os.kill(os.getpid(), signal.SIGSEGV)" if exit_how == "signal" else "print('Stack dump:\\n #0 0x1 f()', file=sys.stderr); sys.exit(3)"
    )
    with pytest.raises(PyreeError) as tool:
        processes.spawn([sys.executable, "-c", crash], what="the tool", fix="fix the input")
    assert "the tool itself crashed" in tool.value.what and "error: lost its way" in tool.value.details
    assert tool.value.fix is not None and "fix the input" not in tool.value.fix
    if exit_how == "signal":  # a crash with a hint (a run with a user's plugin) keeps the hint and the caller's fix
        with pytest.raises(PyreeError) as user:
            processes.spawn([sys.executable, "-c", crash], what="the run", fix="fix the plugin", crash_hint="a plugin was loaded")
        assert user.value.what == "the run was killed by SIGSEGV" and user.value.fix == "fix the plugin"
        assert "a plugin was loaded" in user.value.details
