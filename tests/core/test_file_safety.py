"""No user file is ever deleted or replaced except the output the user named (issue 13).

Each test reproduces one way pyree_build used to lose a file or print a traceback, and
checks the message, the exit code and that every user file is intact, byte for byte and
mode included.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, SAMPLES, assert_clean_error
from support.user_files import null_device, snapshot

PROGRAM = SAMPLES / "substitution" / "program.mlir"
FUNCTIONS = SAMPLES / "custom_dispatch" / "cpu" / "embedded" / "functions.c"


def assert_intact(before: dict[str, tuple], after: dict[str, tuple], *, allowed_new: tuple[str, ...] = ()) -> None:
    for name, entry in before.items():
        assert name in after, f"{name} was removed"
        assert after[name] == entry, f"{name} changed"
    extra = [n for n in after if n not in before and not n.startswith(allowed_new)] if allowed_new != ("*",) else []
    assert not extra, f"unexpected files: {extra}"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's directory: sources, a program, notes, a FIFO, a subdirectory."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(PLUGIN_SAMPLE / "system_plugin.c", work / "p.c")
    shutil.copy(PLUGIN_SAMPLE / "standalone_plugin.c", work / "s.c")
    shutil.copy(PLUGIN_SAMPLE / "example.mlir", work / "e.mlir")
    shutil.copy(FUNCTIONS, work / "f.c")
    (work / "notes.txt").write_text("my notes\n")
    (work / "notes.txt").chmod(0o640)
    (work / "sub").mkdir()
    (work / "sub" / "keep.txt").write_text("keep\n")
    os.mkfifo(work / "fifo")
    shutil.copy(SAMPLES / "custom_dispatch" / "vulkan" / "shaders" / "simple_mul.glsl", work / "k.glsl")
    shutil.copy(SAMPLES / "custom_dispatch" / "hip" / "kernels" / "kernels.cu", work / "k.cu")
    return work


# --- item 2: an input used as the output --------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["plugin", "--kind", "system", "p.c", "-o", "p.c"],
        ["plugin", "--kind", "standalone", "--arch", "x86_64", "s.c", "-o", "s.c"],
        ["compile", "e.mlir", "-o", "e.mlir"],
        ["plugin", "--kind", "system", "p.c", "-o", "x.so", "--depfile", "p.c"],
        ["compile", "e.mlir", "-o", "e.vmfb", "--depfile", "e.mlir"],
        ["objects", "f.c", "--arch", "x86_64", "-o", ".", "--depfile", "f.c"],
        ["spirv", "k.glsl", "-o", ".", "--depfile", "k.glsl"],
        ["hsaco", "k.cu", "--gfx", "942", "-o", ".", "--depfile", "k.cu"],
        ["bitcode", "k.cu", "--sm", "80", "-o", ".", "--depfile", "k.cu"],
    ],
    ids=[
        "plugin-system",
        "plugin-standalone",
        "compile",
        "depfile-source",
        "depfile-mlir",
        "objects-depfile",
        "spirv-depfile",
        "hsaco-depfile",
        "bitcode-depfile",
    ],
)
def test_an_input_as_output_is_refused_before_anything_is_touched(cli, project, argv):
    before = snapshot(project)
    result = cli(*argv, cwd=project)
    assert_clean_error(result, "is also an input", "never writes over its inputs")
    assert result.returncode == 1
    assert_intact(before, snapshot(project))


def test_a_header_the_source_includes_is_an_input_too(cli, project):
    (project / "inc").mkdir()
    (project / "inc" / "scale.h").write_text("#define SCALE 1\n")
    (project / "helper.h").write_text('#include "scale.h"\n')
    (project / "q.c").write_text('#include "helper.h"\n' + (project / "p.c").read_text())
    assert cli("plugin", "q.c", "-I", "inc", "-o", "q.so", cwd=project).returncode == 0  # cached now
    before = snapshot(project)
    # Directly and transitively included; the second would be a cache hit without the check.
    assert_clean_error(cli("plugin", "q.c", "-I", "inc", "-o", "helper.h", cwd=project), "is also an input (helper.h)")
    assert_clean_error(cli("plugin", "q.c", "-I", "inc", "-o", "inc/scale.h", cwd=project), "is also an input (inc/scale.h)")
    assert_intact(before, snapshot(project))


def test_the_depfile_naming_the_output_is_refused(cli, project):
    before = snapshot(project)
    result = cli("compile", "e.mlir", "-o", "e.vmfb", "--depfile", "e.vmfb", cwd=project)
    assert_clean_error(result, "the depfile and the output", "are the same file")
    assert_intact(before, snapshot(project))


def test_a_symlink_or_hard_link_to_an_input_is_the_input(cli, project):
    os.symlink("p.c", project / "link.so")
    os.link(project / "e.mlir", project / "hard.vmfb")
    before = snapshot(project)
    assert_clean_error(cli("plugin", "p.c", "-o", "link.so", cwd=project), "is also an input")
    assert_clean_error(cli("compile", "e.mlir", "-o", "hard.vmfb", cwd=project), "is also an input")
    # objects: DIR/<stem>_<arch>.o is a link to the source
    (project / "objs").mkdir()
    os.symlink("../f.c", project / "objs" / "f_x86_64.o")
    before = snapshot(project)
    assert_clean_error(cli("objects", "f.c", "--arch", "x86_64", "-o", "objs", cwd=project), "is also an input")
    assert_intact(before, snapshot(project))


def test_fatelf_outputs_never_replace_their_input(cli, project):
    assert cli("plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", "s.c", "-o", "s.sos", cwd=project).returncode == 0
    assert cli("fatelf", "select", "s.sos", "--arch", "x86_64", "-o", "x.so", cwd=project).returncode == 0
    before = snapshot(project)
    assert_clean_error(cli("fatelf", "join", "x.so", "-o", "x.so", cwd=project), "is also an input")
    assert_clean_error(cli("fatelf", "select", "s.sos", "-o", "s.sos", cwd=project), "is also an input")
    os.symlink("../s.sos", project / "sub" / "s_x86_64.so")
    before = snapshot(project)
    assert_clean_error(cli("fatelf", "split", "s.sos", "-o", "sub", cwd=project), "is also an input")
    assert_intact(before, snapshot(project))


# --- item 3: device nodes, FIFOs, directories -----------------------------------------------


@pytest.mark.parametrize("option", ["-o", "--depfile"])
def test_a_device_node_like_dev_null_is_never_replaced(cli, project, option):
    node = null_device(project)
    before = snapshot(project)
    node_before = os.stat(node)
    argv = ["plugin", "p.c", "-o", node] if option == "-o" else ["plugin", "p.c", "-o", "x.so", "--depfile", node]
    result = cli(*argv, cwd=project)
    assert_clean_error(result, str(node), "is a character device", "replaces only regular files")
    after = os.stat(node)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == node_before.st_rdev and after.st_ino == node_before.st_ino
    assert_intact(before, snapshot(project))


@pytest.mark.parametrize("option", ["-o", "--depfile"])
def test_a_fifo_is_never_replaced(cli, project, option):
    before = snapshot(project)
    argv = ["compile", "e.mlir", "-o", "fifo"] if option == "-o" else ["compile", "e.mlir", "-o", "e.vmfb", "--depfile", "fifo"]
    assert_clean_error(cli(*argv, cwd=project, timeout=120), "is a FIFO (named pipe)")
    assert_intact(before, snapshot(project))


# --- item 9: tracebacks turned into messages ------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["plugin", "p.c", "-o", "sub"], ["the output is an existing directory"]),
        (["compile", "e.mlir", "-o", "sub"], ["the output is an existing directory"]),
        (["plugin", "p.c", "-o", "notes.txt/x.so"], ["notes.txt is a file, not a directory"]),
        (["compile", "e.mlir", "-o", "notes.txt/deeper/x.vmfb"], ["notes.txt is a file, not a directory"]),
        (["objects", "f.c", "--arch", "x86_64", "-o", "notes.txt"], ["output directory exists and is a file"]),
        (["plugin", "p.c", "-o", "x.so", "--depfile", "sub"], ["the depfile is an existing directory"]),
        (["plugin", "p.c", "-o", "a" * 234 + ".so"], ["file name is 237 bytes long", "at most 215 bytes"]),
        (["compile", "e.mlir", "-o", "b" * 250 + ".vmfb"], ["file name is 255 bytes long"]),
        (["new", "notes.txt"], ["project directory exists and is a file"]),
        (["dump", "e.mlir", "-o", "notes.txt"], ["is a file, not a directory"]),
    ],
    ids=["plugin-dir", "compile-dir", "parent-file", "grandparent-file", "objects-file", "depfile-dir", "long-234", "long-255", "new-file", "dump-file"],
)
def test_bad_output_paths_get_a_message(cli, project, argv, fragments):
    before = snapshot(project)
    result = cli(*argv, cwd=project)
    assert_clean_error(result, *fragments)
    assert result.returncode == 1
    assert_intact(before, snapshot(project))


def test_the_longest_accepted_name_builds(cli, project):
    name = "c" * 212 + ".so"  # 215 bytes: the limit the message names
    result = cli("plugin", "p.c", "-o", name, "--depfile", "c" * 213 + ".d", cwd=project, timeout=300)
    assert result.returncode == 0, result
    assert (project / name).is_file()


@pytest.mark.parametrize("jobs", ["-1", "0", "two"])
@pytest.mark.parametrize("verb", ["plugin", "objects", "ptx"])
def test_jobs_must_be_at_least_one(cli, project, verb, jobs):
    argv = {
        "plugin": ["plugin", "p.c", "-o", "x.so"],
        "objects": ["objects", "f.c", "--arch", "x86_64", "-o", "objs"],
        "ptx": ["ptx", "k.cu", "--sm", "80", "-o", "ptx"],
    }[verb]
    before = snapshot(project)
    result = cli(*argv, "-j", jobs, cwd=project)
    assert result.returncode == 2 and "Traceback" not in result.output, result
    assert "-j/--jobs" in result.stderr and ("at least 1" in result.stderr or "not a whole number" in result.stderr)
    assert_intact(before, snapshot(project))


def test_fatelf_list_into_a_closed_pipe_exits_quietly(cli, project):
    assert cli("plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", "s.c", "-o", "s.sos", cwd=project).returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away, as `| head` does
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pyree_build", "fatelf", "list", "s.sos"], cwd=project, stdout=write_end, stderr=subprocess.PIPE,
            text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports `cat | head`


def test_a_stale_temporary_with_a_huge_pid_is_swept(cli, project):
    stale = project / ".x.so.99999999999999999999999-abcdef01.tmp"
    stale.write_bytes(b"left by a writer that is gone")
    env_off = {"PYREE_BUILD_CACHE": "off"}
    proc = subprocess.run(
        [sys.executable, "-m", "pyree_build", "plugin", "p.c", "-o", "x.so"], cwd=project, capture_output=True, text=True,
        env={**os.environ, **env_off}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert not stale.exists() and (project / "x.so").is_file()


def test_new_force_never_leaves_a_half_written_project(cli, project):
    target = project / "proj"
    target.mkdir()
    (target / "plugin.c").mkdir()  # in the way of a file `new` writes
    (target / "CMakeLists.txt").write_text("# mine\n")
    before = snapshot(project)
    result = cli("new", "proj", "--force", cwd=project)
    assert_clean_error(result, "plugin.c", "the output is an existing directory")
    assert_intact(before, snapshot(project))  # nothing written: CMakeLists.txt is still the user's


def test_new_writes_a_project_with_the_usual_mode(cli, project):
    assert cli("new", "fresh", cwd=project).returncode == 0
    assert stat.S_IMODE((project / "fresh").stat().st_mode) == 0o777 & ~_umask()  # not mkdtemp's 0700


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- item 1: dump writes only its own files --------------------------------------------------


def test_dump_into_a_project_never_deletes_it(cli, project):
    """A directory holding any index.json used to be deleted whole."""
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "index.json").write_text("[]\n")  # someone else's index.json
    shutil.copy(PROGRAM, project / "program.mlir")
    before = snapshot(project)
    result = cli("dump", project / "program.mlir", "-o", "work", cwd=project.parent)  # not the cwd, which was refused
    assert_clean_error(result, "not written by pyree_build: index.json", "--force")
    assert_intact(before, snapshot(project))
    (project / "index.json").unlink()
    before = snapshot(project)
    result = cli("dump", "program.mlir", "-o", ".", "-q", cwd=project)  # the cwd itself is fine too
    assert result.returncode == 0, result
    assert_intact(before, snapshot(project), allowed_new=("*",))
    assert (project / "index.json").is_file() and (project / "module_main_dispatch_0.mlir").is_file()


def test_redump_over_edited_files_refuses_unless_forced(cli, tmp_path):
    out = tmp_path / "dumped"
    assert cli("dump", PROGRAM, "-o", out, "-q").returncode == 0
    edited = out / "module_main_dispatch_0.mlir"
    edited.write_text(edited.read_text() + "// my edit\n")
    (out / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    result = cli("dump", PROGRAM, "-o", out)
    assert_clean_error(result, "edited since pyree_build wrote them: module_main_dispatch_0.mlir", "--force")
    assert result.returncode == 1
    assert_intact(before, snapshot(tmp_path))

    # an unchanged earlier dump is replaced quietly; edits need --force
    result = cli("dump", PROGRAM, "-o", out, "--force", "-q")
    assert result.returncode == 0, result
    assert "my edit" not in edited.read_text()
    assert (out / "notes.txt").read_text() == "mine\n"
    assert cli("dump", PROGRAM, "-o", out, "-q").returncode == 0


def test_dump_removes_only_unchanged_files_it_wrote(cli, tmp_path):
    out = tmp_path / "dumped"
    assert cli("dump", PROGRAM, "-o", out, "-q").returncode == 0
    import json

    manifest = json.loads((out / ".pyree_build-written.json").read_text())
    # Pretend an earlier dump wrote two more files: one unchanged since, one edited since.
    for name, text in (("gone.mlir", "old"), ("edited.mlir", "old")):
        (out / name).write_text(text)
        import hashlib

        manifest["files"][name] = [hashlib.sha256(text.encode()).hexdigest()]
    (out / ".pyree_build-written.json").write_text(json.dumps(manifest))
    (out / "edited.mlir").write_text("changed by the user")
    assert cli("dump", PROGRAM, "-o", out, "-q").returncode == 0
    assert not (out / "gone.mlir").exists()
    assert (out / "edited.mlir").read_text() == "changed by the user"


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_dump_never_replaces_a_directory_or_fifo_even_forced(cli, tmp_path, kind):
    out = tmp_path / "dumped"
    out.mkdir()
    obstacle = out / "module_main_dispatch_0.mlir"
    obstacle.mkdir() if kind == "directory" else os.mkfifo(obstacle)
    before = snapshot(tmp_path)
    for force in ([], ["--force"]):
        result = cli("dump", PROGRAM, "-o", out, *force, timeout=120)
        assert_clean_error(result, "module_main_dispatch_0.mlir", "existing directory" if kind == "directory" else "is a FIFO")
        assert_intact(before, snapshot(tmp_path))


def test_a_failed_first_dump_leaves_no_directory(cli, tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("this is not MLIR\n")
    result = cli("dump", bad, "-o", tmp_path / "dumped")
    assert_clean_error(result, "bad.mlir")
    assert not (tmp_path / "dumped").exists()
