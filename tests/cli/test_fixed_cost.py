"""Issue 17, item 2: what each command imports and builds is what its work needs.

No timings here (benchmarks/overhead.py measures them); these check the mechanisms that cut
the fixed cost, and that each gives the same answers as the slower way it replaced.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE, run_cli

from pyree_build.actions import results
from pyree_build.actions import run as run_action
from pyree_build.backends.llvm_cpu import elf as elfcheck
from pyree_build.backends.llvm_cpu import imports
from pyree_build.core.records import FrozenError, field, record

RUN_ARGS = ["--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4"]


def _imported(*args: object) -> set[str]:
    """The modules `python -m pyree_build ARGS` imported (-X importtime), after it succeeded, in
    process (PYREE_BUILD_SERVER=off: with the server, the client imports none of the CLI and
    the server has imported everything before it forks; tests/server/test_server.py checks the client)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pyree_build", *map(os.fspath, args)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT), PYREE_BUILD_SERVER="off"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {line.split("|")[2].strip() for line in proc.stderr.splitlines() if line.startswith("import time:") and line.count("|") == 2}


def test_run_with_a_plugin_imports_neither_numpy_nor_pyelftools_nor_cffi(system_module, system_plugin):
    names = _imported("run", system_module, *RUN_ARGS, "--plugin", system_plugin, "--expect", "8xf32=12 12 12 12 12 12 12 12")
    assert "pyree_build.backends.llvm_cpu.imports" in names  # the import check still ran
    for heavy in ("numpy", "elftools", "cffi", "dataclasses"):
        assert not any(n == heavy or n.startswith(heavy + ".") for n in names), heavy


def test_a_cache_hit_builds_one_parser_and_imports_no_pool(tmp_path):
    argv = ["plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", PLUGIN_SAMPLE / "standalone_plugin.c", "-o", tmp_path / "p.sos"]
    assert run_cli(*argv).returncode == 0
    names = _imported(*argv)
    assert "concurrent.futures" not in names and "dataclasses" not in names
    assert "pyree_build.cli.help_text" in names  # the verb's own parser got its help and examples


def test_a_command_line_builds_only_the_verb_it_names():
    from pyree_build import cli

    one = cli.build_parser("plugin")
    every = cli.build_parser()
    assert [name for name, _ in cli._parsers(one)] == ["", "plugin"]
    assert len(cli._parsers(every)) > 20
    assert cli.named_verb(["-j", "2", "-v", "plugin", "x.c"]) == "plugin"
    assert cli.named_verb(["--version"]) == ""
    assert cli.named_verb(["-h", "plugin"]) is None


def test_an_unknown_verb_still_lists_every_verb():
    result = run_cli("bogus")
    assert result.returncode == 2
    assert "invalid choice: 'bogus'" in result.stderr and "'doctor'" in result.stderr and "'plugin'" in result.stderr


@pytest.mark.parametrize(
    "dtype, declared",
    [("float16", "f16"), ("float32", "f32"), ("float64", "f64"), ("float64", "f32"), ("int8", "i8"), ("uint8", "ui8"),
     ("int16", "si16"), ("uint16", "ui16"), ("int32", "i32"), ("uint32", "ui32"), ("int64", "i64"), ("uint64", "ui64")],
)  # fmt: skip
@pytest.mark.parametrize("shape", [(), (1,), (8,), (2, 3), (2, 0), (2, 2, 3)])
def test_npy_results_print_as_numpy_would_print_them(dtype, declared, shape):
    rng = np.random.default_rng(len(shape))
    if dtype.startswith("float"):
        array = (rng.standard_normal(shape) * 1000).astype(dtype)
        if array.size:
            array.reshape(-1)[0] = np.inf
    else:
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    buffer = io.BytesIO()
    np.save(buffer, array)
    tensor = f"tensor<{''.join(f'{d}x' for d in shape)}{declared}>"
    assert results.npy_text(2, buffer.getvalue(), tensor) == results.format_result(2, array, tensor)


def test_npy_files_the_small_reader_does_not_know_go_to_numpy():
    for array in (np.asfortranarray(np.ones((2, 3), np.float32)), np.ones(3, ">f4"), np.ones(3, np.bool_)):
        buffer = io.BytesIO()
        np.save(buffer, array)
        assert results.npy_text(0, buffer.getvalue(), "tensor<3xf32>") is None
    assert results.npy_text(0, b"not numpy", "tensor<3xf32>") is None


def test_pb_run_outputs_are_still_arrays(system_module, system_plugin):
    result = run_action.run(system_module, "mixed_invocation", inputs=["8xf32=2", "8xf32=4"], plugins=[system_plugin])
    assert "8xf32=12 12 12 12 12 12 12 12" in result.stdout
    (out,) = result.outputs
    assert out.dtype == np.float32 and out.tolist() == [12.0] * 8


def _pyelftools_standalone(path: os.PathLike[str]) -> bool:
    saved = elfcheck._standalone_by_headers
    elfcheck._standalone_by_headers = lambda data: None  # force the pyelftools reading
    try:
        return elfcheck.is_standalone_elf(path)
    finally:
        elfcheck._standalone_by_headers = saved


def test_standalone_check_by_headers_agrees_with_pyelftools(tmp_path, system_plugin):
    assert run_cli("plugin", "--kind", "standalone", "--arch", "x86_64", PLUGIN_SAMPLE / "standalone_plugin.c", "-o", tmp_path / "s.so").returncode == 0
    assert run_cli("objects", "--arch", "x86_64", PLUGIN_SAMPLE.parent / "embedded" / "functions.c", "-o", tmp_path).returncode == 0
    cases = {tmp_path / "s.so": True, system_plugin: False, tmp_path / "functions_x86_64.o": False}
    for path, expected in cases.items():
        assert elfcheck._standalone_by_headers(path.read_bytes()) is expected, path
        assert _pyelftools_standalone(path) is expected, path


def test_module_imports_read_with_struct_match_pyelftools(system_module):
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection

    found = imports.module_imports(system_module)
    assert [(e.library, e.arch, e.required) for e in found] == [("plugin_sample_linked", "x86_64", ["simple_mul_workgroup"])]
    # The relocated pointers, as pyelftools reads them, for the same image.
    (image,) = [i for i in imports._elf_images(system_module.read_bytes())]
    elf = ELFFile(io.BytesIO(image))
    ours = imports._ElfImage(image).pointers
    count = sum(s.num_relocations() for s in elf.iter_sections() if isinstance(s, RelocationSection))
    assert count and len(ours) == count


def test_records_behave_as_frozen_dataclasses():
    @record(frozen=True)
    class Point:
        x: int
        y: int = 0
        tags: list[str] = field(default_factory=list)

    a, b = Point(1), Point(1)
    assert a == b and a != Point(1, 2) and repr(a).endswith("Point(x=1, y=0, tags=[])")
    assert a.tags is not b.tags
    assert hash(Point(1, 2, ())) == hash(Point(1, 2, ()))  # type: ignore[arg-type]
    with pytest.raises(FrozenError):
        a.x = 2  # type: ignore[misc]
    assert Point.y == 0  # a plain default stays a class attribute

    @record
    class Box:
        items: list[int] = field(default_factory=list)

    box = Box()
    box.items.append(1)
    assert Box().items == [] and box == Box([1])
    with pytest.raises(TypeError):
        hash(box)
