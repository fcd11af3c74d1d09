"""Small promises the interface used to break: each wording and mode, checked as a user sees it."""

from __future__ import annotations

import os
import re
import stat

import pytest
from conftest import PLUGIN_SAMPLE, SAMPLES, assert_clean_error

from pyree_build.actions import bench

PROGRAM = SAMPLES / "substitution" / "program.mlir"


def test_new_creates_the_directory_with_the_usual_mode(cli, tmp_path):
    umask = os.umask(0o022)
    try:
        assert cli("new", tmp_path / "proj").returncode == 0
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "proj").stat().st_mode) == 0o755


def test_the_scaffold_names_only_files_that_exist(cli, tmp_path):
    project = tmp_path / "proj"
    assert cli("new", project).returncode == 0
    produced = {"proj_plugin.so", "proj_program.vmfb", "plugin.so", "program.vmfb", "executable_plugin.h", "stdlib.h"}
    for path in (p for p in project.rglob("*") if p.is_file()):
        text = path.read_text()
        for name in re.findall(r"\b[\w-]+\.(?:c|h|mlir|so|sos|vmfb)\b", text):
            assert (project / name).exists() or name in produced, f"{path.name} mentions {name}, which the project lacks"
        assert "load message" not in text and "every plugin in this folder" not in text


def test_the_ratio_is_the_ratio_of_the_printed_medians():
    result = bench.summarize("a.vmfb", "b.vmfb", [1.0, 3.0, 3.0], [2.0, 3.3, 3.9])
    assert result.ratio == pytest.approx(3.3 / 3.0)
    assert (result.ratio_min, result.ratio_max) == (pytest.approx(1.1), pytest.approx(2.0))
    assert "B/A = 1.100  (median B / median A; per-round B/A 1.100 to 2.000, 3 rounds)" in result.render()


def test_a_missing_plugin_in_bench_gets_runs_hint_without_the_json(cli, system_module):
    result = cli("bench", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4")
    assert_clean_error(result, "hint: the module's executables call imports that no plugin provided", "--plugin PATH")
    assert '"benchmarks"' not in result.stderr and len(result.stderr.splitlines()) < 30, result.stderr


def test_skip_unavailable_is_not_reported_as_an_error(cli, system_module):
    from pyree_build.backends.cuda import target as cuda_target

    if cuda_target.cuda_status()[0]:
        pytest.skip("a CUDA GPU is usable here")
    result = cli("run", system_module, "--function", "f", "--device", "cuda", "--skip-unavailable")
    assert result.returncode == 77 and result.stderr.startswith("skipped: "), result
    assert "error" not in result.stderr


def test_one_arch_is_not_packed_in_parallel_as_elfs(cli, tmp_path):
    result = cli("plugin", "--kind", "standalone", "--arch", "x86_64", PLUGIN_SAMPLE / "standalone_plugin.c",
                 "-D", f"UNIQUE_{tmp_path.name.replace('-', '_')}", "-o", tmp_path / "one.sos")  # fmt: skip
    assert result.returncode == 0, result
    assert "compile + link x86_64 (" in result.stderr and "pack 1 ELF into one.sos" in result.stderr, result.stderr
    assert "in parallel" not in result.stderr and "ELFs" not in result.stderr


def test_an_objects_undefined_symbol_is_explained_for_objects(cli, tmp_path):
    src = tmp_path / "needs_host.c"
    src.write_text("float host_scale(float);\nfloat f(float x) { return host_scale(x); }\n")
    result = cli("objects", src, "--arch", "x86_64", "-o", tmp_path / "objs")
    assert_clean_error(result, "undefined symbols: host_scale", "an object linked into a module can only call code it contains")
    assert "standalone plugin" not in result.stderr


def test_a_missing_export_names_the_output_not_a_temporary(cli, tmp_path):
    src = tmp_path / "no_export.c"
    src.write_text("int f(int x) { return x; }\n")
    out = tmp_path / "p.so"
    result = cli("plugin", "--kind", "system", src, "-o", out)
    assert_clean_error(result, f"error: {out}: does not export 'iree_hal_executable_plugin_query'")
    assert ".tmp" not in result.stderr and not out.exists()


@pytest.mark.slow
def test_samples_with_a_regex_that_matches_nothing_says_so_before_building(cli, tmp_path):
    result = cli("samples", "--build-dir", tmp_path / "b", "-R", "nomatch_at_all", timeout=600)
    assert_clean_error(result, "no test matches -R 'nomatch_at_all'", "the tests are:", "-R plugin")
    assert not list((tmp_path / "b").rglob("*.vmfb"))


@pytest.mark.slow
def test_the_wheel_needs_no_python_abi_and_its_one_compiled_file_is_the_typed_client(tmp_path):
    import shutil
    import subprocess
    import sys
    import zipfile

    from conftest import REPO

    from pyree_build.client import native

    pytest.importorskip("scikit_build_core")
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns("build", ".git", "__pycache__", "*.egg-info"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist"],
        cwd=src, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    typed = [n for n in names if n.endswith(".data/scripts/pyree-build")]
    assert len(typed) == 1, names
    if sys.platform.startswith("linux") and zipfile.ZipFile(wheel).read(typed[0])[:4] == b"\x7fELF":
        assert wheel.name.startswith("pyree_build-") and "-py3-none-linux_" in wheel.name, wheel.name
    else:  # no C compiler or not Linux: the typed command is the Python client
        assert zipfile.ZipFile(wheel).read(typed[0]).startswith(b"#!python\n")
    entry_points = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "pyree-build-py = pyree_build.server.client:main" in entry_points
    assert "pyree_build/share/cmake/pyree_build/pyree_buildConfig.cmake" in names
    assert "pyree_build/include/iree/hal/local/executable_plugin.h" in names
    # `--native-client DIR` (CMake's configure) builds from the package's own C files
    assert {f"pyree_build/client/{n}" for n in (*native.SOURCES, *native.HEADERS)} <= set(names), names
