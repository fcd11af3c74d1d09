"""Issue 35 item 3: paths with `$`, `\\`, spaces and `#` in depfiles.

A depfile names each dependency escaped for Ninja and Make (`$$`, `\\ `, `\\#`). The
compiler's own depfile is read back unescaped (else every build looked for `a$$b`, found it
missing and never cached), and ours is written escaped once (else Ninja read `a$$b`). Checked
against the real reader: Ninja's `-t deps`, and a real cached build in such a directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from pyree_build.core.errors import PyreeError
from pyree_build.core.files import parse_depfile, write_depfile

REPO = Path(__file__).resolve().parents[2]
# Characters Ninja 1.11 reads in a depfile name (it splits names at `'"&;*?<>|^` and backquote,
# which no escape can carry), with the ones that need escaping heavily represented.
NINJA_READABLE = "ab$\\ #:%~()=@!,+-.[]{}é"
SHELL_AND_NINJA = NINJA_READABLE + "'\"&;*?<>|^`"


def _nameable(name: str) -> bool:
    return not name.endswith(("\\", ":")) and "\\:" not in name and "\\$" not in name


names = st.text(alphabet=SHELL_AND_NINJA, min_size=1, max_size=12).filter(_nameable)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(names, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts)), min_size=1, max_size=5))
def test_what_is_written_parses_back_to_the_same_paths(tmp_path_factory, deps):
    depfile = tmp_path_factory.mktemp("d") / "x.d"
    write_depfile(depfile, "/build/out $#\\ x", deps)
    assert parse_depfile(depfile) == list(dict.fromkeys(os.path.abspath(d) for d in deps))


ninja_names = st.text(alphabet=NINJA_READABLE, min_size=1, max_size=10).filter(lambda n: _nameable(n) and n.strip(" ") == n)


@pytest.mark.skipif(not any((Path(p) / "ninja").exists() for p in os.environ.get("PATH", "").split(os.pathsep)), reason="ninja is not installed")
@settings(max_examples=25, deadline=None)
@given(st.lists(ninja_names.map(lambda n: "/dep/" + n), min_size=1, max_size=4, unique=True))
def test_ninja_reads_each_written_path_as_itself(tmp_path_factory, deps):
    work = tmp_path_factory.mktemp("ninja")
    (work / "build.ninja").write_text(
        f"rule gen\n  command = {sys.executable} -c 'import sys; from pyree_build.core.files import write_depfile; "
        f'write_depfile("out.d", "out", sys.argv[1:]); open("out", "w")\' $args\n  depfile = out.d\n  deps = gcc\nbuild out: gen\n'
        "  args = " + " ".join("'" + d.replace("$", "$$").replace(" ", "$ ").replace(":", "$:") + "'" for d in deps) + "\n"
    )
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    subprocess.run(["ninja"], cwd=work, env=env, check=True, capture_output=True, timeout=60)
    shown = subprocess.run(["ninja", "-t", "deps"], cwd=work, capture_output=True, text=True, check=True, timeout=60).stdout
    written = list(dict.fromkeys(os.path.abspath(d) for d in deps))  # as write_depfile names them: '/dep/.' is '/dep'
    assert [line.strip() for line in shown.splitlines()[1:] if line.strip()] == written, shown


@pytest.mark.parametrize("bad", ["/a\nb", "/tab\tx", "/trailing\\", "/colon:", "/a\\:b", "/a\\$b"])
def test_a_path_no_depfile_can_name_is_a_clear_error(tmp_path, bad):
    with pytest.raises(PyreeError, match="a depfile cannot name this path"):
        write_depfile(tmp_path / "x.d", "/out", [bad])
    assert not (tmp_path / "x.d").exists()


def test_a_compilers_depfile_is_read_unescaped(tmp_path):
    (tmp_path / "x.d").write_text("out.o: /w/a$$b/h.h /w/c\\ d/e\\#f.h \\\n  /w/g\\h.h /w/i\\\\\\ j.h\n")
    assert parse_depfile(tmp_path / "x.d") == ["/w/a$b/h.h", "/w/c d/e#f.h", "/w/g\\h.h", "/w/i\\ j.h"]


# verb -> (source name, source text, argv after the source)
STEPS = {
    "objects": ("p.c", '#include "cfg$1.h"\nint f(int x) { return x * CFG; }\n', ["--arch", "x86_64", "-o", "out"]),
    "bitcode": ("k.cu", '#include "cfg$1.h"\nextern "C" __device__ int f(int x) { return x * CFG; }\n', ["--sm", "80", "-o", "out"]),
}


def _build(verb: str, work: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    name, _, argv = STEPS[verb]
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache), PYREE_BUILD_SERVER="off")
    return subprocess.run(
        [sys.executable, "-m", "pyree_build", verb, name, "-I", "inc", *argv, "--depfile", "out.d"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize("verb", sorted(STEPS))
def test_a_build_in_a_directory_with_metacharacters_is_cached_and_its_depfile_true(tmp_path, verb):
    name, text, _ = STEPS[verb]
    work = tmp_path / "a$b\\c d#e"
    (work / "inc").mkdir(parents=True)
    (work / "inc" / "cfg$1.h").write_text("#define CFG 3\n")
    (work / name).write_text(text)
    first = _build(verb, work, tmp_path / "cache")
    assert first.returncode == 0, first.stderr
    assert "not cached" not in first.stderr, first.stderr
    second = _build(verb, work, tmp_path / "cache")
    assert second.returncode == 0 and "cache hit" in second.stderr, second.stderr
    deps = parse_depfile(work / "out.d")
    assert str(work / "inc" / "cfg$1.h") in deps and str(work / name) in deps, deps
    assert all(Path(d).exists() for d in deps), [d for d in deps if not Path(d).exists()]
