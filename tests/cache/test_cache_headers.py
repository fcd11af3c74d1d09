"""Cache keys see every header lookup (issue 22): a header that appears earlier on the include
path, or the file a `__has_include` tests, changes the output; with the cache on the output is
byte for byte the one an uncached build makes, for every C-family action."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

USE = {
    # Kept (and exported) even where a build drops what no one calls (a standalone plugin).
    "c": '__attribute__((used, visibility("default"))) int pyree_cfg_value(void) { return CFG + EXTRA; }\n',
    "cu": 'extern "C" __global__ void pyree_cfg_kernel(int* out) { out[0] = CFG + EXTRA; }\n',
    "bc": 'extern "C" __device__ int pyree_cfg_value(void) { return CFG + EXTRA; }\n',
}
HEADER_LOGIC = '#include "cfg.h"\n#if __has_include("extra.h")\n#include "extra.h"\n#else\n#define EXTRA 0\n#endif\n'

# action -> (source name, source text, argv after the source; {out} is the output)
ACTIONS = {
    "objects": ("p.c", HEADER_LOGIC + USE["c"], ["objects", "--arch", "x86_64", "-o", "{out}"]),
    "system plugin": ("p.c", HEADER_LOGIC + (PLUGIN_SAMPLE / "system_plugin.c").read_text() + USE["c"], ["plugin", "--kind", "system", "-o", "{out}/p.so"]),
    "standalone plugin": (
        "p.c", HEADER_LOGIC + (PLUGIN_SAMPLE / "standalone_plugin.c").read_text() + USE["c"],
        ["plugin", "--kind", "standalone", "--arch", "x86_64", "-o", "{out}/p.so"],
    ),
    "bitcode": ("k.cu", HEADER_LOGIC + USE["bc"], ["bitcode", "--sm", "80", "-o", "{out}"]),
    "ptx (nvrtc)": ("k.cu", HEADER_LOGIC + USE["cu"], ["ptx", "--sm", "80", "-o", "{out}"]),
    "hsaco": ("k.cu", "#include <hip/hip_runtime.h>\n" + HEADER_LOGIC + USE["cu"], ["hsaco", "--gfx", "942", "-o", "{out}"]),
}  # fmt: skip


def _build(work: Path, cache: str, argv: list[str], source: str, out: str) -> dict[str, bytes]:
    env = dict(os.environ, PYREE_BUILD_CACHE=cache, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    args = [a.replace("{out}", out) for a in argv]
    result = subprocess.run(
        [sys.executable, "-m", "pyree_build", args[0], source, *args[1:], "-I", "inc1", "-I", "inc2"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return {p.relative_to(work / out).as_posix(): p.read_bytes() for p in sorted((work / out).rglob("*")) if p.is_file() and not p.name.startswith(".")}


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_header_that_appears_is_never_a_stale_hit(tmp_path, action):
    name, text, argv = ACTIONS[action]
    work = tmp_path / "work"
    (work / "inc1").mkdir(parents=True)
    (work / "inc2").mkdir()
    (work / name).write_text(text)
    (work / "inc2" / "cfg.h").write_text("#define CFG 1\n")
    cache = str(tmp_path / "cache")
    first = _build(work, cache, argv, name, "first")
    # Shadowed: inc1 comes before inc2 on the search path.
    (work / "inc1" / "cfg.h").write_text("#define CFG 2\n")
    shadowed = _build(work, cache, argv, name, "shadowed")
    assert shadowed == _build(work, "off", argv, name, "shadowed_uncached")
    assert shadowed != first
    # Appeared: the file `__has_include` tests, next to the source.
    (work / "extra.h").write_text("#define EXTRA 40\n")
    appeared = _build(work, cache, argv, name, "appeared")
    assert appeared == _build(work, "off", argv, name, "appeared_uncached")
    assert appeared != shadowed
    # Gone again: back to the shadowed output, from the cache.
    (work / "extra.h").unlink()
    assert _build(work, cache, argv, name, "again") == shadowed


def test_spirv_sees_a_glsl_include_that_appears_earlier(tmp_path):
    work = tmp_path / "work"
    (work / "inc1").mkdir(parents=True)
    (work / "inc2").mkdir()
    shader = '#version 450\n#extension GL_GOOGLE_include_directive : require\n#include "cfg.h"\nlayout(local_size_x = 1) in;\nlayout(set = 0, binding = 0) buffer B { float v[]; };\nvoid main() { v[0] = CFG; }\n'
    (work / "s.glsl").write_text(shader)
    (work / "inc2" / "cfg.h").write_text("#define CFG 1.0\n")
    cache = str(tmp_path / "cache")
    argv = ["spirv", "-o", "{out}"]
    first = _build(work, cache, argv, "s.glsl", "first")
    (work / "inc1" / "cfg.h").write_text("#define CFG 2.0\n")
    shadowed = _build(work, cache, argv, "s.glsl", "shadowed")
    assert shadowed == _build(work, "off", argv, "s.glsl", "uncached") and shadowed != first


def test_ninja_reruns_the_step_when_a_shadowing_header_appears(tmp_path):
    """issue 22 item 2: the depfile names the directories searched, so a header created in an
    earlier include directory reruns the step (a list of found files cannot say this)."""
    from support.cmake_projects import build, configure, write_project

    src, out = tmp_path / "src", tmp_path / "build"
    (src / "inc1").mkdir(parents=True)
    (src / "inc2").mkdir()
    (src / "p.c").write_text(HEADER_LOGIC + USE["c"])
    (src / "inc2" / "cfg.h").write_text("#define CFG 1\n")
    write_project(src, "headers", "pyree_cpu_objects(NAME objs SRCS p.c ARCHS x86_64 INCLUDE_DIRS inc1 inc2)\n", {})
    configure(src, out)
    build(out, "objs")
    made = out / "objs" / "p_x86_64.o"
    first = made.read_bytes()
    assert "no work to do" in build(out, "objs")
    # Each change below reruns the step, and the object is the one an uncached build makes.
    changes = [
        lambda: (src / "inc1" / "cfg.h").write_text("#define CFG 2\n"),  # shadows inc2/cfg.h
        lambda: (src / "extra.h").write_text("#define EXTRA 40\n"),  # the __has_include target appears
        lambda: (src / "inc1" / "cfg.h").unlink(),  # gone: inc2/cfg.h again
    ]
    seen = [first]
    for step, change in enumerate(changes):
        change()
        build(out, "objs")
        expected = _build(src, "off", ACTIONS["objects"][2], "p.c", f"uncached{step}")["p_x86_64.o"]
        assert made.read_bytes() == expected, step
        assert made.read_bytes() not in seen, step
        seen.append(made.read_bytes())


# Sequences of header moves: cfg.h created, deleted or moved between the include directories
# (two contents), and the `__has_include` target toggled; each build with the cache on is
# byte-identical to one without. PYREE_FUZZ_EXAMPLES raises the count for a longer run.
FUZZ_EXAMPLES = int(os.environ.get("PYREE_FUZZ_EXAMPLES", "3"))
MOVES = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(["inc1", "inc2", "."]), st.sampled_from(["1", "2"])),
        st.tuples(st.just("remove"), st.sampled_from(["inc1", "inc2", "."]), st.just("")),
        st.tuples(st.just("toggle extra"), st.just(""), st.sampled_from(["40", "50"])),
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.parametrize("action", sorted(ACTIONS))
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(moves=MOVES)
def test_header_moves_match_uncached_builds(tmp_path_factory, action, moves):
    name, text, argv = ACTIONS[action]
    work = tmp_path_factory.mktemp("moves")
    (work / "inc1").mkdir()
    (work / "inc2").mkdir()
    (work / name).write_text(text)
    (work / "inc2" / "cfg.h").write_text("#define CFG 1\n")
    cache = str(work / "cache")
    for step, (kind, where, value) in enumerate(moves):
        if kind == "put":
            (work / where / "cfg.h").write_text(f"#define CFG {value}\n")
        elif kind == "remove" and sum((work / d / "cfg.h").exists() for d in ("inc1", "inc2", ".")) > 1:
            (work / where / "cfg.h").unlink(missing_ok=True)  # one cfg.h always stays, so every build compiles
        elif kind == "toggle extra":
            extra = work / "extra.h"
            extra.unlink() if extra.exists() else extra.write_text(f"#define EXTRA {value}\n")
        assert _build(work, cache, argv, name, f"on{step}") == _build(work, "off", argv, name, f"off{step}"), moves[: step + 1]


def _objects(work: Path, cache: str, out: str, dirs: list[str]) -> tuple[bytes, str]:
    env = dict(os.environ, PYREE_BUILD_CACHE=cache, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    includes = [x for d in dirs for x in ("-I", d)]
    result = subprocess.run(
        [sys.executable, "-m", "pyree_build", "objects", "p.c", "--arch", "x86_64", *includes, "-o", out, "--depfile", f"{out}.d"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return (work / out / "p_x86_64.o").read_bytes(), result.stderr


def test_include_next_sees_a_header_that_appears_between(tmp_path):
    work = tmp_path / "w"
    for d in ("inc1", "inc2", "inc3"):
        (work / d).mkdir(parents=True)
    (work / "p.c").write_text('#include "wrap.h"\n' + USE["c"].replace("CFG + EXTRA", "CFG"))
    (work / "inc1" / "wrap.h").write_text("#include_next <wrap.h>\n")
    (work / "inc3" / "wrap.h").write_text("#define CFG 1\n")
    cache, dirs = str(tmp_path / "cache"), ["inc1", "inc2", "inc3"]
    first, _ = _objects(work, cache, "a", dirs)
    (work / "inc2" / "wrap.h").write_text("#define CFG 2\n")  # now what inc1's #include_next finds
    second, log = _objects(work, cache, "b", dirs)
    assert second == _objects(work, "off", "c", dirs)[0] and second != first, log


def test_an_include_through_a_macro_is_never_cached(tmp_path):
    work = tmp_path / "w"
    (work / "inc1").mkdir(parents=True)
    (work / "p.c").write_text('#define HEADER "cfg.h"\n#include HEADER\n#if __has_include(HEADER)\n#endif\n' + USE["c"].replace("CFG + EXTRA", "CFG"))
    (work / "inc1" / "cfg.h").write_text("#define CFG 1\n")
    cache = str(tmp_path / "cache")
    _objects(work, cache, "a", ["inc1"])
    _, log = _objects(work, cache, "b", ["inc1"])
    assert "cache hit" not in log and "through a macro" in log, log


def test_the_depfile_names_the_subdirectory_a_header_would_appear_in(tmp_path):
    work = tmp_path / "w"
    (work / "inc1" / "sub").mkdir(parents=True)
    (work / "inc2" / "sub").mkdir(parents=True)
    (work / "p.c").write_text('#include "sub/cfg.h"\n' + USE["c"].replace("CFG + EXTRA", "CFG"))
    (work / "inc2" / "sub" / "cfg.h").write_text("#define CFG 1\n")
    _objects(work, str(tmp_path / "cache"), "a", ["inc1", "inc2"])
    depfile = (work / "a.d").read_text()
    assert str(work / "inc1" / "sub") + " " in depfile.replace("\\\n", " ") + " ", depfile
