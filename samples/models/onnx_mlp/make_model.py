"""Writes mlp.onnx: a two-layer perceptron built with the onnx helper API, small enough to
check in (3 KB), with seeded weights so every build sees the same model.

    x[4,16] -> MatMul W1[16,32] (fc1) -> Add b1 (bias1) -> Relu (relu1)
            -> MatMul W2[32,8] (fc2) -> Softmax (softmax) -> y[4,8]

Run it again only to change the model: `python make_model.py` (needs onnx).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(seed: int = 2026) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def weights(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.25).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu1"),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"], name="fc2"),
        helper.make_node("Softmax", ["h3"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [weights("W1", (16, 32)), weights("b1", (32,)), weights("W2", (32, 8))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="pyree_build sample")
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("mlp.onnx")
    onnx.save(build(), out)
    print(f"wrote {out}")
