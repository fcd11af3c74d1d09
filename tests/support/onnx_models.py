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


def dense_layer(m: int, k: int, n: int, seed: int = 0) -> onnx.ModelProto:
    """x[m,k] -> MatMul W[k,n] -> Add b[n] -> Relu, at any size (matmul_add_relu's ops)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
        helper.make_node("Add", ["h", "b"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    return _model("dense", nodes, {"x": (m, k)}, {"y": (m, n)}, [_weights(seed, "W", (k, n)), _weights(seed + 1, "b", (n,))])


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


# Real architectures in miniature (issue 33): the op mix and the fusion boundaries of the real
# networks, at sizes a naive C kernel runs in well under a second.


def _conv(
    seed: int, name: str, x: str, cin: int, cout: int, k: int, *, stride: int = 1, pad: int = 0, bias: bool = True
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Conv(x) -> `name`, with its weights (and bias) as initializers."""
    weights = [_weights(seed, f"{name}_w", (cout, cin, k, k), 0.3)]
    inputs = [x, f"{name}_w"]
    if bias:
        weights.append(_weights(seed + 1, f"{name}_b", (cout,)))
        inputs.append(f"{name}_b")
    node = helper.make_node("Conv", inputs, [name], name=name, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    return [node], weights


def _conv_relu(seed: int, name: str, x: str, cin: int, cout: int, k: int, **kw: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    nodes, weights = _conv(seed, f"{name}_conv", x, cin, cout, k, **kw)
    return [*nodes, helper.make_node("Relu", [f"{name}_conv"], [name], name=f"{name}_relu")], weights


def squeezenet_like(seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet's shape: conv+relu, max pool, two fire modules (squeeze 1x1 + relu, expand
    1x1 and 3x3 + relu, concat), a 1x1 classifier conv + relu, global average pool, flatten,
    softmax. x[1,3,17,17] -> y[1,10]."""
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []

    def add(made: tuple[list[onnx.NodeProto], list[onnx.TensorProto]]) -> None:
        nodes.extend(made[0])
        weights.extend(made[1])

    add(_conv_relu(seed, "conv1", "x", 3, 8, 3, stride=2))  # [1,8,8,8]
    nodes.append(helper.make_node("MaxPool", ["conv1"], ["pool1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]))  # [1,8,4,4]
    x, channels = "pool1", 8
    for f, (squeeze, expand) in enumerate(((4, 8), (4, 8))):
        fire = f"fire{f + 2}"
        add(_conv_relu(seed + 10 * f + 2, f"{fire}_squeeze", x, channels, squeeze, 1))
        add(_conv_relu(seed + 10 * f + 4, f"{fire}_expand1", f"{fire}_squeeze", squeeze, expand, 1))
        add(_conv_relu(seed + 10 * f + 6, f"{fire}_expand3", f"{fire}_squeeze", squeeze, expand, 3, pad=1))
        nodes.append(helper.make_node("Concat", [f"{fire}_expand1", f"{fire}_expand3"], [fire], name=f"{fire}_concat", axis=1))
        x, channels = fire, 2 * expand
    add(_conv_relu(seed + 40, "classifier", x, channels, 10, 1))
    nodes += [
        helper.make_node("GlobalAveragePool", ["classifier"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
        helper.make_node("Softmax", ["flat"], ["y"], name="softmax", axis=-1),
    ]
    return _model("squeezenet_like", nodes, {"x": (1, 3, 17, 17)}, {"y": (1, 10)}, weights)


def _batch_norm(seed: int, name: str, x: str, channels: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    rng = np.random.default_rng(seed)
    params = [
        numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(channels)).astype(np.float32), f"{name}_scale"),
        numpy_helper.from_array((0.1 * rng.standard_normal(channels)).astype(np.float32), f"{name}_bias"),
        numpy_helper.from_array((0.1 * rng.standard_normal(channels)).astype(np.float32), f"{name}_mean"),
        numpy_helper.from_array((1.0 + 0.2 * rng.random(channels)).astype(np.float32), f"{name}_var"),
    ]
    node = helper.make_node("BatchNormalization", [x, *(p.name for p in params)], [name], name=name, epsilon=1e-5)
    return [node], params


def resnet_block(seed: int = 0) -> onnx.ModelProto:
    """ResNet's bottleneck with a projection shortcut: conv 1x1 + BN + relu, conv 3x3 (stride 2)
    + BN + relu, conv 1x1 + BN; the shortcut conv 1x1 (stride 2) + BN; add, relu; then global
    average pool, flatten and a Gemm classifier. x[1,8,8,8] -> y[1,5]."""
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []

    def add(made: tuple[list[onnx.NodeProto], list[onnx.TensorProto]]) -> None:
        nodes.extend(made[0])
        weights.extend(made[1])

    add(_conv(seed, "conv_a", "x", 8, 4, 1, bias=False))
    add(_batch_norm(seed + 1, "bn_a", "conv_a", 4))
    nodes.append(helper.make_node("Relu", ["bn_a"], ["relu_a"], name="relu_a"))
    add(_conv(seed + 2, "conv_b", "relu_a", 4, 4, 3, stride=2, pad=1, bias=False))
    add(_batch_norm(seed + 3, "bn_b", "conv_b", 4))
    nodes.append(helper.make_node("Relu", ["bn_b"], ["relu_b"], name="relu_b"))
    add(_conv(seed + 4, "conv_c", "relu_b", 4, 16, 1, bias=False))
    add(_batch_norm(seed + 5, "bn_c", "conv_c", 16))
    add(_conv(seed + 6, "shortcut", "x", 8, 16, 1, stride=2, bias=False))
    add(_batch_norm(seed + 7, "bn_s", "shortcut", 16))
    nodes += [
        helper.make_node("Add", ["bn_c", "bn_s"], ["sum"], name="residual"),
        helper.make_node("Relu", ["sum"], ["out"], name="relu_out"),
        helper.make_node("GlobalAveragePool", ["out"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    weights += [_weights(seed + 8, "fc_w", (5, 16)), _weights(seed + 9, "fc_b", (5,))]
    return _model("resnet_block", nodes, {"x": (1, 8, 8, 8)}, {"y": (1, 5)}, weights)


def _layer_norm(seed: int, name: str, x: str, width: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    rng = np.random.default_rng(seed)
    scale = numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32), f"{name}_scale")
    node = helper.make_node("LayerNormalization", [x, f"{name}_scale", f"{name}_bias"], [name], name=name, axis=-1, epsilon=1e-5)
    return [node], [scale, _weights(seed + 1, f"{name}_bias", (width,))]


def _gelu(name: str, x: str) -> list[onnx.NodeProto]:
    """GELU written out with Erf, as exporters emit it: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    return [
        helper.make_node("Div", [x, f"{name}_sqrt2"], [f"{name}_d"], name=f"{name}_div"),
        helper.make_node("Erf", [f"{name}_d"], [f"{name}_e"], name=f"{name}_erf"),
        helper.make_node("Add", [f"{name}_e", f"{name}_one"], [f"{name}_a"], name=f"{name}_add"),
        helper.make_node("Mul", [x, f"{name}_a"], [f"{name}_m"], name=f"{name}_mul"),
        helper.make_node("Mul", [f"{name}_m", f"{name}_half"], [name], name=f"{name}_half_mul"),
    ]


def _gelu_constants(name: str) -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), f"{name}_sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), f"{name}_one"),
        numpy_helper.from_array(np.array(0.5, np.float32), f"{name}_half"),
    ]


def transformer_block(seed: int = 0, tokens: int = 4, width: int = 16, heads: int = 2) -> onnx.ModelProto:
    """A pre-norm transformer encoder block: LayerNorm, Q/K/V projections, heads split
    (Reshape + Transpose), scaled dot-product attention with Softmax, heads merged, output
    projection and residual; LayerNorm, MLP with erf GELU, residual. x[tokens,width]."""
    head = width // heads
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []
    ln1, w = _layer_norm(seed, "ln1", "x", width)
    nodes += ln1
    weights += w
    for k, part in enumerate("qkv"):
        weights += [_weights(seed + 2 + k, f"w{part}", (width, width)), _weights(seed + 5 + k, f"b{part}", (width,))]
        nodes += [
            helper.make_node("MatMul", ["ln1", f"w{part}"], [f"{part}_mm"], name=f"{part}_proj"),
            helper.make_node("Add", [f"{part}_mm", f"b{part}"], [f"{part}_b"], name=f"{part}_bias"),
            helper.make_node("Reshape", [f"{part}_b", "split_shape"], [f"{part}_r"], name=f"{part}_split"),
            helper.make_node("Transpose", [f"{part}_r"], [part], name=f"{part}_heads", perm=[1, 0, 2]),  # [heads,tokens,head]
        ]
    weights += [
        numpy_helper.from_array(np.array([tokens, heads, head], np.int64), "split_shape"),
        numpy_helper.from_array(np.array([tokens, width], np.int64), "merge_shape"),
        numpy_helper.from_array(np.array(np.sqrt(head), np.float32), "scale"),
    ]
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Div", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Softmax", ["scaled"], ["attn"], name="attn", axis=-1),
        helper.make_node("MatMul", ["attn", "v"], ["ctx"], name="context"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="ctx_t", perm=[1, 0, 2]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["merged"], name="merge"),
        helper.make_node("MatMul", ["merged", "wo"], ["o_mm"], name="o_proj"),
        helper.make_node("Add", ["o_mm", "bo"], ["o"], name="o_bias"),
        helper.make_node("Add", ["x", "o"], ["res1"], name="residual1"),
    ]
    weights += [_weights(seed + 8, "wo", (width, width)), _weights(seed + 9, "bo", (width,))]
    ln2, w = _layer_norm(seed + 10, "ln2", "res1", width)
    nodes += ln2
    weights += w
    nodes += [
        helper.make_node("MatMul", ["ln2", "w1"], ["f1_mm"], name="ffn1"),
        helper.make_node("Add", ["f1_mm", "b1"], ["f1"], name="ffn1_bias"),
        *_gelu("gelu", "f1"),
        helper.make_node("MatMul", ["gelu", "w2"], ["f2_mm"], name="ffn2"),
        helper.make_node("Add", ["f2_mm", "b2"], ["f2"], name="ffn2_bias"),
        helper.make_node("Add", ["res1", "f2"], ["y"], name="residual2"),
    ]
    weights += [_weights(seed + 12, "w1", (width, 2 * width)), _weights(seed + 13, "b1", (2 * width,))]
    weights += [_weights(seed + 14, "w2", (2 * width, width)), _weights(seed + 15, "b2", (width,)), *_gelu_constants("gelu")]
    return _model("transformer_block", nodes, {"x": (tokens, width)}, {"y": (tokens, width)}, weights)


def gemm_gelu_norm(seed: int = 0) -> onnx.ModelProto:
    """A user's own block (issue 33): Gemm -> erf GELU -> LayerNorm -> MatMul -> Softmax, x[4,64]."""
    nodes = [helper.make_node("Gemm", ["x", "gw", "gb"], ["g"], name="gemm"), *_gelu("gelu", "g")]
    ln, w = _layer_norm(seed + 2, "norm", "gelu", 64)
    nodes += [*ln, helper.make_node("MatMul", ["norm", "mw"], ["m"], name="matmul"), helper.make_node("Softmax", ["m"], ["y"], name="softmax", axis=-1)]
    weights = [_weights(seed, "gw", (64, 64)), _weights(seed + 1, "gb", (64,)), *w, _weights(seed + 4, "mw", (64, 64)), *_gelu_constants("gelu")]
    return _model("gemm_gelu_norm", nodes, {"x": (4, 64)}, {"y": (4, 64)}, weights)


# Networks of real shape, for the coverage tests (heavier than BUILDERS' single ops).
ARCHITECTURES = {f.__name__: f for f in (squeezenet_like, resnet_block, transformer_block, gemm_gelu_norm)}


def conv_batch_norm_chain(blocks: Sequence[tuple[int, bool, int | None]], seed: int = 0, channels: int = 4, size: int = 6) -> onnx.ModelProto:
    """Same-shape convolutions, each followed by its BatchNorm: block i is (kernel 1 or 3, a Relu
    after the norm, the earlier block whose output is added to this one's, or None). Every
    convolution has the same output type, so IREE gives them one zero fill to share.
    x[1,channels,size,size] -> y, the last block's output."""
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []
    outputs = ["x"]
    for i, (kernel, relu, residual) in enumerate(blocks):
        made = _conv(seed + 3 * i, f"conv{i}", outputs[-1], channels, channels, kernel, pad=kernel // 2, bias=bool(i % 2))
        normed = _batch_norm(seed + 3 * i + 1, f"bn{i}", f"conv{i}", channels)
        nodes += made[0] + normed[0]
        weights += made[1] + normed[1]
        last = f"bn{i}"
        if residual is not None:
            nodes.append(helper.make_node("Add", [last, outputs[residual]], [f"sum{i}"], name=f"sum{i}"))
            last = f"sum{i}"
        if relu:
            nodes.append(helper.make_node("Relu", [last], [f"relu{i}"], name=f"relu{i}"))
            last = f"relu{i}"
        outputs.append(last)
    nodes.append(helper.make_node("Identity", [outputs[-1]], ["y"], name="y"))
    shape = (1, channels, size, size)
    return _model("conv_batch_norm_chain", nodes, {"x": shape}, {"y": shape}, weights)


def batch_norm_then_scale(seed: int = 0, channels: int = 128, size: int = 7) -> onnx.ModelProto:
    """Conv, then a BatchNormalization followed by a per-channel Mul and Add + Relu whose
    [C] parameters each go through an Unsqueeze of their own to [C,1,1], as Caffe2's models
    (ONNX's light DenseNet-121) write a batch norm's affine step."""
    rng = np.random.default_rng(seed)
    conv, weights = _conv(seed, "conv", "x", 8, channels, 3, pad=1)
    norm, params = _batch_norm(seed + 2, "bn", "conv", channels)
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "axes")
    gamma = numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(channels)).astype(np.float32), "gamma")
    beta = numpy_helper.from_array((0.1 * rng.standard_normal(channels)).astype(np.float32), "beta")
    nodes = [
        *conv,
        *norm,
        helper.make_node("Unsqueeze", ["gamma", "axes"], ["gamma_c11"], name="gamma_reshape"),
        helper.make_node("Mul", ["bn", "gamma_c11"], ["scaled"], name="scale"),
        helper.make_node("Unsqueeze", ["beta", "axes"], ["beta_c11"], name="beta_reshape"),
        helper.make_node("Add", ["scaled", "beta_c11"], ["shifted"], name="shift"),
        helper.make_node("Relu", ["shifted"], ["y"], name="relu"),
    ]
    shape = (1, channels, size, size)
    return _model("batch_norm_then_scale", nodes, {"x": (1, 8, size, size)}, {"y": shape}, [*weights, *params, axes, gamma, beta])


def batch_norm_of_inputs() -> onnx.ModelProto:
    """BatchNormalization whose statistics are graph inputs (as in ONNX's node tests): IREE
    reshapes each [3] parameter to [1,3,1,1] inside the norm's groups. A further input `t`,
    reshaped to [1,3,1,1] alike by an Unsqueeze and read by two nodes, stays a lone reshape
    group whose op also appears inside the larger groups. The variance goes through Abs first,
    so random inputs stay valid."""
    axes = numpy_helper.from_array(np.array([0, 2, 3], np.int64), "axes")
    nodes = [
        helper.make_node("Abs", ["v"], ["var"], name="abs"),
        helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], name="bn", epsilon=1e-5),
        helper.make_node("Unsqueeze", ["t", "axes"], ["t_1c11"], name="t_reshape"),
        helper.make_node("Mul", ["y", "t_1c11"], ["scaled"], name="scale_by_t"),
        helper.make_node("Add", ["x", "t_1c11"], ["shifted"], name="shift_by_t"),
    ]
    inputs = {"x": (2, 3, 4, 5), "scale": (3,), "bias": (3,), "mean": (3,), "v": (3,), "t": (3,)}
    outputs = {"scaled": (2, 3, 4, 5), "shifted": (2, 3, 4, 5)}
    return _model("batch_norm_of_inputs", nodes, inputs, outputs, [axes])


def center_crop_pad() -> onnx.ModelProto:
    """ONNX's CenterCropPad, expanded (as its node test writes it): pad x[10,7,3] to at least
    `shape`, then slice `shape` out of the middle; the output's size is static (20x10x3), so
    the slice's end (start + shape) only computes sizes IREE knows already."""
    two = numpy_helper.from_array(np.array([2], np.int64), "two")
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="x_shape"),
        helper.make_node("Max", ["x_shape", "shape"], ["target"], name="target"),
        helper.make_node("Sub", ["target", "x_shape"], ["grow"], name="grow"),
        helper.make_node("Div", ["grow", "two"], ["before"], name="before"),
        helper.make_node("Sub", ["grow", "before"], ["after"], name="after"),
        helper.make_node("Concat", ["before", "after"], ["pads"], name="pads", axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"], name="pad"),
        helper.make_node("Shape", ["padded"], ["padded_shape"], name="padded_shape"),
        helper.make_node("Sub", ["padded_shape", "shape"], ["spare"], name="spare"),
        helper.make_node("Div", ["spare", "two"], ["start"], name="start"),
        helper.make_node("Add", ["start", "shape"], ["end"], name="end"),
        helper.make_node("Slice", ["padded", "start", "end"], ["y"], name="crop"),
    ]
    graph = helper.make_graph(
        nodes,
        "center_crop_pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 7, 3]), helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [20, 10, 3])],
        [two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION, producer_name="pyree_build tests")
    onnx.checker.check_model(model)
    return model
