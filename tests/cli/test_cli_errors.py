"""The remaining user errors of the verbs added with CUDA, dump/bench, new and in-process runs:
each a clear message, a non-zero exit, no traceback and no output."""

from __future__ import annotations

from conftest import SAMPLES, assert_clean_error

KERNELS = SAMPLES / "custom_dispatch" / "cuda" / "kernels" / "kernels.cu"


def test_an_sm_that_is_not_a_number(cli, tmp_path):
    assert_clean_error(cli("ptx", KERNELS, "--sm", "ampere", "-o", tmp_path), "'ampere' is not an sm", "--sm 80")


def test_a_ptx_isa_that_is_not_major_minor(cli, tmp_path):
    assert_clean_error(cli("ptx", KERNELS, "--sm", "80", "--ptx-isa", "nine", "-o", tmp_path), "'nine' is not a PTX ISA version", "8.5")
    assert not list(tmp_path.glob("*.ptx"))


def test_bench_compare_needs_two_modules(cli, system_module):
    assert_clean_error(cli("bench", "--compare", system_module, "--function", "mixed_invocation"), "--compare takes two modules or more, got 1")


def test_bench_needs_at_least_one_repetition(cli, system_module):
    assert_clean_error(cli("bench", system_module, "--repetitions", "0"), "--repetitions must be at least 1")


def test_a_substitution_without_an_equals_sign(cli, tmp_path):
    result = cli("compile", SAMPLES / "substitution" / "program.mlir", "-o", tmp_path / "x.vmfb", "--substitute", "main_dispatch_0")
    assert_clean_error(result, "'main_dispatch_0' is not NAME=FILE")
    assert not (tmp_path / "x.vmfb").exists()


def test_new_with_a_name_cmake_cannot_use(cli, tmp_path):
    assert_clean_error(cli("new", tmp_path / "p", "--name", "9lives"), "'9lives' cannot name a CMake project", "--name")
    assert not (tmp_path / "p").exists()


def _in_process(script: str) -> str:
    """In-process runs fix a driver's plugins for the whole process: keep them out of pytest's."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_in_process_run_of_a_function_the_module_lacks(cli, tmp_path):
    vmfb = tmp_path / "program.vmfb"
    assert cli("compile", SAMPLES / "substitution" / "program.mlir", "-o", vmfb).returncode == 0
    out = _in_process(
        f"import pyree_build as pb\ntry:\n    pb.run({str(vmfb)!r}, 'nope', [])\nexcept pb.PyreeError as err:\n    print(err.what, '|', err.fix)\n"
    )
    assert "the module has no function 'nope'" in out and "func.func" in out


def test_in_process_run_with_an_element_type_numpy_lacks(system_module):
    out = _in_process(
        "import pyree_build as pb\n"
        "try:\n"
        f"    pb.run({str(system_module)!r}, 'mixed_invocation', ['8xbf16=1', '8xbf16=1'])\n"
        "except pb.PyreeError as err:\n"
        "    print(err.what)\n"
    )
    assert "element type 'bf16' has no numpy equivalent" in out


def test_cuda_target_for_an_sm_that_is_not_a_number(cli):
    assert_clean_error(cli("cuda-target", "--sm", "hopper"), "'hopper' is not an sm", "--sm 80")


def test_bench_compare_gives_each_side_its_own_plugins(cli, system_module, system_plugin, tmp_path):
    """One module, its plugin on each side only (`M.vmfb:P.so`): each side runs (the module
    cannot run without its plugin, so a side that did not load its own would fail), three
    sides print every ratio to the first, and a side naming no plugin after ':' is refused."""
    copy = tmp_path / "again.so"
    copy.write_bytes(system_plugin.read_bytes())
    sides = [f"{system_module}:{system_plugin}", f"{system_module}:{copy}", f"{system_module}:{system_plugin},{copy}"]
    args = ["--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--rounds", "2", "--repetitions", "2"]
    two = cli("bench", "--compare", *sides[:2], *args)
    assert two.returncode == 0, two
    assert f"A {system_module} with {system_plugin}: median" in two.stdout and f"B {system_module} with {copy}: median" in two.stdout
    three = cli("bench", "--compare", *sides, *args)
    assert three.returncode == 0, three
    lines = three.stdout.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["1", "2", "3"] and "2/1 = " in lines[1] and "3/1 = " in lines[2], three.stdout
    without = cli("bench", "--compare", str(system_module), f"{system_module}:{system_plugin}", *args)
    assert without.returncode != 0 and "mixed_invocation" in without.stderr + without.stdout
    assert_clean_error(cli("bench", "--compare", f"{system_module}:", str(system_module), *args), "names no plugin after ':'")
