"""Finding every file an action reads before it runs: MLIR object references (comments and
strings cannot hide or fake one), files and directories named by pass-through flags, and
#include lines; and the cases where inputs cannot be known (then nothing is cached)."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from pyree_build.core.inputs import (
    c_includes,
    compile_inputs,
    referenced_objects,
    resolve_object,
)

MLIR = r"""
// #hal.executable.object<{path = "commented.o"}>
#a = [#hal.executable.object<{
  // the x86 object, after a comment
  path = "a.o"
}>, #hal.executable.object<{path = "embedded.o", data = dense<[1, 2]> : vector<2xi8>}>]
#b = [#hal.executable.object<{data = dense<1> : vector<1xi8>, path = "embedded_first.o"}>,
      #hal.executable.object<{path = "dir/b\"q.o"}>]
%s = "#hal.executable.object<{path = \"in_a_string.o\"}>"
#c = #hal.executable.object<{path = "c\2F.o", extra = [#x<{k = "v"}>]}>
"""


def test_object_references_skip_comments_strings_and_embedded_data():
    assert referenced_objects(MLIR) == ["a.o", 'dir/b"q.o', "c/.o"]


@settings(max_examples=int(os.environ.get("PYREE_FUZZ_EXAMPLES", "300")), deadline=None)
@given(st.text(alphabet='#hal.executableobj<{}>[]()"\\/ =,pathdata\n', max_size=200))
def test_object_reference_parsing_never_crashes(text):
    assert all(isinstance(p, str) for p in referenced_objects(text))


def test_objects_resolve_like_iree_compile(tmp_path):
    (tmp_path / "cwd").mkdir()
    (tmp_path / "s1").mkdir()
    (tmp_path / "s2").mkdir()
    (tmp_path / "s2" / "x.o").write_bytes(b"2")
    found, tried = resolve_object("x.o", [tmp_path / "s1", tmp_path / "s2"], cwd=tmp_path / "cwd")
    assert found == tmp_path / "s2" / "x.o" and len(tried) == 3
    (tmp_path / "cwd" / "x.o").write_bytes(b"c")  # the working directory comes first
    assert resolve_object("x.o", [tmp_path / "s1", tmp_path / "s2"], cwd=tmp_path / "cwd")[0] == tmp_path / "cwd" / "x.o"


def test_files_named_by_flags_in_every_form_are_inputs(tmp_path):
    for name in ("spec.mlir", "pdl.mlir", "sub.mlir", "a.txt", "b.txt", "tuning.mlir"):
        (tmp_path / name).write_text("// nothing\n")
    (tmp_path / "objs").mkdir()
    (tmp_path / "objs" / "k.o").write_bytes(b"o")
    (tmp_path / "spec.mlir").write_text('#o = #hal.executable.object<{\n// c\npath = "k.o"}>\n')
    src = tmp_path / "prog.mlir"
    src.write_text("")
    argv = [
        "--iree-preprocessing-transform-spec-filename=spec.mlir",
        "--iree-preprocessing-pdl-spec-filename", "pdl.mlir",
        "--iree-hal-substitute-executable-source=main_dispatch_0=sub.mlir",
        "--some-unknown-flag=a.txt,b.txt",
        "--iree-codegen-tuning-spec-path", str(tmp_path / "tuning.mlir"),
        "--iree-hal-executable-object-search-path=objs",
        "--iree-llvmcpu-target-cpu=generic",
    ]  # fmt: skip
    found = compile_inputs(src, argv, cwd=tmp_path)
    assert found.uncacheable is None
    names = sorted(p.name for p in found.files)
    assert names == ["a.txt", "b.txt", "k.o", "pdl.mlir", "spec.mlir", "sub.mlir", "tuning.mlir"]
    assert f"object:k.o->{tmp_path / 'objs' / 'k.o'}" in found.resolution


def test_inputs_that_cannot_be_known_make_a_compile_uncacheable(tmp_path):
    src = tmp_path / "prog.mlir"
    src.write_text("")
    (tmp_path / "somedir").mkdir()
    assert compile_inputs(src, ["--iree-hal-dump-executable-sources-to=out"], cwd=tmp_path).uncacheable
    assert compile_inputs(src, ["--unknown-dir-flag=somedir"], cwd=tmp_path).uncacheable
    assert compile_inputs(src, ["--spec=missing/spec.mlir"], cwd=tmp_path).uncacheable
    bytecode = tmp_path / "spec.mlirbc"
    bytecode.write_bytes(b"ML\xefR\x00")
    assert "bytecode" in (compile_inputs(src, [f"--spec={bytecode}"], cwd=tmp_path).uncacheable or "")
    assert compile_inputs(src, ["--iree-llvmcpu-target-cpu=host", "--output-format=vm-bytecode"], cwd=tmp_path).uncacheable is None


def test_includes_are_followed_and_a_macro_include_is_uncacheable(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "local.h").write_text("#include <deeper.h>\n")
    (tmp_path / "inc" / "deeper.h").write_text("#define X 1\n")
    src = tmp_path / "k.cu"
    src.write_text('#include "local.h"\n  #  include <cuda_fp16.h>\n')
    found = c_includes(src, [tmp_path / "inc"])
    assert sorted(p.name for p in found.files) == ["deeper.h", "local.h"] and found.uncacheable is None
    src.write_text('#define H "local.h"\n#include H\n')
    assert "macro" in (c_includes(src, [tmp_path / "inc"]).uncacheable or "")
