"""Issue 35: user files are never lost or overwritten. An output is replaced only once its new
bytes are complete and checked against what the tool reported reading, whatever a scan before
the build missed; a failed build leaves every file as it was. Real tools throughout."""

from __future__ import annotations

import shutil

import pytest
from conftest import PLUGIN_SAMPLE, SAMPLES, assert_clean_error
from hypothesis import given, settings
from hypothesis import strategies as st

from pyree_build.core import files

EMBEDDED = SAMPLES / "custom_dispatch" / "cpu" / "embedded"
HEADER = "#define PYREE_TEST_CONFIG 1\n"


# Each names cfg.h in a way a textual scan does not see, and the compiler does.
@pytest.mark.parametrize(
    ("include", "defines"),
    [
        ("#include CONFIG_HEADER\n", ["-D", 'CONFIG_HEADER="cfg.h"']),
        ('/* c */ #include "cfg.h"\n', []),
        ('#inc\\\nlude "cfg.h"\n', []),
    ],
    ids=["macro", "comment-before", "line-continuation"],
)
def test_an_output_the_compiler_read_is_refused_after_the_build_and_left_as_it_was(cli, tmp_path, include, defines):
    src = tmp_path / "src.c"
    src.write_text(include + (PLUGIN_SAMPLE / "system_plugin.c").read_text())
    cfg = tmp_path / "cfg.h"
    cfg.write_text(HEADER)
    result = cli("plugin", "--kind", "system", src, "-I", PLUGIN_SAMPLE, *defines, "-o", cfg)
    assert_clean_error(result, "cfg.h")
    assert cfg.read_text() == HEADER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.h", "src.c"]  # no temporaries left


def test_a_compile_output_that_is_an_object_it_links_is_refused_and_kept(cli, tmp_path):
    objs = tmp_path / "objs"
    assert cli("objects", EMBEDDED / "functions.c", "--arch", "x86_64", "-o", objs).returncode == 0
    obj = objs / "functions_x86_64.o"
    before = obj.read_bytes()
    result = cli("compile", EMBEDDED / "example.mlir", "-o", obj, "--", f"--iree-hal-executable-object-search-path={objs}")
    assert_clean_error(result, "functions_x86_64.o", "read")
    assert obj.read_bytes() == before
    assert sorted(p.name for p in objs.iterdir()) == ["functions_x86_64.o"]


def test_a_failed_rebuild_leaves_the_earlier_output_as_it_was(cli, tmp_path):
    src = tmp_path / "plugin.c"
    shutil.copy(PLUGIN_SAMPLE / "system_plugin.c", src)
    out = tmp_path / "p.so"
    assert cli("plugin", "--kind", "system", src, "-I", PLUGIN_SAMPLE, "-o", out).returncode == 0
    built = out.read_bytes()
    src.write_text("this is not C\n")
    assert_clean_error(cli("plugin", "--kind", "system", src, "-o", out), "plugin.c:1:")
    # Untouched, so older than its source: a build system runs the step again next time.
    assert out.read_bytes() == built and out.stat().st_mtime_ns <= src.stat().st_mtime_ns


def test_a_failed_verb_leaves_no_temporaries_and_no_directory_it_made(cli, tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("int f(void) { return missing; }\n")
    for _ in range(3):
        result = cli("objects", bad, "--arch", "x86_64", "--arch", "aarch64", "-o", tmp_path / "made" / "objs")
        assert_clean_error(result, "bad.c:1:")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.c"]  # no .bad_x86_64.o.PID-RAND.d, no made/objs/
    (tmp_path / "keep").mkdir()
    result = cli("compile", tmp_path / "bad.c", "-o", tmp_path / "keep" / "new" / "m.vmfb")
    assert result.returncode != 0
    assert list((tmp_path / "keep").iterdir()) == []  # keep/ was the user's: it stays; new/ was made for the output: gone


def test_temporaries_of_a_killed_build_are_swept_by_the_next_build_into_that_directory(cli, tmp_path):
    dead = 2**22 + 12345  # above pid_max: no process has it
    left = [f".t.so.{dead}-0123abcd.build", f".functions_x86_64.o.{dead}-89abcdef.d", f".t.so.{dead}-fedcba98-a1b2c3.tmp"]
    (tmp_path / left[0]).mkdir()
    (tmp_path / left[0] / "0_t.o").write_bytes(b"half")
    for name in left[1:]:
        (tmp_path / name).write_bytes(b"half")
    mine = [".notes.2024-deadbeef.txt", ".t.so.123-abc.build"]  # not of the form: never touched
    for name in mine:
        (tmp_path / name).write_text("mine")
    assert cli("plugin", "--kind", "system", PLUGIN_SAMPLE / "system_plugin.c", "-o", tmp_path / "other.so").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*mine, "other.so"])


# Shell and Ninja/Make metacharacters (no newline: no depfile format can hold one).
PATH_CHARS = st.sampled_from(list("ab.-_ $#:;&|'\"\\*?[]{}()<>=%!~`@,^") + ["é", "😀"])


def _nameable(name: str) -> bool:
    """What a depfile can name at all (tests/core/test_depfile_paths.py: the others are a clear error)."""
    return name not in (".", "..") and not name.endswith(("\\", ":")) and "\\:" not in name and "\\$" not in name


@given(st.lists(st.text(PATH_CHARS, min_size=1, max_size=12).filter(_nameable), min_size=1, max_size=5, unique=True))
@settings(max_examples=300, deadline=None)
def test_a_depfile_reads_back_every_path_it_was_written_with(tmp_path_factory, names):
    where = tmp_path_factory.mktemp("dep")
    deps = [str(where / n) for n in names]
    files.write_depfile(where / "out.d", where / names[0], deps)
    assert files.parse_depfile(where / "out.d") == deps


def test_a_build_with_metacharacters_in_every_path_names_its_source_in_the_depfile(cli, tmp_path):
    sub = tmp_path / "my $dir #1 ;&"
    sub.mkdir()
    src = sub / "plug in $x #y.c"
    shutil.copy(PLUGIN_SAMPLE / "system_plugin.c", src)
    out, dep = sub / "out $(rm -rf x) #.so", sub / "dep $1 #.d"
    assert cli("plugin", "--kind", "system", src, "-I", PLUGIN_SAMPLE, "--depfile", dep, "-o", out).returncode == 0
    assert out.is_file() and str(src) in files.parse_depfile(dep)
