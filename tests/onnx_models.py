"""Small ONNX models built with the onnx helper API, for the real-model tests (issue 21).

Each builder returns an `onnx.ModelProto` with named nodes, seeded random weights and static
shapes, at opset 17 and IR version 8 (which onnxruntime 1.32 accepts). `save(model, path)`
writes one. The module imports onnx at its top: a test that uses it skips without onnx first
(`pytest.importorskip("onnx")`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


def _weights(seed: int, name: str, shape: Sequence[int], scale: float = 0.1) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(name: str, nodes: list[onnx.NodeProto], inputs: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]],
           initializers: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:  # fmt: skip
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs.items()],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION, producer_name="pyree_build tests")
    onnx.checker.check_model(model)
    return model


def mlp(seed: int = 0) -> onnx.ModelProto:
    """x[4,16] -> MatMul W1[16,32] -> Add b1 -> Relu -> MatMul W2[32,8] -> Softmax."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu1"),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"], name="fc2"),
        helper.make_node("Softmax", ["h3"], ["y"], name="softmax", axis=-1),
    ]
    weights = [_weights(seed, "W1", (16, 32)), _weights(seed + 1, "b1", (32,)), _weights(seed + 2, "W2", (32, 8))]
    return _model("mlp", nodes, {"x": (4, 16)}, {"y": (4, 8)}, weights)


def gemm_trans_b(seed: int = 0) -> onnx.ModelProto:
    """Gemm(a[4,16], B[8,16], C[8]) with transB=1 (alpha and beta at their defaults)."""
    nodes = [helper.make_node("Gemm", ["a", "B", "C"], ["y"], name="gemm", transB=1)]
    return _model("gemm_trans_b", nodes, {"a": (4, 16)}, {"y": (4, 8)}, [_weights(seed, "B", (8, 16)), _weights(seed + 1, "C", (8,))])


def matmul_add_relu(seed: int = 0) -> onnx.ModelProto:
    """x[8,12] -> MatMul W[12,6] -> Add b[6] -> Relu."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "b"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    return _model("matmul_add_relu", nodes, {"x": (8, 12)}, {"y": (8, 6)}, [_weights(seed, "W", (12, 6)), _weights(seed + 1, "b", (6,))])


def softmax() -> onnx.ModelProto:
    """Softmax of x[4,10] over the last axis."""
    return _model("softmax", [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=-1)], {"x": (4, 10)}, {"y": (4, 10)})


def layer_norm(seed: int = 0) -> onnx.ModelProto:
    """LayerNormalization of x[3,16] over the last axis, with scale and bias."""
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], name="layer_norm", axis=-1, epsilon=1e-5)]
    rng = np.random.default_rng(seed)
    scale = numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(16)).astype(np.float32), "scale")
    return _model("layer_norm", nodes, {"x": (3, 16)}, {"y": (3, 16)}, [scale, _weights(seed + 1, "bias", (16,))])


def elementwise_broadcast(seed: int = 0) -> onnx.ModelProto:
    """Add(x[4,8], b[8]) -> Mul(.., c[1,8]) -> Tanh: two broadcasts in a chain."""
    nodes = [
        helper.make_node("Add", ["x", "b"], ["s"], name="add_b"),
        helper.make_node("Mul", ["s", "c"], ["p"], name="mul_c"),
        helper.make_node("Tanh", ["p"], ["y"], name="tanh"),
    ]
    return _model("elementwise_broadcast", nodes, {"x": (4, 8)}, {"y": (4, 8)}, [_weights(seed, "b", (8,), 1.0), _weights(seed + 1, "c", (1, 8), 1.0)])


def two_groups(seed: int = 0) -> onnx.ModelProto:
    """Two MatMul + Relu blocks: x[4,16] -> [4,32] -> [4,8]."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["m1"], name="block1_matmul"),
        helper.make_node("Relu", ["m1"], ["r1"], name="block1_relu"),
        helper.make_node("MatMul", ["r1", "W2"], ["m2"], name="block2_matmul"),
        helper.make_node("Relu", ["m2"], ["y"], name="block2_relu"),
    ]
    return _model("two_groups", nodes, {"x": (4, 16)}, {"y": (4, 8)}, [_weights(seed, "W1", (16, 32)), _weights(seed + 1, "W2", (32, 8))])


# Every builder above, by name, for tests that go over all of them.
BUILDERS = {f.__name__: f for f in (mlp, gemm_trans_b, matmul_add_relu, softmax, layer_norm, elementwise_broadcast, two_groups)}


def save(model: onnx.ModelProto, path: str | os.PathLike[str]) -> str:
    """Write `model` to `path` (its directory is created) and return the path as a string."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    onnx.save(model, os.fspath(path))
    return os.fspath(path)
