"""Issue 45: `import` runs the importer on the model without its weights' bytes and writes the
archive from where those bytes lie in the file (models/ir/weights.py). What it writes must be
what iree-import-onnx writes from the whole file: for any mix of weights (sizes on both sides
of the threshold, element types, raw_data or typed fields or external data, initializers and
Constant nodes, names the importer rewrites), the archive holds the same bytes under the same
keys and the program is the same text. Real tools: iree-import-onnx, iree-compile, the runtime."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import assert_clean_error, run_cli
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx", reason='onnx is not installed (pip install "pyree_build[onnx]")')

import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import pyree_build as pb  # noqa: E402
from pyree_build.actions import parameters  # noqa: E402
from pyree_build.core import toolchain  # noqa: E402
from pyree_build.core.errors import PyreeError  # noqa: E402
from pyree_build.models.ir import weights  # noqa: E402

THRESHOLD = parameters.PARAM_ELEMENTS_THRESHOLD
_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64, "int8": TensorProto.INT8, "float64": TensorProto.DOUBLE}


def _tensor(name: str, dtype: str, size: int, seed: int, storage: str) -> TensorProto:
    values = np.random.default_rng(seed).uniform(-8, 8, size).astype(dtype)
    if storage == "raw":
        return numpy_helper.from_array(values, name)
    return helper.make_tensor(name, _TYPES[dtype], [size], values.tolist())  # typed fields: float_data, int64_data...


@st.composite
def _weight_models(draw: st.DrawFn) -> tuple[TensorProto, ...]:
    """A model whose output is the sum of several weights, each a Cast to f32 of a tensor of
    any storage: initializers first, then Constant nodes, as the importer orders them."""
    count = draw(st.integers(1, 5))
    specs = [
        (
            draw(st.sampled_from(sorted(_TYPES))),
            draw(st.sampled_from([4, THRESHOLD - 1, THRESHOLD, 333])),
            draw(st.sampled_from(["raw", "typed"])),
            draw(st.booleans()),  # a Constant node rather than an initializer
            draw(st.sampled_from(["w{k}", "scope::w{k}", "w {k}/x", "wé{k}"])),  # a quote: iree-import-onnx 3.13 writes it unescaped
        )
        for _ in range(count)
    ]
    return tuple(specs)  # type: ignore[return-value]


def _build(path: Path, specs, seed: int = 0) -> None:
    size = 4
    nodes, inits, total = [], [], "x"
    for k, (dtype, n, storage, as_constant, name) in enumerate(specs):
        tensor_name = name.format(k=k)
        tensor = _tensor(tensor_name, dtype, n, seed + k, storage)
        if as_constant:
            nodes.append(helper.make_node("Constant", [], [f"c{k}"], name=f"const{k}", value=tensor))
            source = f"c{k}"
        else:
            inits.append(tensor)
            source = tensor_name
        nodes += [
            helper.make_node("Cast", [source], [f"f{k}"], to=TensorProto.FLOAT, name=f"cast{k}"),
            helper.make_node("Slice", [f"f{k}", "zero", "four"], [f"s{k}"], name=f"slice{k}"),
            helper.make_node("Add", [total, f"s{k}"], [f"t{k}"], name=f"add{k}"),
        ]
        total = f"t{k}"
    inits += [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([size], np.int64), "four")]
    graph = helper.make_graph(
        nodes,
        "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info(total, TensorProto.FLOAT, [size])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)


def _whole_file_import(model: Path, out: Path) -> tuple[str, bytes]:
    """iree-import-onnx on the whole file, as `import` ran it before: (program, archive bytes)."""
    archive = out.with_name(out.stem + "_params.irpa")
    argv = toolchain.onnx_importer().command(
        model, "-o", out, "--externalize-params", "--save-params-to", archive, "--params-scope", parameters.SCOPE, "--num-elements-threshold", str(THRESHOLD)
    )
    subprocess.run(argv, check=True, capture_output=True)
    return out.read_text(), archive.read_bytes()


def _drop_locations(text: str) -> str:
    """The program without the node names `import` adds and in the importer's parameter form."""
    import re

    text = re.sub(r' loc\("(?:[^"\\]|\\.)*"(?:\("onnx graph\.node":\d+:0\))?\)', "", text).replace("#flow.parameter.named<", "#stream.parameter.named<")
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(specs=_weight_models())
def test_the_weightless_import_writes_what_the_whole_file_import_writes(tmp_path_factory, specs):
    tmp = tmp_path_factory.mktemp("weightless")
    model = tmp / "m.onnx"
    _build(model, specs)
    result = run_cli("-v", "import", model, "-o", tmp / "m.mlir")
    try:
        reference_text, reference_archive = _whole_file_import(model, tmp / "ref.mlir")
    except subprocess.CalledProcessError as refused:  # e.g. f16 in int32_data, which IREE's importer does not read
        assert_clean_error(result, refused.stderr.decode().strip().splitlines()[-1].split(": ")[-1][:40])
        event("the importer refuses the model either way")
        return
    assert result.returncode == 0, result
    assert "importing the whole file instead" not in result.stderr, result.stderr  # the weights lined up
    doubles = sum(dtype == "float64" and n >= THRESHOLD for dtype, n, *_ in specs)
    if doubles:  # kept in the MLIR: the module must compute with them (below), which the archive's form would not
        assert "is double: kept in the MLIR" in result.stderr
        assert (tmp / "m.mlir").read_text().count('dense<"0x') == doubles
    else:
        assert (tmp / "m_params.irpa").read_bytes() == reference_archive
        assert _drop_locations((tmp / "m.mlir").read_text()) == _drop_locations(reference_text)
    # And the module computes the sum of the weights it was given.
    vmfb = pb.compile(tmp / "m.mlir", tmp / "m.vmfb")
    x = np.arange(4, dtype=np.float32)
    (got,) = pb.run(vmfb, "weights", [x])
    terms = [x] + [np.random.default_rng(k).uniform(-8, 8, n).astype(dtype)[:4].astype(np.float32) for k, (dtype, n, *_) in enumerate(specs)]
    want = np.sum(terms, axis=0, dtype=np.float32)
    # A bound relative to the terms' magnitude, not to the sum: IREE may add the constants in
    # another order (a fresh-clone CI run saw 31 f32 ulps at one element of a sum near -11 whose
    # terms reach 7.3; not reproduced here), f64 weights are computed in f32, and IREE 3.13's
    # f16 -> f32 cast on this CPU is off by a few f32 ulps of the f16 value, whichever way the
    # weights were imported. A weight read from the wrong bytes is off by far more.
    scale = np.sum(np.abs(terms), axis=0)
    ulps = 2e-3 if any(dtype == "float16" for dtype, *_ in specs) else 1e-5
    assert np.all(np.abs(got - want) <= ulps * scale), (got, want)


def test_weights_in_external_data_are_copied_from_their_file(tmp_path):
    model_path = tmp_path / "ext.onnx"
    _build(model_path, [("float32", 333, "raw", False, "big{k}"), ("float32", 4, "raw", False, "small{k}")])
    model = onnx.load(model_path)
    onnx.save(model, model_path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin", size_threshold=0)
    result = run_cli("-v", "import", model_path, "-o", tmp_path / "ext.mlir")
    assert result.returncode == 0, result
    assert "importing the whole file instead" not in result.stderr
    _, reference_archive = _whole_file_import(model_path, tmp_path / "ref.mlir")
    assert (tmp_path / "ext_params.irpa").read_bytes() == reference_archive


def test_the_file_is_read_without_its_weights():
    # The model the importer reads holds no weight's bytes: VGG-sized weights cost nothing there.
    specs = [("float32", 100_000, "raw", False, "w{k}"), ("float32", 100_000, "raw", True, "c{k}")]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        _build(path, specs)
        found = weights.load(path, path.parent, THRESHOLD)
        assert path.stat().st_size > 800_000 and found.model.ByteSize() < 2_000
        assert [(w.what, w.length, w.file) for w in found.weights] == [("initializer 'w0'", 400_000, path), ("Constant node's value 'c1'", 400_000, path)]
        raw = path.read_bytes()
        assert all(
            raw[w.offset : w.offset + w.length] == numpy_helper.to_array(t).tobytes()
            for w, t in zip(found.weights, [*onnx.load(path).graph.initializer[:1], onnx.load(path).graph.node[3].attribute[0].t])
        )


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_a_truncated_model_is_refused_and_nothing_is_written(tmp_path, cut):
    path = tmp_path / "m.onnx"
    _build(path, [("float32", 5000, "raw", False, "w{k}")])
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    result = run_cli("import", path, "-o", tmp_path / "m.mlir")
    assert_clean_error(result, "not an ONNX model", str(path))
    assert not (tmp_path / "m.mlir").exists() and not (tmp_path / "m_params.irpa").exists()


def test_external_data_that_does_not_fit_its_file_is_named(tmp_path):
    model_path = tmp_path / "ext.onnx"
    _build(model_path, [("float32", 333, "raw", False, "big{k}")])
    model = onnx.load(model_path)
    onnx.save(model, model_path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin", size_threshold=1000)
    data = tmp_path / "ext.bin"
    data.write_bytes(data.read_bytes()[:1000])  # the weight's 1,332 bytes no longer fit
    result = run_cli("import", model_path, "-o", tmp_path / "ext.mlir")
    assert_clean_error(result, "the external data of initializer 'big0' lies outside ext.bin", "save_as_external_data=True")
    assert not (tmp_path / "ext.mlir").exists()


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12), st.sampled_from([1, 3, 63, 64, 65, 4095, 4097])),
        max_size=5,
        unique_by=lambda e: e[0],
    ),
    from_file=st.booleans(),
)
def test_the_archive_is_the_bytes_irees_own_writer_makes(tmp_path_factory, entries, from_file):
    # weights.write_archive lays out IREE's parameter archive itself (to copy each weight in the
    # kernel): for any keys and lengths, from a file's ranges or from memory, IREE's bytes.
    import iree.runtime as rt

    tmp = tmp_path_factory.mktemp("irpa")
    blobs = [np.random.default_rng(k).integers(0, 256, n, dtype=np.uint8).tobytes() for k, (_, n) in enumerate(entries)]
    source = tmp / "source.bin"
    source.write_bytes(b"x" * 7 + b"".join(blobs))
    found, at = [], 7
    for (key, n), blob in zip(entries, blobs):
        found.append(weights.Weight(key, (n,), 2, source, at, n) if from_file else weights.Weight(key, (n,), 2, None, 0, n, blob))
        at += n
    weights.write_archive(found, [key for key, _ in entries], tmp / "ours.irpa")
    index = rt.ParameterIndex()
    for (key, _), blob in zip(entries, blobs):
        index.add_buffer(key, np.frombuffer(blob, np.uint8))
    index.create_archive_file(str(tmp / "iree.irpa"))
    assert (tmp / "ours.irpa").read_bytes() == (tmp / "iree.irpa").read_bytes()


def test_a_weight_that_ends_before_its_length_is_an_error_not_a_short_archive(tmp_path):
    # The model file cut short between its scan and the copy: the archive is not written short.
    source = tmp_path / "cut.bin"
    source.write_bytes(b"\x01" * 100)
    cut = weights.Weight("initializer 'w'", (50,), 1, source, 0, 200)
    with pytest.raises(PyreeError) as raised:
        weights.write_archive([cut], ["w"], tmp_path / "w.irpa")
    assert "the bytes of initializer 'w' end before its length" in raised.value.what
