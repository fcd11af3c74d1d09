"""ONNX node names are data: nodes that share a name, have none, or carry a name forged to
look like another node's location keep a location each, so `ops` forms the same groups as it
does for distinct names, shows the user's names, and every group replaces and verifies.

Everything is real: iree-import-onnx, iree-compile, zig cc for the plugins, iree-run-module
and onnxruntime.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import assert_clean_error, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402
from support import onnx_models  # noqa: E402

from pyree_build.models.ir import importer, program  # noqa: E402

# The form a repeated name's location takes, forged into a name of its own.
_FORGED = 'm"("onnx graph.node":3:0)'

# mlp's five nodes (fc1, bias1, relu1, fc2, softmax) renamed by their index. relu1 and fc2
# are in different groups; "forged" names bias1 as if it were fc2's location.
RENAMINGS: dict[str, Callable[[int], str]] = {
    "all_the_same": lambda i: "n",
    "all_empty": lambda i: "",
    "forged": lambda i: ["a", _FORGED, "m", "m", "m#1"][i],
}


def _import(tmp_path: Path, tag: str, rename: Callable[[int], str] | None) -> tuple[Path, Path]:
    model = onnx_models.mlp()
    if rename is not None:
        for i, node in enumerate(model.graph.node):
            node.name = rename(i)
    onnx_file = Path(onnx_models.save(model, tmp_path / f"{tag}.onnx"))
    mlir = tmp_path / f"{tag}.mlir"
    result = run_cli("import", onnx_file, "-o", mlir)
    assert result.returncode == 0, result
    return onnx_file, mlir


def _ops(mlir: Path) -> list[dict]:
    result = run_cli("ops", mlir, "--json")
    assert result.returncode == 0, result
    return json.loads(result.stdout)


def _without_source(groups: list[dict]) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "source"} for g in groups]


@pytest.fixture(scope="module")
def distinct(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    onnx_file, mlir = _import(tmp_path_factory.mktemp("distinct"), "distinct", None)
    return onnx_file, _ops(mlir)


@pytest.mark.parametrize("renaming", sorted(RENAMINGS))
def test_nodes_of_one_name_keep_their_groups_apart_and_all_replace(tmp_path, distinct, renaming):
    rename = RENAMINGS[renaming]
    onnx_file, mlir = _import(tmp_path, renaming, rename)
    reference, distinct_groups = distinct
    groups = _ops(mlir)
    # The same groups as with distinct names: no two nodes' ops merged into one group.
    assert len(distinct_groups) > 1 and _without_source(groups) == _without_source(distinct_groups), groups
    names = {rename(i) for i in range(5)} - {""}
    for group in groups:
        # The user's own names, never the index the location adds.
        assert group["source"], group
        assert set(group["source"]) <= names if names else all("onnx graph.node" not in s for s in group["source"]), group
    replaceable = [g["index"] for g in groups if g["replaceable"]]
    assert len(replaceable) > 1, groups
    out = tmp_path / "kernels"
    imports = [f"k{i}" for i in replaceable]
    replaced = run_cli("replace", mlir, "--ops", ",".join(map(str, replaceable)), "--import", ",".join(imports), "-o", out, "--onnx", onnx_file)
    assert replaced.returncode == 0, replaced
    plugins = []
    for name in imports:
        built = run_cli("plugin", "--kind", "system", out / f"{name}.c", "-o", out / f"{name}.so")
        assert built.returncode == 0, built
        plugins += ["--plugin", out / f"{name}.so"]
    module = out / "replaced.vmfb"
    expects = [a for name in imports for a in ("--expect-import", name)]
    compiled = run_cli("compile", mlir, "-o", module, "--transform-spec", out / "spec.mlir", *expects)
    assert compiled.returncode == 0, compiled
    # onnxruntime refuses a model whose nodes share a name ("two nodes with same node name"):
    # the numbers are checked against the same model with distinct names (names compute nothing).
    verified = run_cli("verify", module, "--onnx", reference, *plugins)
    assert verified.returncode == 0, verified
    # Each import is really called: without the last plugin the module cannot run.
    assert run_cli("verify", module, "--onnx", reference, *plugins[:-2]).returncode != 0


@pytest.fixture(scope="module")
def plain_mlp(tmp_path_factory: pytest.TempPathFactory) -> str:
    _, mlir = _import(tmp_path_factory.mktemp("plain"), "mlp", None)
    return "\n".join(line.split(" loc(", 1)[0] for line in mlir.read_text().split("\n"))


_NAMES = st.one_of(st.sampled_from(["", "n", "n#1", _FORGED, "\\22", '"', "é", "e\u0301", "\\C3\\A9"]), st.text(max_size=6))


@settings(max_examples=60, deadline=None)
@given(names=st.lists(_NAMES, min_size=5, max_size=5))
def test_every_named_node_has_a_location_of_its_own_that_shows_its_name(plain_mlp, names):
    # As MLIR reads them (its parser, not a comparison of text): no two nodes' locations are
    # equal, and each named one shows exactly the node's name.
    model = onnx_models.mlp()
    for node, name in zip(model.graph.node, names, strict=True):
        node.name = name
    named = importer.name_locations(plain_mlp, model.graph)
    assert not isinstance(named, str), named
    _, nodes = named
    counts = {n: names.count(n) for n in names}
    with program.ir.Context() as context:
        context.allow_unregistered_dialects = True
        locations = []
        for node in nodes:
            written = importer.node_location(node, counts[node.name] > 1)
            if not node.name:
                assert written == ""  # its op keeps its own line's location
                continue
            # The module holds its ops: an op read from a module no name keeps is freed under it.
            module = program.ir.Module.parse(f'"t.op"() : () -> () {written}')
            location = module.body.operations[0].location
            assert program.location_names(location) == [node.name], written
            locations.append(str(location))
    assert len(set(locations)) == len(locations), locations


@pytest.mark.parametrize("name", ["n", ""])
def test_an_op_iree_cannot_lower_is_named_by_its_index_where_its_name_does_not_say(tmp_path, name):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name=name), helper.make_node("Softsign", ["r"], ["y"], name=name)]
    graph = helper.make_graph(
        nodes, "soft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])]
    )
    onnx_file = onnx_models.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "soft.onnx")
    result = run_cli("import", onnx_file, "-o", tmp_path / "soft.mlir")
    assert_clean_error(result, f"ONNX node {repr(name) if name else '(unnamed)'} (Softsign, graph.node[1]) cannot be lowered by IREE")


def test_an_unnamed_nodes_op_is_located_in_the_program_the_user_gets(tmp_path):
    # An unnamed node's op keeps the location of its line: of the program `import` wrote, never
    # of the private file it was written to first (the view import's check keeps for `ops`).
    _, mlir = _import(tmp_path, "unnamed", RENAMINGS["all_empty"])
    sources = [s for g in _ops(mlir) for s in g["source"]]
    assert sources and all(".tmp" not in s for s in sources), sources
    assert any(f"{mlir.name}:" in s for s in sources), sources


@pytest.mark.parametrize("graph_name", ["Extracted from {resnet50}", "f(x) [2]"])
def test_a_graph_name_with_spaces_and_brackets_is_the_function_run_and_verify_find(tmp_path, graph_name):
    # The module's function is named after the graph, data that may hold spaces and brackets
    # (onnx.utils.extract_model names its graph "Extracted from {...}"). verify and run find it
    # by that name with no --function; read up to the first space, it was "not exported".
    import numpy as np

    import pyree_build as pb

    proto = onnx_models.mlp()
    proto.graph.name = graph_name
    model = tmp_path / "m.onnx"
    onnx_models.save(proto, model)
    mlir = pb.import_onnx(model, tmp_path / "m.mlir")
    module = pb.compile(mlir, tmp_path / "m.vmfb")
    assert pb.verify(module, model).passed
    (result,) = pb.run(module, graph_name, [np.full((4, 16), 0.5, np.float32)])
    assert result.shape == (4, 8) and np.allclose(result.sum(axis=-1), 1.0, atol=1e-5)
