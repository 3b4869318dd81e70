"""Per-channel constant scales (ConvNeXt's layer scale) folded into the layer before them
(``dsa_tvm.quant.fold.fold_channel_scales``): the FP32 graph computes the same (to float
rounding), and a Mul that is not a per-output-channel factor of a sole-consumer layer is
left alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from dsa_tvm.models.quantize import run_onnxruntime
from dsa_tvm.quant.fold import fold_channel_scales


def _model(nodes, inits, x_shape, y_shape) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _linear(rng, k: int, n: int, gamma: np.ndarray, bias_first: bool, extra_reader=False):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["b", "m"] if bias_first else ["m", "b"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "g"], ["y" if not extra_reader else "s"], name="mul")]
    if extra_reader:  # the biased result is also a graph output: not foldable
        nodes.append(helper.make_node("Add", ["s", "a"], ["y"], name="other"))
    inits = {"w": rng.standard_normal((k, n)), "b": rng.standard_normal(n), "g": gamma}
    return _model(nodes, inits, (1, 5, 5, k), (1, 5, 5, n))


def _same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, shape) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    a = run_onnxruntime(before, {"x": x}, optimize=False)[0]
    b = run_onnxruntime(after, {"x": x}, optimize=False)[0]
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(a).max())))


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 20), n=st.integers(1, 20), bias_first=st.booleans(),
       form=st.sampled_from(["vector", "scalar", "broadcast4d", "tiny"]))
def test_linear_layer_scale_folds_and_computes_the_same(k, n, bias_first, form):
    rng = np.random.default_rng(k * 31 + n)
    gamma = {"vector": rng.uniform(-2, 2, n), "scalar": np.array(0.37),
             "broadcast4d": rng.uniform(0.1, 1, (1, 1, 1, n)),
             "tiny": np.full(n, 1e-6)}[form]
    m = _linear(rng, k, n, gamma, bias_first)
    before = onnx.ModelProto()
    before.CopyFrom(m)
    assert fold_channel_scales(m) == ["mul"]
    assert [n.op_type for n in m.graph.node] == ["MatMul", "Add"]
    onnx.checker.check_model(m)
    _same_outputs(before, m, (1, 5, 5, k))


def test_conv_scale_folds_into_weights_and_bias():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Mul", ["g", "c"], ["y"], name="mul")]
    m = _model(nodes, {"w": rng.standard_normal((6, 3, 3, 3)), "b": rng.standard_normal(6),
                       "g": rng.uniform(-1, 1, (6, 1, 1))}, (1, 3, 8, 8), (1, 6, 6, 6))
    before = onnx.ModelProto()
    before.CopyFrom(m)
    assert fold_channel_scales(m) == ["mul"]
    assert [n.op_type for n in m.graph.node] == ["Conv"]
    _same_outputs(before, m, (1, 3, 8, 8))


@pytest.mark.parametrize("case", ["spatial", "shared", "activation", "bias_along_w", "nan",
                                  "overflow"])
def test_what_is_not_a_channel_scale_stays(case):
    rng = np.random.default_rng(2)
    if case == "spatial":     # varies along H: no per-output-channel factor
        m = _linear(rng, 4, 3, rng.uniform(0.5, 1, (1, 5, 1, 1)), False)
    elif case == "shared":    # the biased result has another reader
        m = _linear(rng, 4, 3, rng.uniform(0.5, 1, 3), False, extra_reader=True)
    elif case in ("nan", "overflow"):  # non-finite scale, or weights * scale past float32
        gamma = np.array([1.0, np.nan, 2.0]) if case == "nan" else np.full(3, 1e38)
        m = _linear(rng, 4, 3, gamma, False)
        (w,) = [i for i in m.graph.initializer if i.name == "w"]
        w.CopyFrom(numpy_helper.from_array(np.full((4, 3), 1e3, np.float32), "w"))
    elif case == "bias_along_w":  # the bias varies along W, not the output channels
        m = _linear(rng, 4, 3, rng.uniform(0.5, 1, 3), False)
        (b,) = [i for i in m.graph.initializer if i.name == "b"]
        b.CopyFrom(numpy_helper.from_array(rng.standard_normal((5, 1)).astype(np.float32), "b"))
    else:                     # x * x: no constant
        m = _model([helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                    helper.make_node("Mul", ["m", "m"], ["y"], name="mul")],
                   {"w": rng.standard_normal((4, 3))}, (1, 5, 5, 4), (1, 5, 5, 3))
    ops = [n.op_type for n in m.graph.node]
    assert fold_channel_scales(m) == []
    assert [n.op_type for n in m.graph.node] == ops
