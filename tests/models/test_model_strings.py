"""Issue 44 item 1: a string a model holds (node, input, output and graph names, doc strings,
metadata) never runs code and never reaches a terminal raw.

A model comes from a hub: a node name is pasted into the comments of the C, GLSL, CUDA and HIP
`replace` writes and into what `ops` prints. The property: names drawn from all of Unicode,
with the pieces that would break out of a comment or a line (newlines, `*/`, `#error`,
backslash-newline, `??/`, NUL, bidi controls, `${}`, ANSI escapes), go through import, `ops`
and `replace` for every target, and every generated file compiles with the real tools (zig cc
into a plugin the load check opens, glslang to SPIR-V, NVRTC to PTX, zig clang to an AMDGPU code
object), holds no control character, and `ops` prints each name escaped on its line.
"""

from __future__ import annotations

import json
import re
import subprocess
import unicodedata
from pathlib import Path

import pytest
from conftest import assert_clean_error, run_cli
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pyree_build as pb
from pyree_build.core import escape, toolchain

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from onnx import helper  # noqa: E402
from support import onnx_models  # noqa: E402

PAYLOAD = 'fc1\nextern int system(const char*); __attribute__((constructor)) static void pwn(void){system("touch PWNED");} //'
OUTPUT = "y\u202e\n#error out\x1b[2J"
# What a hostile name is made of: line breaks, comment ends, preprocessor lines, line splices
# (also as the trigraph ??/), quotes, NUL, bidi overrides and isolates, format strings, CMake
# and shell variable references, a terminal escape, Unicode line separators.
HOSTILE = (
    "\n",
    "\r\n",
    "*/",
    "/*",
    "//",
    "#error X",
    "\n#error X\n",
    "\n#include </etc/passwd>\n",
    '"',
    "'",
    "\\",
    "\\\n",
    "??/",
    "??/\n",
    "\x00",
    "\u202e",
    "\u2066",
    "\u200f",
    "%s%n",
    "${X}",
    "$ENV{HOME}",
    "@X@",
    ";",
    "\x1b[2J",
    "\u2028",
    "\ufeff",
    "`",
)
_piece = st.one_of(st.sampled_from(HOSTILE), st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=4))
_name = st.lists(_piece, min_size=1, max_size=5).map("".join)
_SOURCES = {"llvm-cpu": ".c", "vulkan": ".glsl", "cuda": ".cu", "hip": ".hip"}
# Characters that are not text of their own (escape's rule for a terminal): none may be written raw.
_INVISIBLE = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


def _raw_controls(text: str, layout: str = "\n\t") -> list[str]:
    return sorted({ch for ch in text if ch not in layout and unicodedata.category(ch) in _INVISIBLE})


def _hostile_model(path: Path, nodes: list[str], edges: list[str], graph: str, docs: list[str]) -> None:
    """A MaxPool (a group generated as one loop nest per op) then Flatten, MatMul, Add and Relu
    (one fused nest), with every string the importer reads drawn: node names, the input,
    intermediate, weight and output names, the graph's name (the function's), doc strings and
    metadata."""
    x, p, f, w, m, b, s, y = edges
    model = onnx_models._model(
        "g",
        [
            helper.make_node("MaxPool", [x], [p], name=nodes[0], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Flatten", [p], [f], name=nodes[1], axis=1),
            helper.make_node("MatMul", [f, w], [m], name=nodes[2]),
            helper.make_node("Add", [m, b], [s], name=nodes[3]),
            helper.make_node("Relu", [s], [y], name=nodes[4]),
        ],
        {x: (1, 2, 4, 4)},
        {y: (1, 6)},
        [onnx_models._weights(1, w, (8, 6)), onnx_models._weights(2, b, (6,))],
    )
    for value in (*model.graph.input, *model.graph.output):
        value.doc_string = docs[0]
    model.graph.name = graph
    model.graph.doc_string = docs[1]
    model.graph.node[2].doc_string = docs[2]
    model.doc_string = docs[0]
    helper.set_model_props(model, {docs[1]: docs[2]})
    onnx.save(model, path)


def _compile_generated(out: Path, target: str, name: str) -> None:
    """The generated kernel built by its target's real compiler (the plugin also opened by its load check)."""
    source = out / f"{name}{_SOURCES[target]}"
    if target == "llvm-cpu":
        pb.plugin(source, out / f"{name}.so", kind="system")  # its load check opens it: a constructor would run
    elif target == "vulkan":
        assert pb.spirv(source, out / "spv")
    elif target == "cuda":
        assert pb.ptx(source, [80], out / "ptx")
    else:
        assert pb.hsaco(source, [1100], out / "hsaco")


def test_escape_rules_leave_nothing_live():
    # The rules themselves, on what each language would read as code.
    for text in (PAYLOAD, "a\\", "a??/", "x*/y/*z", "\u202eb\x00", "\r\n#error"):
        body = escape.comment(text)
        assert body.isascii() and body.isprintable() and not body.endswith(("\\", "??/")), body
        assert "*/" not in body and "/*" not in body and "??" not in body
    assert escape.name("a\nb\u202ec\\") == "a\\nb\\u202ec\\\\"
    assert escape.terminal("line 1\n\x1b[2Jline\t2\u2066") == "line 1\n\\x1b[2Jline\t2\\u2066"
    assert escape.cmake_quoted('a"${X};\\\nb') == 'a\\"\\${X};\\\\\\nb'
    with pytest.raises(ValueError):
        escape.cmake_quoted("a\x00b")


def _cmake_reads(quoted: list[str], tmp: Path) -> list[str]:
    """What CMake reads from each "..." argument body: set() then printed, one per line of a -P script."""
    script = tmp / "read.cmake"
    lines = [f'set(V "{q}")\nstring(HEX "${{V}}" H)\nmessage("${{H}}")' for q in quoted]
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run([str(toolchain.cmake().path), "-P", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [bytes.fromhex(h).decode("utf-8") for h in done.stderr.splitlines()]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(
        st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(st.characters(blacklist_categories=_INVISIBLE), max_size=4)), max_size=6).map("".join),
        min_size=1,
        max_size=8,
    )
)
def test_cmake_reads_back_exactly_what_cmake_quoted_wrote(tmp_path_factory, texts):
    # The CMake rule against CMake itself: ${}, $ENV{}, quotes, backslashes, ; and line breaks are
    # read back as written, not expanded, split or ended.
    texts = [t.replace("\x00", "") for t in texts if not _raw_controls(t.replace("\x00", ""), "\n\t\r")]
    assert _cmake_reads([escape.cmake_quoted(t) for t in texts], tmp_path_factory.mktemp("cmake")) == texts


def test_a_model_at_a_path_cmake_would_expand_is_named_exactly_in_the_generated_cmakelists(tmp_path):
    where = tmp_path / 'my "models" ${HOME};$ENV{PATH}\\'
    where.mkdir()
    model = where / "m.onnx"
    onnx.save(onnx_models.matmul_add_relu(), model)
    mlir = tmp_path / "m.mlir"
    pb.import_onnx(model, mlir)
    pb.replace(mlir, tmp_path / "k", ops=[1], imports=["k1"], onnx=model)
    # The quoted argument of the model's cache variable, as CMake splits it: up to the first quote not escaped.
    (body,) = re.findall(r'^set\(m_ONNX "((?:[^"\\]|\\.)*)" CACHE FILEPATH', (tmp_path / "k" / "CMakeLists.txt").read_text(), re.MULTILINE)
    assert _cmake_reads([body], tmp_path) == [str(model)]


def test_a_model_path_no_cmake_argument_can_hold_is_refused_clearly(tmp_path):
    where = tmp_path / "a\x01b"
    where.mkdir()
    onnx.save(onnx_models.matmul_add_relu(), where / "m.onnx")
    mlir = tmp_path / "m.mlir"
    pb.import_onnx(where / "m.onnx", mlir)
    result = run_cli("replace", mlir, "--ops", "1", "--import", "k1", "-o", tmp_path / "k", "--onnx", where / "m.onnx")
    assert_clean_error(result, "cannot be written into a CMakeLists.txt", "a\\x01b")
    assert not _raw_controls(result.stderr) and not (tmp_path / "k").exists()


def test_a_node_name_holding_c_code_runs_nothing_through_replace_plugin_and_verify(tmp_path):
    # The exact payload as the MatMul's node name: on main it ended the `// from:`
    # comment and the plugin's load check ran its constructor (PWNED), and verify passed.
    model = onnx_models.matmul_add_relu()
    model.graph.node[0].name = PAYLOAD
    model.graph.node[2].output[0] = model.graph.output[0].name = OUTPUT  # verify prints the output's name
    onnx_path = tmp_path / "m.onnx"
    onnx.save(model, onnx_path)
    mlir, out = tmp_path / "m.mlir", tmp_path / "kernels"
    assert run_cli("import", onnx_path, "-o", mlir, cwd=tmp_path).returncode == 0
    replaced = run_cli("replace", mlir, "--ops", "1", "--import", "k1", "-o", out, "--onnx", onnx_path, cwd=tmp_path)
    assert replaced.returncode == 0, replaced
    built = run_cli("plugin", "--kind", "system", out / "k1.c", "-o", out / "k1.so", cwd=tmp_path)
    assert built.returncode == 0, built
    module = out / "m.vmfb"
    compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", "--expect-import", "k1", cwd=tmp_path)
    assert compiled.returncode == 0, compiled
    verified = run_cli("verify", module, "--onnx", onnx_path, "--plugin", out / "k1.so", cwd=tmp_path)
    assert verified.returncode == 0, verified
    assert f"output 0 ({escape.name(OUTPUT)}," in verified.stdout and not _raw_controls(verified.stdout), verified.stdout
    assert not (tmp_path / "PWNED").exists(), "the node name's constructor ran"
    source = (out / "k1.c").read_text()
    assert not re.search(r"^\s*extern int system", source, re.MULTILINE), source
    listed = run_cli("ops", mlir, cwd=tmp_path)
    assert listed.returncode == 0, listed
    assert escape.name(PAYLOAD) in listed.stdout and "\nextern int system" not in listed.stdout


def test_a_hostile_attribute_name_the_importer_refuses_is_printed_escaped(tmp_path):
    # What the importer rejects is a clear error, and a model's text quoted in it stays inert.
    model = onnx_models.matmul_add_relu()
    model.graph.node[1].attribute.append(helper.make_attribute("note\x1b[2J\u202e\n#x", "v"))
    onnx.save(model, tmp_path / "m.onnx")
    result = run_cli("import", tmp_path / "m.onnx", "-o", tmp_path / "m.mlir")
    assert_clean_error(result, "Unrecognized attribute", "note\\x1b[2J\\u202e")
    assert not _raw_controls(result.stderr), result.stderr


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    nodes=st.lists(_name, min_size=5, max_size=5),
    edges=st.lists(_name, min_size=8, max_size=8, unique=True),
    graph=_name,
    docs=st.lists(_name, min_size=3, max_size=3),
)
def test_any_model_strings_are_inert_in_every_generated_file_and_in_what_ops_prints(tmp_path_factory, nodes, edges, graph, docs):
    tmp = tmp_path_factory.mktemp("hostile")
    onnx_path, mlir = tmp / "m.onnx", tmp / "m.mlir"
    _hostile_model(onnx_path, nodes, edges, graph, docs)
    imported = run_cli("import", onnx_path, "-o", mlir)
    if imported.returncode != 0:  # the importer may refuse a name (its checker): then a clear error, printed inert
        assert_clean_error(imported)
        assert not _raw_controls(imported.stderr), imported.stderr
        event("the importer refused the model")
        return
    event("imported")
    listed = run_cli("ops", mlir, "--target", "vulkan,cuda,hip")
    assert listed.returncode == 0, listed
    assert not _raw_controls(listed.stdout) and not _raw_controls(listed.stderr), listed.output
    as_json = run_cli("ops", mlir, "--json", "--target", "vulkan,cuda,hip")
    assert as_json.returncode == 0 and as_json.stdout.isascii(), as_json
    groups = json.loads(as_json.stdout)
    # Lossless where it is data (JSON), escaped on the terminal: the MatMul's name (its op keeps
    # its location) and every other recorded name, each in its escaped form.
    recorded = {n for g in groups for n in g["source"] if n in nodes}
    assert nodes[2] in recorded, (nodes, [g["source"] for g in groups])
    assert all(escape.name(n) in listed.stdout for n in recorded)
    for target in _SOURCES:
        chosen = [g["index"] for g in groups if g["replaceable"] and g["same_as"] is None and (target == "llvm-cpu" or g["targets"][target] is None)]
        if not chosen:
            continue
        event(f"{target}: {len(chosen)} group(s)")
        out = tmp / target
        names = [f"k{i}" for i in chosen]
        pb.replace(mlir, out, ops=chosen, imports=names, onnx=onnx_path, target=target)
        for path in out.iterdir():
            text = path.read_text(encoding="utf-8")
            assert not _raw_controls(text), (path, _raw_controls(text))
            if path.suffix != ".txt":  # the kernels and the spec: ASCII (the CMakeLists.txt names the model's path as it is)
                assert text.isascii(), path
        for name in names:
            _compile_generated(out, target, name)
