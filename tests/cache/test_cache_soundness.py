"""The cache never serves a wrong output: for every action and every file it reads, an
edit gives exactly the bytes a build with the cache off gives (differential tests), also
for random sequences of edits and reverts; races forced through the cache's pause hook;
and a cache directory full of junk is a miss, never a crash or a deletion elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE, SAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EMBEDDED = SAMPLES / "custom_dispatch" / "cpu" / "embedded"
CUDA = SAMPLES / "custom_dispatch" / "cuda" / "kernels"


def pyree(*args: object, cache: Path | str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYREE_BUILD_CACHE=str(cache), **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), full.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pyree_build", *map(os.fspath, args)], cwd=cwd, env=full, capture_output=True, text=True, timeout=600)


def read_outputs(outputs: list[Path]) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for out in outputs:
        if out.is_dir():
            found.update({str(p): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
        else:
            found[str(out)] = out.read_bytes()
    return found


def same_as_uncached(args: list[object], outputs: list[Path], cache: Path, cwd: Path | None = None) -> tuple[dict[str, bytes], str]:
    """Build with the cache, then with it off; the outputs must be byte-identical."""
    cached = pyree(*args, cache=cache, cwd=cwd)
    assert cached.returncode == 0, cached.stderr
    cached_bytes = read_outputs(outputs)
    fresh = pyree(*args, cache="off", cwd=cwd)
    assert fresh.returncode == 0, fresh.stderr
    assert read_outputs(outputs) == cached_bytes, f"cached build differs from an uncached one:\n{cached.stderr}"
    return cached_bytes, cached.stderr


def edit_each(args: list[object], outputs: list[Path], edits: list[tuple[Path, str, str]], cache: Path, cwd: Path | None = None) -> None:
    """For each (file, old text, new text): the edit changes the output exactly as an
    uncached build does, and the revert brings back the first output as a cache hit."""
    for path, old, _ in edits:
        assert old in path.read_text(), f"{old!r} not in {path}"
    baseline, _ = same_as_uncached(args, outputs, cache, cwd)
    for path, old, new in edits:
        original = path.read_text()
        path.write_text(original.replace(old, new))
        edited, log = same_as_uncached(args, outputs, cache, cwd)
        assert "cache hit" not in log, f"editing {path.name} was a cache hit"
        assert edited != baseline, f"editing {path.name} did not change the output: the test cannot tell"
        path.write_text(original)
        reverted, log = same_as_uncached(args, outputs, cache, cwd)
        assert reverted == baseline and "cache hit" in log, log


def plugin_project(root: Path) -> tuple[Path, Path]:
    """A freestanding plugin (builds as system and standalone) scaling by SCALE from a header."""
    from support.cmake_projects import DOWNSTREAM_PLUGIN

    (root / "include").mkdir(parents=True)
    header = root / "include" / "scale.h"
    header.write_text("#define SCALE 1.0f\n")
    src = root / "plugin.c"
    src.write_text(DOWNSTREAM_PLUGIN)
    return src, header


@pytest.mark.parametrize("kind", ["system", "standalone"])
def test_plugin_edits_match_uncached_builds(tmp_path, kind):
    src, header = plugin_project(tmp_path / "p")
    out = tmp_path / ("plugin.so" if kind == "system" else "plugin.sos")
    args = ["plugin", "--kind", kind, src, "-I", header.parent, "-o", out]
    if kind == "standalone":
        args += ["--arch", "x86_64", "--arch", "aarch64"]
    edit_each(args, [out], [(header, "1.0f", "2.0f"), (src, "SCALE * ", "SCALE * 3.0f * ")], tmp_path / "cache")


def test_objects_edits_match_uncached_builds(tmp_path):
    root = tmp_path / "o"
    (root / "inc").mkdir(parents=True)
    (root / "inc" / "k.h").write_text("#define K 1.0f\n")
    src = root / "functions.c"
    src.write_text('#include "k.h"\n' + (EMBEDDED / "functions.c").read_text().replace("rhs[rhs_offset + i];", "rhs[rhs_offset + i] * K;"))
    out = tmp_path / "objs"
    args = ["objects", src, "-I", root / "inc", "--arch", "x86_64", "--arch", "riscv64", "-o", out]
    edit_each(args, [out], [(root / "inc" / "k.h", "1.0f", "2.0f"), (src, "* K;", "* K + 1.0f;")], tmp_path / "cache")


def test_ptx_edits_match_uncached_builds(tmp_path):
    root = tmp_path / "c"
    (root / "inc").mkdir(parents=True)
    (root / "local.cuh").write_text("#define LOCAL 1.0f\n")
    (root / "inc" / "angled.cuh").write_text("#define ANGLED 1.0f\n")
    src = root / "kernels.cu"
    src.write_text(
        '#include "local.cuh"\n// a comment\n#include <angled.cuh>\n'
        + (CUDA / "kernels.cu").read_text().replace("a[i] * b[i];", "a[i] * b[i] * LOCAL * ANGLED;")
    )
    out = tmp_path / "ptx"
    args = ["ptx", src, "--sm", "80", "-I", root / "inc", "-o", out]
    edits = [(root / "local.cuh", "1.0f", "2.0f"), (root / "inc" / "angled.cuh", "1.0f", "3.0f"), (src, "* LOCAL", "* LOCAL + 1.0f")]
    edit_each(args, [out], edits, tmp_path / "cache")


# A program whose negation a transform spec replaces by a call to a function the spec
# defines: editing the spec's function changes the module.
SPEC_PROGRAM = """
func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> {
  %e = tensor.empty() : tensor<8xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%a : tensor<8xf32>) outs(%e : tensor<8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %n = arith.negf %in : f32
    linalg.yield %n : f32
  } -> tensor<8xf32>
  return %r : tensor<8xf32>
}
"""

SPEC = """
module attributes {transform.with_named_sequence} {
  util.func private @replacement(%x: tensor<8xf32>) -> tensor<8xf32> {
    %y = math.absf %x : tensor<8xf32>
    util.return %y : tensor<8xf32>
  }
  transform.named_sequence @match_negate(%root: !transform.any_op {transform.readonly})
      -> (!transform.any_value, !transform.any_value) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %root {
    ^bb0(%a: tensor<8xf32>):
      %e = tensor.empty() {"match.operation_name_only"} : tensor<8xf32>
      %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                           iterator_types = ["parallel"]}
          ins(%a : tensor<8xf32>) outs(%e : tensor<8xf32>) {
      ^bb0(%in: f32, %out: f32):
        %n = arith.negf %in : f32
        linalg.yield %n : f32
      } -> tensor<8xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    transform.yield %ins, %outs : !transform.any_value, !transform.any_value
  }
  transform.named_sequence @call_replacement(%ins: !transform.any_value {transform.readonly},
                                             %out: !transform.any_value {transform.readonly}) {
    %root = transform.get_defining_op %out : (!transform.any_value) -> !transform.any_op
    %module = transform.util.get_nearest_symbol_table %root : (!transform.any_op) -> !transform.any_op
    %f = transform.util.import_symbol @replacement into %module if undefined : (!transform.any_op) -> !transform.any_op
    transform.util.cast_and_call %f(%ins) -> %out after %root {
      transform.type_conversion.tensor.cast_shape_dynamic_dims
    } : (!transform.any_op, !transform.any_value, !transform.any_value, !transform.any_op) -> !transform.any_op
    transform.yield
  }
  transform.named_sequence @__transform_main(%module: !transform.any_op) {
    %funcs = transform.structured.match ops{["util.func"]} in %module : (!transform.any_op) -> !transform.any_op
    transform.foreach %funcs : !transform.any_op {
    ^bb1(%f: !transform.any_op):
      transform.foreach_match in %f @match_negate -> @call_replacement : (!transform.any_op) -> (!transform.any_op)
    }
    transform.apply_dce to %module : !transform.any_op
    transform.yield
  }
}
"""
SPEC_FLAG = "--iree-preprocessing-transform-spec-filename"


def spec_project(root: Path) -> tuple[Path, Path]:
    root.mkdir(parents=True)
    (root / "prog.mlir").write_text(SPEC_PROGRAM)
    (root / "spec.mlir").write_text(SPEC)
    return root / "prog.mlir", root / "spec.mlir"


@pytest.mark.parametrize("form", ["--flag=PATH", "--flag PATH"])
def test_compile_with_a_transform_spec_flag_matches_uncached_builds(tmp_path, form):
    src, spec = spec_project(tmp_path / "s")
    out = tmp_path / "m.vmfb"
    passed = [f"{SPEC_FLAG}=spec.mlir"] if form == "--flag=PATH" else [SPEC_FLAG, "spec.mlir"]  # relative: to the cwd
    args = ["compile", src, "-o", out, "--", *passed]
    edits = [(spec, "math.absf", "math.sqrt"), (src, "arith.negf %in : f32", "arith.addf %in, %in : f32")]
    edit_each(args, [out], edits, tmp_path / "cache", cwd=src.parent)
    ran = pyree("run", out, "--function", "main", "--input", "8xf32=-4", cache="off")
    assert "8xf32=4 4 4 4 4 4 4 4" in ran.stdout, ran  # the spec's absf, not the program's negf


def commented_embedded(root: Path) -> Path:
    """The embedded sample with a `//` comment inside each object reference (the comment
    defeated the old regex) and one object name only a `//` line mentions."""
    root.mkdir(parents=True, exist_ok=True)
    text = (EMBEDDED / "example.mlir").read_text()
    text = text.replace("#hal.executable.object<{path", "#hal.executable.object<{\n        // the object for this arch\n        path")
    assert text.count("// the object for this arch") == 3
    text = '// #hal.executable.object<{path = "decoy.o"}>\n' + text
    (root / "example.mlir").write_text(text)
    return root / "example.mlir"


@pytest.mark.parametrize("lookup", ["--object-search-path", "pass-through search path", "cwd"])
def test_compile_with_objects_after_comments_matches_uncached_builds(tmp_path, lookup):
    src = commented_embedded(tmp_path / "m")
    c_src = tmp_path / "functions.c"
    c_src.write_text((EMBEDDED / "functions.c").read_text())
    objs = tmp_path / "objs"
    cache = tmp_path / "cache"

    def rebuild_objects() -> None:
        made = pyree("objects", c_src, "--arch", "x86_64", "--arch", "aarch64", "--arch", "riscv64", "-o", objs, cache=cache)
        assert made.returncode == 0, made.stderr

    rebuild_objects()
    out = tmp_path / "m.vmfb"
    cwd = None
    if lookup == "--object-search-path":
        args = ["compile", src, "-o", out, "--object-search-path", objs]
    elif lookup == "pass-through search path":
        args = ["compile", src, "-o", out, "--", f"--iree-hal-executable-object-search-path={objs}"]
    else:
        args, cwd = ["compile", src, "-o", out], objs
    baseline, _ = same_as_uncached(args, [out], cache, cwd)
    # Edit the C behind the objects: the module must change (96 -> 320 for a=2, b=4).
    original = c_src.read_text()
    c_src.write_text(original.replace("lhs[lhs_offset + i] * rhs[rhs_offset + i]", "lhs[lhs_offset + i] * rhs[rhs_offset + i] * 2.0f"))
    rebuild_objects()
    edited, log = same_as_uncached(args, [out], cache, cwd)
    assert edited != baseline and "cache hit" not in log, log
    ran = pyree("run", out, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", cache="off")
    assert "8xf32=320" in ran.stdout, ran
    c_src.write_text(original)
    rebuild_objects()
    reverted, log = same_as_uncached(args, [out], cache, cwd)
    assert reverted == baseline and "cache hit" in log, log


def test_compile_with_ptx_objects_matches_uncached_builds(tmp_path):
    """A cuda module (compile only: no GPU needed) embeds the PTX the program references."""
    cache = tmp_path / "cache"
    cu = tmp_path / "kernels.cu"
    cu.write_text((CUDA / "kernels.cu").read_text())
    ptx_dir = tmp_path / "ptx"
    src = tmp_path / "example.mlir"
    src.write_text((CUDA / "example.mlir").read_text().replace("#hal.executable.object<{", "#hal.executable.object<{ // ptx\n"))

    def rebuild_ptx() -> None:
        made = pyree("ptx", cu, "--sm", "75", "--sm", "80", "-o", ptx_dir, cache=cache)
        assert made.returncode == 0, made.stderr

    rebuild_ptx()
    out = tmp_path / "m.vmfb"
    args = ["compile", src, "--target", "cuda", "--sm", "80", "--object-search-path", ptx_dir, "-o", out]
    baseline, _ = same_as_uncached(args, [out], cache)
    cu.write_text(cu.read_text().replace("a[i] * b[i];", "a[i] + b[i];"))
    rebuild_ptx()
    edited, log = same_as_uncached(args, [out], cache)
    assert edited != baseline and "cache hit" not in log, log


def test_dump_with_a_spec_flag_matches_uncached_builds(tmp_path, monkeypatch):
    """dump is never cached (it writes a directory of the compiler's choosing); an edited
    spec passed through its flags changes the dump, with the cache on as with it off."""
    from pyree_build.actions import executables

    src, spec = spec_project(tmp_path / "s")
    out = tmp_path / "dump"

    def dumped(cache: str) -> dict[str, bytes]:
        monkeypatch.setenv("PYREE_BUILD_CACHE", cache)
        executables.dump(src, out, flags=[f"{SPEC_FLAG}={spec}"])
        # The sources and the index; the binaries hold the (random) staging path of each dump,
        # and so does dump's hidden record of what it wrote (their hashes).
        return {k: v for k, v in read_outputs([out]).items() if k.endswith((".mlir", ".json")) and not Path(k).name.startswith(".")}

    first = dumped(str(tmp_path / "cache"))
    assert first == dumped("off")
    spec.write_text(SPEC.replace("math.absf", "math.sqrt"))
    second = dumped(str(tmp_path / "cache"))
    assert second == dumped("off") and second != first


def test_a_pass_through_flag_naming_an_output_is_never_cached(tmp_path):
    src, spec = spec_project(tmp_path / "s")
    args = ["compile", src, "-o", tmp_path / "m.vmfb", "--", f"--iree-hal-dump-executable-sources-to={tmp_path / 'd'}"]
    for _ in range(2):
        result = pyree(*args, cache=tmp_path / "cache")
        assert result.returncode == 0 and "cache hit" not in result.stderr and "not cached" in result.stderr, result.stderr
    assert any((tmp_path / "d").iterdir())


# Random edits and reverts of a plugin's source and header, each build compared with an
# uncached one. Few examples by default (each is several real builds); PYREE_FUZZ_EXAMPLES
# raises the count for a longer run.
FUZZ_EXAMPLES = int(os.environ.get("PYREE_FUZZ_EXAMPLES", "3"))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["source", "header"]), st.integers(0, 2)), min_size=1, max_size=3))
def test_random_edits_and_reverts_match_uncached_builds(tmp_path_factory, steps):
    root = tmp_path_factory.mktemp("fuzz")
    src, header = plugin_project(root / "p")
    variants = {
        "source": [src.read_text(), src.read_text().replace("SCALE * ", "SCALE * 2.0f * "), src.read_text().replace("SCALE * ", "SCALE * 5.0f * ")],
        "header": ["#define SCALE 1.0f\n", "#define SCALE 3.0f\n", "#define SCALE 1.0f\n/* same code */\n"],
    }
    files = {"source": src, "header": header}
    out = root / "plugin.so"
    args = ["plugin", src, "-I", header.parent, "-o", out]
    cache = root / "cache"
    same_as_uncached(args, [out], cache)
    for which, variant in steps:
        files[which].write_text(variants[which][variant])
        same_as_uncached(args, [out], cache)


# --- Races, forced through the cache's pause hook (PYREE_BUILD_CACHE_TEST_PAUSE) ----------


def start_paused(args: list[object], cache: Path, hook: Path) -> subprocess.Popen[str]:
    """Start a build that stops after its tool ran, before it checks inputs and stores."""
    hook.mkdir()
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache), PYREE_BUILD_CACHE_TEST_PAUSE=str(hook))
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "pyree_build", *map(os.fspath, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (hook / "built").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def resume(proc: subprocess.Popen[str], hook: Path) -> str:
    (hook / "built.go").write_text("")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return err


def test_a_header_edited_during_the_build_is_not_stored_under_the_new_hash(tmp_path):
    """Race 4: the compiler read the old header, the header changes before the store."""
    cache = tmp_path / "cache"
    src, header = plugin_project(tmp_path / "p")
    out = tmp_path / "plugin.so"
    args = ["plugin", src, "-I", header.parent, "-o", out]
    proc = start_paused(args, cache, tmp_path / "hook")
    header.write_text("#define SCALE 7.0f\n")  # while the build is paused after compiling
    log = resume(proc, tmp_path / "hook")
    assert "not cached" in log and "scale.h changed during the build" in log, log
    # The next build must be a miss that builds from the new header, as an uncached build does.
    after, log = same_as_uncached(args, [out], cache)
    assert "cache hit" not in log, log


def test_concurrent_builds_with_other_flags_store_their_own_output(tmp_path):
    """Race 5: build A (SCALE=1) is paused after its tool ran; build B (SCALE=2) writes the
    same output path; A then stores. A's entry must hold A's output, not B's file."""
    cache = tmp_path / "cache"
    src = tmp_path / "plugin.c"
    from support.cmake_projects import DOWNSTREAM_PLUGIN

    src.write_text(DOWNSTREAM_PLUGIN.replace('#include "scale.h"', ""))
    out = tmp_path / "plugin.so"
    a_args = ["plugin", src, "-D", "SCALE=1", "-o", out]
    b_args = ["plugin", src, "-D", "SCALE=2", "-o", out]
    proc = start_paused(a_args, cache, tmp_path / "hook")
    b = pyree(*b_args, cache=cache)
    assert b.returncode == 0, b.stderr
    b_bytes = out.read_bytes()
    resume(proc, tmp_path / "hook")
    a_bytes = out.read_bytes()
    assert a_bytes != b_bytes  # A published its own output
    for args in (a_args, b_args):
        got, log = same_as_uncached(args, [out], cache)
        assert "cache hit" in log, log


def test_concurrent_identical_builds_leave_no_temporary_files(tmp_path):
    cache = tmp_path / "cache"
    src = PLUGIN_SAMPLE / "system_plugin.c"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    first = pyree("plugin", src, "-o", out_dir / "p.so", cache=cache)
    assert first.returncode == 0
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache), PYTHONPATH=str(PACKAGE_ROOT))
    procs = [
        subprocess.Popen([sys.executable, "-m", "pyree_build", "plugin", src, "-o", out_dir / "p.so"], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == ["p.so"]
    hidden = [p for p in cache.rglob(".*") if p.name != "CACHEDIR.TAG"]
    assert hidden == []


def test_concurrent_builds_on_a_new_cache_all_use_it(tmp_path):
    """Builds started together on a fresh cache directory: each one either marks it or sees it
    marked; none mistakes another's half-written mark for someone else's directory."""
    cache = tmp_path / "fresh"
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache), PYTHONPATH=str(PACKAGE_ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pyree_build", "plugin", PLUGIN_SAMPLE / "system_plugin.c", "-D", f"N={i}", "-o", tmp_path / f"p{i}.so"],
            env=env, stderr=subprocess.PIPE, text=True,
        )
        for i in range(4)
    ]  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "not caching" not in err, err
    assert len(list((cache / "entries").iterdir())) == 4


# --- Outputs are copies; the cache is robust to junk --------------------------------------


def test_hits_are_independent_copies(tmp_path):
    cache = tmp_path / "cache"
    src = PLUGIN_SAMPLE / "system_plugin.c"
    one, two = tmp_path / "one.so", tmp_path / "two.so"
    assert pyree("plugin", src, "-o", one, cache=cache).returncode == 0
    hit = pyree("plugin", src, "-o", two, cache=cache)
    assert "cache hit" in hit.stderr
    assert one.stat().st_ino != two.stat().st_ino and two.stat().st_nlink == 1
    original = one.read_bytes()
    two.write_bytes(b"overwritten by the user")  # `cp /bin/true two.so`
    assert one.read_bytes() == original
    three = tmp_path / "three.so"
    again = pyree("plugin", src, "-o", three, cache=cache)
    assert "cache hit" in again.stderr and three.read_bytes() == original


def test_a_tampered_entry_is_a_miss_and_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    src = PLUGIN_SAMPLE / "system_plugin.c"
    out = tmp_path / "p.so"
    assert pyree("plugin", src, "-o", out, cache=cache).returncode == 0
    good = out.read_bytes()
    (entry,) = (cache / "entries").iterdir()
    (entry / "0").write_bytes(b"\x7fELF not what was stored")
    again = pyree("plugin", src, "-o", out, "-v", cache=cache)
    assert again.returncode == 0 and "cache hit" not in again.stderr and "damaged" in again.stderr, again.stderr
    assert out.read_bytes() == good


@pytest.mark.parametrize(
    "junk",
    [
        {"entries": "x"},
        [{"entry": "../../victim", "deps": {}, "outputs": ["0" * 64]}],
        [{"entry": "a" * 40, "deps": [], "outputs": "x"}],
        [{"entry": "a" * 40, "deps": {"relative": 3}, "outputs": [None]}],
        [1, "two", None],
        "not json at all {",
    ],
)
def test_junk_manifests_are_a_miss_never_a_traceback_nor_a_deletion(tmp_path, junk):
    cache = tmp_path / "cache"
    src = PLUGIN_SAMPLE / "system_plugin.c"
    out = tmp_path / "p.so"
    assert pyree("plugin", src, "-o", out, cache=cache).returncode == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("user data")
    (manifest,) = (cache / "manifests").iterdir()
    manifest.write_text(junk if isinstance(junk, str) else json.dumps(junk))
    for name in ("entries/junk", "manifests/junk.json", "locks/notes.txt"):
        (cache / name).write_text("junk")
    again = pyree("plugin", src, "-o", out, "-v", cache=cache)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert "cache hit" not in again.stderr and "ignoring" in again.stderr, again.stderr
    assert (victim / "keep.txt").read_text() == "user data"
    hit = pyree("plugin", src, "-o", out, cache=cache)  # the rebuild rewrote the manifest
    assert "cache hit" in hit.stderr


def test_cache_clear_removes_only_what_the_cache_wrote(tmp_path):
    cache = tmp_path / "cache"
    assert pyree("plugin", PLUGIN_SAMPLE / "system_plugin.c", "-o", tmp_path / "a.so", cache=cache).returncode == 0
    assert pyree("plugin", PLUGIN_SAMPLE / "system_plugin.c", "-D", "X=1", "-o", tmp_path / "b.so", cache=cache).returncode == 0
    (cache / "entries" / "mine.txt").write_text("a user's file")
    (cache / "notes.txt").write_text("a user's file")
    cleared = pyree("cache", "clear", cache=cache)
    assert cleared.returncode == 0 and "removed 2 entries" in cleared.stdout and "left 1 files" in cleared.stdout, cleared
    assert (cache / "entries" / "mine.txt").exists() and (cache / "notes.txt").exists()
    assert "entries: 0" in pyree("cache", "info", cache=cache).stdout


def test_cache_clear_refuses_a_directory_that_is_not_a_cache(tmp_path):
    data = tmp_path / "data"
    for sub in ("entries", "manifests", "locks"):
        (data / sub).mkdir(parents=True)
        (data / sub / "precious.txt").write_text("user data")
    cleared = pyree("cache", "clear", cache=data)
    assert cleared.returncode != 0 and "not a pyree_build cache" in cleared.stderr and "Traceback" not in cleared.stderr
    assert all((data / sub / "precious.txt").exists() for sub in ("entries", "manifests", "locks"))
    built = pyree("plugin", PLUGIN_SAMPLE / "system_plugin.c", "-o", tmp_path / "p.so", cache=data)
    assert built.returncode == 0 and "not caching" in built.stderr
    assert sorted(p.name for p in data.iterdir()) == ["entries", "locks", "manifests"]


def test_host_cpu_is_opt_in_and_keyed_by_the_cpu(tmp_path, monkeypatch, capsys):
    from pyree_build.backends.llvm_cpu import plugins as cpu
    from pyree_build.cache import local as cache
    from pyree_build.core import echo

    # All in this process: a `python -m pyree_build` child may import another copy of
    # pyree_build (the checkout rather than the installed wheel), whose header directory,
    # part of the key, differs.
    src = PLUGIN_SAMPLE / "system_plugin.c"
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(echo, "VERBOSITY", 2)
    cpu.plugin([src], tmp_path / "base.so")
    said = capsys.readouterr().err
    assert "-mcpu=baseline" in said, said
    cpu.plugin([src], tmp_path / "host.so", cpu="host")
    said = capsys.readouterr().err
    assert "-mcpu=native" in said and "cache hit" not in said, said
    # A shared cache must not hand code built for one CPU to another: the same host build on
    # a machine whose CPU differs is a miss.
    cpu.plugin([src], tmp_path / "again.so", cpu="host")
    assert "cache hit" in capsys.readouterr().err
    monkeypatch.setattr(cache, "host_cpu", lambda: "x86_64/Some Other CPU/features:0")
    cpu.plugin([src], tmp_path / "other.so", cpu="host")
    assert "cache hit" not in capsys.readouterr().err
    monkeypatch.setattr(cache, "host_cpu", lambda: "x86_64/Some Other CPU/features:0")
    cpu.plugin([src], tmp_path / "base_again.so")  # baseline code does not depend on the CPU
    assert "cache hit" in capsys.readouterr().err


@pytest.mark.slow
def test_cmake_rebuilds_agree_with_the_cache_for_a_spec_and_an_object_after_a_comment(tmp_path):
    """Editing a transform spec passed through FLAGS, or the C behind an object that the
    program references after a `//` comment, rebuilds the module and changes the ctest result."""
    from support.cmake_projects import build, configure, ctest_run, write_project

    src, out = tmp_path / "src", tmp_path / "build"
    write_project(
        src, "cache_agrees",
        "pyree_iree_module(NAME spec_module SRC prog.mlir TARGET llvm-cpu\n"
        "  FLAGS --iree-preprocessing-transform-spec-filename=${CMAKE_CURRENT_SOURCE_DIR}/spec.mlir)\n"
        'pyree_add_run_test(NAME spec_run MODULE spec_module FUNCTION main INPUTS "8xf32=4" EXPECT "8xf32=4 4 4 4 4 4 4 4")\n'
        "pyree_cpu_objects(NAME functions SRCS functions.c ARCHS x86_64 aarch64 riscv64)\n"
        "pyree_iree_module(NAME objects_module SRC example.mlir TARGET llvm-cpu DEPENDS functions)\n"
        'pyree_add_run_test(NAME objects_run MODULE objects_module FUNCTION mixed_invocation INPUTS "8xf32=2" "8xf32=4" '
        'EXPECT "8xf32=96 96 96 96 96 96 96 96")\n'
        "pyree_cpu_plugin(NAME host_plugin SYSTEM CPU host SRCS system_plugin.c)\n",
        {"functions.c": EMBEDDED / "functions.c", "system_plugin.c": PLUGIN_SAMPLE / "system_plugin.c"},
    )  # fmt: skip
    spec_project_files = spec_project(tmp_path / "spec_files")
    (src / "prog.mlir").write_text(spec_project_files[0].read_text())
    (src / "spec.mlir").write_text(SPEC)
    commented_embedded(src)
    configure(src, out)
    assert "--cpu host" in build(out)
    assert ctest_run(out).returncode == 0
    assert "no work to do" in build(out)
    first_spec, first_objects = (out / "spec_module.vmfb").read_bytes(), (out / "objects_module.vmfb").read_bytes()

    time.sleep(1.1)  # coarse mtime filesystems
    (src / "spec.mlir").write_text(SPEC.replace("math.absf", "math.sqrt"))
    (src / "functions.c").write_text(
        (EMBEDDED / "functions.c").read_text().replace("lhs[lhs_offset + i] * rhs[rhs_offset + i]", "lhs[lhs_offset + i] * rhs[rhs_offset + i] * 2.0f")
    )
    log = build(out)
    assert log.count("pyree_build compile") == 2, log
    assert (out / "spec_module.vmfb").read_bytes() != first_spec and (out / "objects_module.vmfb").read_bytes() != first_objects
    result = ctest_run(out, "--output-on-failure")
    assert result.returncode != 0, result.stdout
    assert "8xf32=2 2 2 2 2 2 2 2" in result.stdout and "8xf32=320" in result.stdout, result.stdout  # sqrt(4); 2*4*2 ... = 320


def test_cpu_host_for_a_standalone_plugin_is_refused(cli, tmp_path):
    from conftest import assert_clean_error

    result = cli("plugin", "--kind", "standalone", "--cpu", "host", PLUGIN_SAMPLE / "standalone_plugin.c", "-o", tmp_path / "p.sos")
    assert_clean_error(result, "--cpu host applies to system plugins only", "drop --cpu")
    assert not (tmp_path / "p.sos").exists()


def test_large_inputs_are_keyed_by_content_not_size_and_mtime(tmp_path):
    """Two equal-size programs over 4 MiB swapped with their mtime kept (`cp -p`)."""
    padding = "// " + "x" * 1021 + "\n"
    big = padding * 4300  # 4.4 MB of comment: over the old 4 MiB size-and-mtime threshold
    negate = SPEC_PROGRAM
    absolute = SPEC_PROGRAM.replace("arith.negf %in : f32", "math.absf %in : f32 ")
    assert len(negate) == len(absolute)
    src = tmp_path / "prog.mlir"
    out = tmp_path / "m.vmfb"
    cache = tmp_path / "cache"
    stamp = 1_700_000_000
    results = []
    for program in (negate, absolute):
        src.write_text(big + program)
        os.utime(src, (stamp, stamp))
        got, _ = same_as_uncached(["compile", src, "-o", out], [out], cache)
        results.append(got)
    assert results[0] != results[1]
