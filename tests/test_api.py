"""The Python API checks its arguments at the boundary (issue 13, item 10): a wrong type
is a pb.PyreeError naming the argument, a single path where a list is taken is one path,
and every verb stays callable however its modules were imported."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import PLUGIN_SAMPLE, REPO, SAMPLES

import pyree_build as pb

VERBS = ["plugin", "objects", "ptx", "compile", "run", "dump", "bench", "new", "fatelf"]


def test_dir_lists_every_verb():
    names = dir(pb)
    for verb in VERBS:
        assert verb in names, verb
    assert set(VERBS) <= set(pb.__all__)


def test_dir_and_all_are_exactly_the_public_names():
    public = [n for n in pb.__all__ if not n.startswith("__")]
    assert [n for n in dir(pb) if not n.startswith("__")] == sorted(public)
    for name in ("annotations", "TYPE_CHECKING", "core", "backends", "_Verb"):
        assert name not in dir(pb), name
    for name in pb.__all__:
        assert getattr(pb, name) is not None, name
    assert (Path(pb.__file__).parent / "py.typed").is_file()


def test_every_verb_documents_an_example_and_real_types():
    import inspect

    verbs = [n for n in pb.__all__ if inspect.isroutine(getattr(pb, n)) and n != "stop_on_signals"]
    assert {"run", "load_inline", "compile", "plugin"} <= set(verbs)
    for name in verbs:
        verb = getattr(pb, name)
        assert "Example" in (verb.__doc__ or ""), f"pb.{name} has no example in its docstring"
        shown = str(inspect.signature(verb))
        assert "_Any" not in shown and "->" in shown, f"pb.{name}{shown}"
    assert str(inspect.signature(pb.run)).endswith("-> 'list[numpy.ndarray]'")
    assert inspect.signature(pb.load_inline).return_annotation == "InlineKernel"


def test_verbs_show_their_arguments():
    import inspect

    assert list(inspect.signature(pb.plugin).parameters)[:2] == ["sources", "output"]
    assert "force" in inspect.signature(pb.dump).parameters


def test_bench_stays_the_verb_after_its_module_is_imported(system_plugin, system_module):
    # Importing the submodule used to replace the verb: the second access was the module.
    for _ in range(3):
        importlib.import_module("pyree_build.actions.bench")
        from pyree_build.actions import bench as imported  # noqa: F401

        assert callable(pb.bench) and not isinstance(pb.bench, type(sys))
    result = pb.bench(system_module, "mixed_invocation", inputs=["8xf32=2", "8xf32=4"], plugins=system_plugin, repetitions=1, min_time=0.01)
    result_again = pb.bench(system_module, "mixed_invocation", inputs=["8xf32=2", "8xf32=4"], plugins=system_plugin, repetitions=1, min_time=0.01)
    assert result.timings and result_again.timings
    assert pb.bench.compare is sys.modules["pyree_build.actions.bench"].compare  # the module's other functions, through the verb


def test_bench_is_the_verb_in_a_fresh_process_too():
    code = "import pyree_build as pb, pyree_build.actions.bench; from pyree_build import cli; print(callable(pb.bench), type(pb.bench).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.split() == ["True", "_Verb"]


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: pb.plugin(None, "x.so"), "sources must be a path or a list of them, got NoneType"),
        (lambda: pb.plugin([None], "x.so"), "sources must be a path"),
        (lambda: pb.plugin(["p.c"], None), "output must be a path"),
        (lambda: pb.plugin(["p.c"], 5), "output must be a path (a str or pathlib.Path), got int 5"),
        (lambda: pb.plugin(["p.c"], "x.so", include_dirs=[3]), "include_dirs must be a path"),
        (lambda: pb.plugin(["p.c"], "x.so", defines=[1]), "defines must be strings"),
        (lambda: pb.plugin(["p.c"], "x.so", jobs=0), "jobs must be a whole number of at least 1"),
        (lambda: pb.plugin(["p.c"], "x.so", kind=None), "kind must be a non-empty string"),
        (lambda: pb.plugin(["p.c"], "x.so", bogus=1), "unexpected keyword argument 'bogus'"),
        (lambda: pb.objects(None, "objs", archs=["x86_64"]), "source must be a path"),
        (lambda: pb.objects("f.c", "objs", archs=None), "archs must be a string or an int or a list of them"),
        (lambda: pb.objects("f.c", "objs", archs=["x86_64"], jobs=-1), "jobs must be a whole number of at least 1"),
        (lambda: pb.ptx("k.cu", object(), "ptx"), "sms must be a string or an int or a list of them"),
        (lambda: pb.ptx("k.cu", [80.5], "ptx"), "sms must be strings or ints"),
        (lambda: pb.compile(None, "x.vmfb"), "source must be a path"),
        (lambda: pb.compile("e.mlir", 7), "output must be a path"),
        (lambda: pb.compile("e.mlir", "x.vmfb", sm=[80]), "sm must be an sm"),
        (lambda: pb.run(None, "f"), "module must be a path"),
        (lambda: pb.run("m.vmfb", None), "function must be a non-empty string"),
        (lambda: pb.run("m.vmfb", "f", None), "inputs must be a list"),
        (lambda: pb.run("m.vmfb", "f", device=None), "device must be a non-empty string"),
        (lambda: pb.run("m.vmfb", "f", plugins=[None]), "plugins must be a path"),
        (lambda: pb.run("m.vmfb", "f", ["8xf32=1"], in_process=False, device=3), "device must be a non-empty string"),
        (lambda: pb.dump(None, "dumped"), "source must be a path"),
        (lambda: pb.dump("p.mlir", None), "output_dir must be a path"),
        (lambda: pb.dump("p.mlir", "dumped", force="yes"), "force must be True or False"),
        (lambda: pb.bench(None), "module must be a path"),
        (lambda: pb.bench("m.vmfb", inputs=None), "inputs must be a string or a list of them"),
        (lambda: pb.bench("m.vmfb", repetitions=0), "repetitions must be a whole number of at least 1"),
        (lambda: pb.new(None), "directory must be a path"),
        (lambda: pb.fatelf.read(None), "FatELF must be a path"),
        (lambda: pb.fatelf.write("x.sos", [3]), "ELF input must be a path"),
        (lambda: pb.fatelf.split("x.sos", None), "FatELF not found"),
    ],
)
def test_a_wrong_argument_is_a_pyree_error(call, fragment):
    with pytest.raises(pb.PyreeError) as info:
        call()
    assert fragment in info.value.render()


def test_one_item_where_a_list_is_taken_is_that_item():
    from pyree_build.core import args

    assert args.words(80, "sms") == ["80"] and args.words("sm_80", "sms") == ["sm_80"] and args.words([75, "80"], "sms") == ["75", "80"]
    assert args.paths("inc", "include_dirs") == [Path("inc")] and args.paths(Path("a b"), "x") == [Path("a b")]
    assert args.strings("NAME=1", "defines") == ["NAME=1"]


def test_run_passes_other_options_to_the_runner_checked(system_module):
    with pytest.raises(pb.PyreeError) as info:
        pb.run(system_module, "mixed_invocation", ["8xf32=2", "8xf32=4"], in_process=False, expect=[3])
    assert "expect must be strings" in info.value.render()
    with pytest.raises(pb.PyreeError) as info:
        pb.run(system_module, "mixed_invocation", [], bogus=True)
    assert "unexpected keyword argument 'bogus'" in info.value.render()


def test_a_source_given_as_one_string_is_one_path(tmp_path):
    with pytest.raises(pb.PyreeError) as info:
        pb.plugin(str(tmp_path / "p.c"), tmp_path / "x.so")
    assert info.value.what == "C source not found" and info.value.file == str(tmp_path / "p.c")  # not "p"

    src = tmp_path / "p.c"
    shutil.copy(PLUGIN_SAMPLE / "system_plugin.c", src)
    out = pb.plugin(str(src), tmp_path / "x.so")
    assert out.is_file()


def test_include_dirs_given_as_one_string_is_one_directory(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "factor.h").write_text("#define FACTOR 1\n")
    src = tmp_path / "p.c"
    src.write_text('#include "factor.h"\n' + (PLUGIN_SAMPLE / "system_plugin.c").read_text())
    out = pb.plugin([src], tmp_path / "x.so", include_dirs=str(inc), defines="UNUSED=1")
    assert out.is_file()


def test_fatelf_takes_one_elf_without_a_list(tmp_path):
    elf = pb.plugin(PLUGIN_SAMPLE / "standalone_plugin.c", tmp_path / "x.so", kind="standalone", archs="x86_64")
    out = pb.fatelf.write(tmp_path / "x.sos", str(elf))
    assert [r.arch for r in pb.fatelf.read(out)] == ["x86_64"]
    assert pb.fatelf.pack(elf) == out.read_bytes()


def test_one_arch_and_one_sm_need_no_list(tmp_path):
    outs = pb.objects(SAMPLES / "custom_dispatch" / "cpu" / "embedded" / "functions.c", tmp_path / "objs", archs="x86_64")
    assert [o.name for o in outs] == ["functions_x86_64.o"]


def test_ptx_takes_one_sm_as_an_int(tmp_path):
    from pyree_build.core import toolchain

    try:
        toolchain.nvrtc()
    except pb.PyreeError as exc:
        pytest.skip(f"no NVRTC: {exc.what}")
    kernels = SAMPLES / "custom_dispatch" / "cuda" / "kernels" / "kernels.cu"
    outs = pb.ptx(kernels, 80, tmp_path / "ptx")
    assert [o.name for o in outs] == ["kernels_sm_80.ptx"]


RUN_ONE_ARRAY = """
import sys, numpy as np, pyree_build as pb
module, plugin = sys.argv[1:]
(result,) = pb.run(module, "mixed_invocation", [np.full(8, 2, np.float32), "8xf32=4"], plugins=plugin)
print(result.tolist())
try:  # one spec is one input, so the function (which takes two) is called with one
    pb.run(module, "mixed_invocation", "8xf32=2", plugins=plugin)
except pb.PyreeError as err:
    print("PyreeError", err.what)
"""


def test_run_takes_one_input_spec_or_plugin_as_one(system_plugin, system_module):
    # In a child: IREE's runtime fixes a driver's plugins at its first in-process run.
    proc = subprocess.run([sys.executable, "-c", RUN_ONE_ARRAY, system_module, system_plugin], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == str([12.0] * 8)
    assert lines[1].startswith("PyreeError calling mixed_invocation failed"), lines


def test_out_of_process_run_takes_arrays_as_in_process_does(system_plugin, system_module):
    """issue 26 item 3: in_process=False took only spec strings; arrays go through .npy files."""
    inputs = [np.full(8, 2, np.float32), "8xf32=4"]
    out = pb.run(system_module, "mixed_invocation", inputs, plugins=[system_plugin], in_process=False)
    assert out[0].tolist() == [12.0] * 8
    with pytest.raises(pb.PyreeError) as info:
        pb.run(system_module, "mixed_invocation", [object(), "8xf32=4"], plugins=[system_plugin], in_process=False)
    assert "input 0 must be an array, a number or an --input spec string" in info.value.render()


def test_compile_returns_a_path_for_path_arguments(tmp_path):
    out = pb.compile(Path(PLUGIN_SAMPLE / "example.mlir"), str(tmp_path / "e.vmfb"))
    assert out.is_file()


def test_expect_imports_as_one_string_is_one_import_name(tmp_path):
    """`expect_imports="fma"` names the import fma, never 'f', 'm', 'a' (issue 26 item 4)."""
    with pytest.raises(pb.PyreeError) as caught:
        pb.compile(PLUGIN_SAMPLE / "example.mlir", tmp_path / "e.vmfb", expect_imports="fma")
    assert "'fma'" in caught.value.what and "'f'" not in caught.value.what
    assert pb.compile(PLUGIN_SAMPLE / "example.mlir", tmp_path / "e.vmfb", expect_imports="simple_mul_workgroup").is_file()


def test_target_options_must_be_a_mapping(tmp_path):
    with pytest.raises(pb.PyreeError, match="target_options must be a mapping"):
        pb.compile(PLUGIN_SAMPLE / "example.mlir", tmp_path / "e.vmfb", target_options=["cpu"])
    assert not (tmp_path / "e.vmfb").exists()
