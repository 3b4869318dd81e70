"""The onnxruntime reference is exact on every x86 machine.

onnxruntime's uint8 x int8 kernels saturate 16-bit pair sums on CPUs without VNNI, so a
QOperator reference run with them would differ between machines. ``ort_session.session``
moves int8 weight constants of uint8-activation ops to uint8; these tests drive the worst
case (255 x 127 everywhere) against int64 numpy, bit-exactly, on whatever CPU runs them.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from dsa_tvm.ort_session import session, uint8_weights


def _matmul_integer(x_type: int, w: np.ndarray, w_zp: np.ndarray | None, m: int) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    if w_zp is not None:
        inits.append(numpy_helper.from_array(w_zp, "wz"))
        inputs += ["", "wz"]
    g = helper.make_graph([helper.make_node("MatMulInteger", inputs, ["y"])], "mmi",
                          [helper.make_tensor_value_info("x", x_type, [m, w.shape[0]])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@settings(max_examples=12, deadline=None)
@given(k=st.integers(2, 96), n=st.integers(1, 9), seed=st.integers(0, 2**16),
       extreme=st.booleans(), zp=st.booleans(), optimize=st.booleans())
def test_uint8_by_int8_matmul_is_exact(k, n, seed, extreme, zp, optimize):
    """u8 x s8 products, worst case included (all 255 x 127: every pair sum past int16)."""
    rng = np.random.default_rng(seed)
    if extreme:
        x = np.full((3, k), 255, np.uint8)
        w = np.full((k, n), 127, np.int8)
    else:
        x = rng.integers(0, 256, (3, k)).astype(np.uint8)
        w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    w_zp = rng.integers(-128, 128, n).astype(np.int8) if zp else None
    model = _matmul_integer(TensorProto.UINT8, w, w_zp, 3)
    want = x.astype(np.int64) @ (w.astype(np.int64) - (0 if w_zp is None else w_zp.astype(np.int64)))
    got = session(model, optimize=optimize).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_weights_move_to_uint8_only_where_the_activation_is_uint8():
    w = np.full((8, 4), -128, np.int8)
    u8 = _matmul_integer(TensorProto.UINT8, w, None, 2)
    moved = uint8_weights(u8)
    assert moved is not u8 and u8.graph.node[0].input[1] == "w", "the caller's model is kept"
    arrays = {t.name: numpy_helper.to_array(t) for t in moved.graph.initializer}
    node = moved.graph.node[0]
    np.testing.assert_array_equal(arrays[node.input[1]], np.zeros((8, 4), np.uint8))
    assert arrays[node.input[3]].dtype == np.uint8 and int(arrays[node.input[3]]) == 128
    s8 = _matmul_integer(TensorProto.INT8, w, None, 2)
    assert uint8_weights(s8) is s8, "int8 x int8 is exact already and stays as it is"


@pytest.mark.parametrize("optimize", [False, True])
def test_qlinearconv_worst_case_within_one_step(optimize):
    """QLinearConv u8 x s8 at 255 x 127 over 72 taps: exact accumulation, float requantize."""
    cin, cout = 8, 2
    x = np.full((1, cin, 5, 5), 255, np.uint8)
    w = np.full((cout, cin, 3, 3), 127, np.int8)
    acc = 255 * 127 * cin * 9
    xs, ws = 0.01, 0.002
    ys = xs * ws * acc / 200  # the centre lands on code 200; a saturated sum on ~100
    f32 = lambda v: numpy_helper.from_array(np.array(v, np.float32))  # noqa: E731
    inits = [numpy_helper.from_array(w, "w"), f32(xs), f32(ws), f32(ys),
             numpy_helper.from_array(np.array(0, np.uint8), "xz"),
             numpy_helper.from_array(np.array(0, np.int8), "wz"),
             numpy_helper.from_array(np.array(0, np.uint8), "yz")]
    for t, name in zip(inits[1:4], ("xs", "ws", "ys"), strict=True):
        t.name = name
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"],
                            pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "qconv", [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    y = session(model, optimize=optimize).run(None, {"x": x})[0]
    assert abs(int(y[0, 0, 2, 2]) - 200) <= 1
