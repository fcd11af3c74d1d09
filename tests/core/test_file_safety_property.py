"""File-safety property (issue 13): any sequence of verbs over a directory of user files
never changes a file it was not asked to write.

Hypothesis draws verbs (plugin system/standalone, objects, compile, fatelf join/select/split,
dump, with and without --depfile) whose outputs point at inputs, at symlinks and hard links
of inputs, at each other, at directories, at a FIFO, at a null device, at the parent directory
and below a file. After every step each user file must be as it was, byte for byte and mode,
unless that step named exactly that path as a file output and succeeded (a failed step leaves
every file as it was: an output is replaced only by complete, checked new bytes). The verbs run
in this process through the CLI's main(), so any exception other than a clean exit fails.

Bounded by default (well under a minute); PYREE_FUZZ_EXAMPLES=200 for a longer run.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, SAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.user_files import null_device, snapshot

EXAMPLES = int(os.environ.get("PYREE_FUZZ_EXAMPLES", "10"))

FILE_TARGETS = [
    "p.c", "s.c", "e.mlir", "f.c", "a.sos", "x.so", "notes.txt", "fifo", "sub", "sub/keep.txt", "link.c", "hard.mlir",
    ".", "..", "null", "notes.txt/y.so", "out/o1.so", "out/o2.vmfb", "out/o3.sos", "o4.d", "o5.d",
]  # fmt: skip
DIR_TARGETS = ["objs", "sub", ".", "..", "out", "notes.txt", "fifo", "p.c", "null"]
VERBS = ["plugin-system", "plugin-standalone", "objects", "compile", "join", "select", "split", "dump"]
DIR_VERBS = {"objects", "split", "dump"}


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FatELF and a plain ELF, for the fatelf verbs to read."""
    import pyree_build as pb

    d = tmp_path_factory.mktemp("prebuilt")
    pb.plugin([PLUGIN_SAMPLE / "standalone_plugin.c"], d / "a.sos", kind="standalone", archs=["x86_64", "aarch64"])
    pb.plugin([PLUGIN_SAMPLE / "standalone_plugin.c"], d / "x.so", kind="standalone", archs=["x86_64"])
    return d


def _populate(work: Path, prebuilt: Path) -> None:
    shutil.copy(PLUGIN_SAMPLE / "system_plugin.c", work / "p.c")
    shutil.copy(PLUGIN_SAMPLE / "standalone_plugin.c", work / "s.c")
    shutil.copy(SAMPLES / "substitution" / "program.mlir", work / "e.mlir")
    shutil.copy(SAMPLES / "custom_dispatch" / "cpu" / "embedded" / "functions.c", work / "f.c")
    shutil.copy(prebuilt / "a.sos", work / "a.sos")
    shutil.copy(prebuilt / "x.so", work / "x.so")
    (work / "notes.txt").write_text("my notes\n")
    (work / "notes.txt").chmod(0o600)
    (work / "sub").mkdir()
    (work / "sub" / "keep.txt").write_text("keep\n")
    os.mkfifo(work / "fifo")
    os.symlink("p.c", work / "link.c")
    os.link(work / "e.mlir", work / "hard.mlir")
    if null_device(work) != work / "null":  # not root: a link to /dev/null, which cannot be replaced
        os.symlink("/dev/null", work / "null")


def _argv(verb: str, out: str, depfile: str | None, alias: bool) -> list[str]:
    dep = ["--depfile", depfile] if depfile else []
    return {
        "plugin-system": ["plugin", "--kind", "system", "link.c" if alias else "p.c", "-o", out, *dep],
        "plugin-standalone": ["plugin", "--kind", "standalone", "--arch", "x86_64", "s.c", "-o", out, *dep],
        "objects": ["objects", "f.c", "--arch", "x86_64", "-o", out, *dep],
        "compile": ["compile", "hard.mlir" if alias else "e.mlir", "-o", out, *dep],
        "join": ["fatelf", "join", "x.so", "-o", out],
        "select": ["fatelf", "select", "a.sos", "--arch", "x86_64", "-o", out],
        "split": ["fatelf", "split", "a.sos", "-o", out],
        "dump": ["dump", "e.mlir", "-o", out],
    }[verb]


def _named_files(verb: str, out: str, depfile: str | None) -> set[str]:
    """The paths (as named, relative to work) a successful step was asked to write."""
    named = {depfile} if depfile else set()
    if verb == "objects":
        return named | {os.path.normpath(f"{out}/f_x86_64.o")}
    if verb == "split":
        return {os.path.normpath(f"{out}/a_x86_64.so"), os.path.normpath(f"{out}/a_aarch64.so")}
    if verb == "dump":
        return set()  # a dump may add files, never change one it did not write
    return named | {os.path.normpath(out)}


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, str, str | None, bool]]:
    out = []
    for _ in range(draw(st.integers(1, 4))):
        verb = draw(st.sampled_from(VERBS))
        target = draw(st.sampled_from(DIR_TARGETS if verb in DIR_VERBS else FILE_TARGETS))
        takes_depfile = verb in ("plugin-system", "plugin-standalone", "objects", "compile")
        depfile = draw(st.none() | st.sampled_from(FILE_TARGETS)) if takes_depfile else None
        out.append((verb, target, depfile, draw(st.booleans())))
    return out


def _main(argv: list[str]) -> int:
    from pyree_build.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return main([*argv, "-q"])
        except SystemExit as exc:  # argparse usage errors
            return int(exc.code or 0)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sequence=steps())
def test_no_verb_changes_a_file_it_was_not_asked_to_write(prebuilt, sequence):
    root = Path(tempfile.mkdtemp(prefix="pyree-safety."))
    work = root / "work"
    work.mkdir()
    _populate(work, prebuilt)
    user = {f"work/{k}": v for k, v in snapshot(work).items()}
    released: set[str] = set()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for verb, target, depfile, alias in sequence:
            argv = _argv(verb, target, depfile, alias)
            code = _main(argv)
            named = {os.path.normpath(f"work/{p}") for p in _named_files(verb, target, depfile)}
            now = snapshot(root)
            if code == 0:
                released |= named
            for name, entry in user.items():
                if name in released:
                    continue
                assert name in now, f"{name} was removed by {argv} (exit {code}); steps: {sequence}"
                assert now[name] == entry, f"{name} was changed by {argv} (exit {code}); steps: {sequence}"
    finally:
        os.chdir(cwd)
        shutil.rmtree(root, ignore_errors=True)
