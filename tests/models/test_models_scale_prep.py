"""Issue 45: benchmarks/models_scale.py's preparation of onnx's light models (real CNN
architectures whose weights are ConstantOfShape nodes) into models as a user has them: opset 17,
random initializers, inputs that are the data only, accepted by onnx.checker and run by
onnxruntime with finite outputs that are not saturated. The benchmark itself is on demand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import benchmark_module

onnx = pytest.importorskip("onnx", reason="the light models ship in the onnx wheel: pip install pyree_build[onnx]")
ort = pytest.importorskip("onnxruntime", reason="the preparation runs the model in onnxruntime: pip install pyree_build[onnx]")


def _benchmark() -> Any:
    return benchmark_module("models_scale")


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])  # no BatchNormalization; 49 of them (calibrated)
def test_prepared_light_model_runs(name: str, tmp_path: Path) -> None:
    import numpy as np

    bench = _benchmark()
    light = bench.light_models()
    if name not in light:
        pytest.skip(f"onnx {onnx.__version__} ships no light_{name}.onnx (onnx/backend/test/data/light)")
    out = tmp_path / f"{name}.onnx"
    facts = bench.prepare(light[name], out)
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == bench.IR_VERSION
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [bench.OPSET]
    assert not [n.name for n in model.graph.node if n.op_type == "ConstantOfShape"]
    assert facts["constant_of_shape_left"] == 0 and facts["weights"] > 0
    assert [i.name for i in model.graph.input] == ["data_0" if name == "squeezenet" else "gpu_0/data_0"]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (y,) = session.run(None, {session.get_inputs()[0].name: x})
    assert np.isfinite(y).all()
    assert y.max() < 0.99, "the softmax is saturated (one-hot): verify could not tell a slightly wrong kernel apart"
    # seeded: the same weights again
    again = tmp_path / "again.onnx"
    bench.prepare(light[name], again)
    assert again.read_bytes() == out.read_bytes()


def test_table_marks_misses_and_failures() -> None:
    bench = _benchmark()
    record = {
        "model": "m",
        "prep": {"parameters": 2_000_000},
        "steps": {
            "import": {"seconds": 1.0},
            "compile": {"seconds": 10.0},
            "ops": {"seconds": 6.0, "groups": 10, "replaceable": 8, "refusals": {"a gather": 2}},
            "replace": {"error": "timed out after 900 s"},
        },
    }
    text = bench.table([record])
    assert "| m | 2.0 | 1.0 | 10.0 | 6.0 | 10 | 8 (80% !) | timeout |" in text
    assert "0.70 !" in text
