"""QOperator int8 models (what onnxruntime's quantize_static(QOperator) and quantize_dynamic
write) rewritten into QDQ by ``dsa_tvm.frontend.qoperator.to_qdq``.

The reference is onnxruntime running the *QOperator* model with graph optimizations off.
A ResNet-18 quantized by ORT (QOperator, per-channel, uint8 activations) must import,
run 100% of its MACs on the DSA and stay within one output step of ORT; every op of the
rewrite table is checked on a one-op model against ORT (hypothesis over seeds that draw
scales, zero points and weights, over shapes and activation types), and the integer ops
(ConvInteger, MatMulInteger, DynamicQuantizeLinear) bit-exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dsa_tvm
from dsa_tvm.frontend.qoperator import QOperatorError, has_qoperator, to_qdq
from dsa_tvm.frontend.qoperator_graph import shift_uint8
from dsa_tvm.models import calibration_data, run_onnxruntime, small_cnn

from .qop_harness import (
    OFFLOADED,
    SLOW_HOST_GMACS,
    compile_for,
    mac_share,
    ort_quantize,
    run,
    steps,
)
from .qop_models import OPS, one_op

# ----------------------------------------------------------------------------- dynamic


def test_quantize_dynamic_model_matches_onnxruntime():
    """ConvInteger (float64 on the CPU), DynamicQuantizeLinear and MatMulInteger (TVM's own)."""
    fp32 = small_cnn(input_size=16, width=8, num_classes=10)
    dyn = ort_quantize(fp32, None, "u8", dynamic=True)
    ops = {n.op_type for n in dyn.graph.node}
    assert {"ConvInteger", "DynamicQuantizeLinear", "MatMulInteger"} <= ops
    qdq, notes = to_qdq(dyn)
    assert any("ConvInteger x" in n for n in notes)
    ex, _ = compile_for(qdq, "llvm")
    for f in calibration_data(fp32, n=2, seed=3):
        ref = run_onnxruntime(dyn, f, optimize=False)[0]
        np.testing.assert_allclose(run(ex, f), ref, rtol=1e-6, atol=1e-6 * np.ptp(ref))


def _integer_model(op: str, x: np.ndarray, w: np.ndarray, xz: np.ndarray, wz: np.ndarray,
                   **attrs) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(xz, "xz"),
             numpy_helper.from_array(wz, "wz")]
    g = helper.make_graph([helper.make_node(op, ["x", "w", "xz", "wz"], ["y"], **attrs)], op,
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), cin=st.integers(1, 6), hw=st.integers(3, 7),
       per_channel=st.booleans(), op=st.sampled_from(["ConvInteger", "MatMulInteger"]))
def test_integer_ops_bit_exact(seed, cin, hw, per_channel, op):
    """ConvInteger / MatMulInteger against exact int64 arithmetic and onnxruntime."""
    rng = np.random.default_rng(seed)
    cout = 4
    xz = np.array(rng.integers(0, 256), np.uint8)
    if op == "ConvInteger":
        x = rng.integers(0, 256, (1, cin, hw, hw)).astype(np.uint8)
        w = rng.integers(0, 256, (cout, cin, 3, 3)).astype(np.uint8)
        wz = (rng.integers(0, 256, cout) if per_channel else np.array(rng.integers(0, 256))).astype(np.uint8)
        m = _integer_model(op, x, w, xz, wz, pads=[1, 1, 1, 1])
        xc = np.pad(x.astype(np.int64) - int(xz), ((0, 0), (0, 0), (1, 1), (1, 1)))
        wc = w.astype(np.int64) - wz.astype(np.int64).reshape(-1, 1, 1, 1)
        cols = np.lib.stride_tricks.sliding_window_view(xc, (3, 3), axis=(2, 3))  # 1,C,H,W,3,3
        want = np.einsum("bchwij,ocij->bohw", cols, wc)
    else:
        x = rng.integers(0, 256, (hw, cin * 4)).astype(np.uint8)
        w = rng.integers(0, 256, (cin * 4, cout)).astype(np.uint8)
        wz = (rng.integers(0, 256, cout) if per_channel else np.array(rng.integers(0, 256))).astype(np.uint8)
        m = _integer_model(op, x, w, xz, wz)
        want = (x.astype(np.int64) - int(xz)) @ (w.astype(np.int64) - wz.astype(np.int64))
    if not (op == "ConvInteger" and per_channel):  # ORT's ConvInteger takes one weight zero point
        np.testing.assert_array_equal(run_onnxruntime(m, {"x": x}, optimize=False)[0], want)
    qdq, _ = to_qdq(m)
    ex, _ = compile_for(qdq, "llvm")
    np.testing.assert_array_equal(run(ex, {"x": x}), want)


# ----------------------------------------------------------------------------- one-op models


def _shape(op: str, seed: int) -> tuple[int, ...]:
    rng = np.random.default_rng(seed)
    if op in ("QLinearMatMul", "QGemm"):
        return (int(rng.integers(1, 5)), int(rng.integers(3, 33)))
    if op == "QLinearSoftmax":
        return (int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(2, 40)))
    c = int(rng.integers(1, 4)) * 4 if op != "QLinearConcat" else int(rng.integers(1, 9))
    hw = int(rng.integers(3, 9))
    return (1, c, hw, hw)


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(OPS), dtype=st.sampled_from(["u8", "s8"]), seed=st.integers(0, 2**16),
       per_channel=st.booleans(), alpha=st.sampled_from([1.0, 0.5, 2.0]))
def test_rewrite_matches_onnxruntime(op, dtype, seed, per_channel, alpha):
    """The rewritten graph on ORT against the QOperator node on ORT (both optimizations off);
    ``alpha`` is QGemm's."""
    o = one_op(op, dtype, seed, shape=_shape(op, seed), per_channel=per_channel, alpha=alpha)
    ref = run_onnxruntime(o.model, o.feed, optimize=False)[0]
    qdq, notes = to_qdq(o.model)
    assert not has_qoperator(qdq) and any(op in n for n in notes)
    got = run_onnxruntime(qdq, o.feed, optimize=False)[0]
    worst, _ = steps(got, ref, o.step)
    assert worst <= 1.0 + 1e-3, f"{op}/{dtype}: {worst:.2f} steps"


@pytest.mark.parametrize("dtype", ["u8", "s8"])
@pytest.mark.parametrize("op", OPS)
def test_one_op_compiled_for_the_dsa(op, dtype):
    """Each op through TVM for the DSA: within one step of ORT; offloaded where the DSA has it."""
    o = one_op(op, dtype, 1, shape=_shape(op, 1))
    ref = run_onnxruntime(o.model, o.feed, optimize=False)[0]
    assert np.ptp(ref) >= 4 * o.step, "a near-constant output proves nothing"
    qdq, _ = to_qdq(o.model)
    ex, report = compile_for(qdq)
    worst, frac = steps(run(ex, o.feed), ref, o.step)
    print(f"{op}/{dtype}: max {worst:.2f} steps, {frac:.4f} differ")
    assert worst <= 1.0 + 1e-3
    dsa = [d for d in report.regions if d.target == "dsa"]
    assert bool(dsa) == (op in OFFLOADED), str(report)


def test_softmax_follows_onnxruntime_not_float_softmax():
    """ORT's QLinearSoftmax scales by floor(1 / y_scale): with y_scale = 1/255.5 the float
    Q(softmax(DQ(x))) differs from it, the rewrite does not."""
    o = one_op("QLinearSoftmax", "u8", 3, shape=(2, 3, 16))
    for t in o.model.graph.initializer:  # the output scale the softmax node writes into
        if t.name == o.model.graph.node[1].input[3]:
            t.CopyFrom(numpy_helper.from_array(np.array(1 / 255.5, np.float32), t.name))
    ref = run_onnxruntime(o.model, o.feed, optimize=False)[0]
    qdq, _ = to_qdq(o.model)
    np.testing.assert_array_equal(run_onnxruntime(qdq, o.feed, optimize=False)[0], ref)
    xq = run_onnxruntime(_prefix(o.model, 1), o.feed, optimize=False)[0]  # quantized input codes
    x_s, x_z = (numpy_helper.to_array(i) for i in o.model.graph.initializer[:2])
    xf = (xq.astype(np.float64) - x_z) * x_s
    p = np.exp(xf - xf.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    naive = np.clip(np.round(p * np.float32(255.5)), 0, 255) * (o.step)
    assert np.abs(naive - ref).max() > 0.5 * o.step


def _prefix(model: onnx.ModelProto, n: int) -> onnx.ModelProto:
    """The model cut after its first ``n`` nodes, that node's output the graph output."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.node[n:]
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info(m.graph.node[n - 1].output[0],
                                                        TensorProto.UINT8, None))
    return m


# ----------------------------------------------------------------------------- uint8 shift


def test_uint8_shift_is_exact_and_keeps_uint8_outputs():
    """Q output, constant and graph input move to int8 for their DQ readers; a uint8 graph
    output is quantized to int8 and shifted back to uint8 for the output."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(200, np.uint8), "z"),
             numpy_helper.from_array(np.array(90, np.uint8), "z2"),
             numpy_helper.from_array(rng.integers(0, 256, (4,)).astype(np.uint8), "w")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "s", "z2"], ["wd"]),
             helper.make_node("DequantizeLinear", ["u", "s"], ["ud"]),  # no zero point: 0
             helper.make_node("Add", ["xd", "wd"], ["a"]),
             helper.make_node("Add", ["a", "ud"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["yd"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                                       helper.make_tensor_value_info("u", TensorProto.UINT8, [4])],
                          [helper.make_tensor_value_info("yq", TensorProto.UINT8, [4]),
                           helper.make_tensor_value_info("yd", TensorProto.FLOAT, [4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feed = {"x": rng.uniform(-12, 4, 4).astype(np.float32),
            "u": rng.integers(0, 256, 4).astype(np.uint8)}
    ref = run_onnxruntime(m, feed, optimize=False)
    shifted = onnx.ModelProto()
    shifted.CopyFrom(m)
    counts = shift_uint8(shifted)
    assert counts == {"activation": 2, "constant": 1, "graph input": 1}
    types = {i.name: i.data_type for i in shifted.graph.initializer}
    dqs = [n for n in shifted.graph.node if n.op_type == "DequantizeLinear"]
    assert all(types[n.input[2]] == TensorProto.INT8 for n in dqs)
    got = run_onnxruntime(shifted, feed, optimize=False)
    assert got[0].dtype == np.uint8
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- bad input


def test_missing_scale_is_a_clear_error():
    o = one_op("QLinearConv", "u8", 0)
    conv = next(n for n in o.model.graph.node if n.op_type == "QLinearConv")
    conv.input[1] = ""
    with pytest.raises(QOperatorError, match=r"QLinearConv node 'QLinearConv_\d+': input 1 \(x_scale\) "
                                             r"is missing: a quantized tensor needs its scale"):
        to_qdq(o.model)


def test_undefined_scale_is_a_clear_error():
    o = one_op("QLinearMatMul", "s8", 0, shape=(2, 8))
    mm = next(n for n in o.model.graph.node if n.op_type == "QLinearMatMul")
    mm.input[6] = "nowhere"
    with pytest.raises(QOperatorError, match=r"input 6 \(y_scale\) refers to 'nowhere', which no node"):
        to_qdq(o.model)


def test_quantized_op_without_rewrite_is_named():
    o = one_op("QLinearAdd", "u8", 0)
    add = next(n for n in o.model.graph.node if n.op_type == "QLinearAdd")
    add.op_type = "QLinearWhere"
    assert has_qoperator(o.model)
    with pytest.raises(QOperatorError, match="no QDQ rewrite for com.microsoft.QLinearWhere"):
        to_qdq(o.model)


def test_uint8_graph_input_and_output_offload():
    """Converted TFLite models take and return uint8 codes: the conv still runs on the DSA,
    bit-exact against ORT, and the graph output stays uint8."""
    o = one_op("QLinearConv", "u8", 2)
    m = o.model
    q_in, dq_out = m.graph.node[0], m.graph.node[-1]
    conv = m.graph.node[1]
    conv.input[0] = "x"
    conv.output[0] = "yq"
    del m.graph.node[-1]
    del m.graph.node[0]
    del m.graph.input[:]
    del m.graph.output[:]
    m.graph.input.append(helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 6, 6]))
    m.graph.output.append(helper.make_tensor_value_info("yq", TensorProto.UINT8, None))
    assert q_in.op_type == "QuantizeLinear" and dq_out.op_type == "DequantizeLinear"
    x = np.random.default_rng(1).integers(0, 256, (1, 8, 6, 6)).astype(np.uint8)
    ref = run_onnxruntime(m, {"x": x}, optimize=False)[0]
    qdq, notes = to_qdq(m)
    assert any("1 graph input" in n for n in notes), notes
    ex, report = compile_for(qdq)
    got = run(ex, {"x": x})
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref)
    assert mac_share(report) == 1.0, str(report)


def test_requantize_ties_are_the_one_step():
    """Where the one step comes from: x_scale * w_scale / y_scale = 1/2 puts every odd
    accumulator on a tie. ORT rounds half to even, the DSA's REQUANT half up: the DSA
    output is exactly the half-up rounding, ORT's the half-even one, one step apart on the
    ties with an even floor and equal everywhere else."""
    rng = np.random.default_rng(4)
    w = rng.integers(-2, 3, (6, 4, 3, 3)).astype(np.int8)
    c = {"xs": np.array(0.5, np.float32), "xz": np.array(0, np.int8), "w": w,
         "ws": np.array(1.0, np.float32), "wz": np.array(0, np.int8),
         "ys": np.array(1.0, np.float32), "yz": np.array(0, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"],
                              pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])
    g = helper.make_graph(nodes, "ties", [x_info],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in c.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    xq = rng.integers(-4, 5, (1, 4, 5, 5))
    feed = {"x": (xq * 0.5).astype(np.float32)}
    cols = np.lib.stride_tricks.sliding_window_view(np.pad(xq, ((0, 0), (0, 0), (1, 1), (1, 1))),
                                                    (3, 3), axis=(2, 3))
    acc = np.einsum("bchwij,ocij->bohw", cols, w.astype(np.int64))
    half_even = np.clip(np.round(acc / 2), -128, 127)
    half_up = np.clip(np.floor(acc / 2 + 0.5), -128, 127)
    assert (half_even != half_up).any()
    ort = run_onnxruntime(m, feed, optimize=False)[0]
    np.testing.assert_array_equal(ort, half_even)
    qdq, _ = to_qdq(m)
    ex, report = compile_for(qdq)
    assert mac_share(report) == 1.0, str(report)
    got = run(ex, feed)
    np.testing.assert_array_equal(got, half_up)
    print(f"ties: {int((acc % 2 != 0).sum())} of {acc.size} outputs, "
          f"{int((got != ort).sum())} one step apart")


def test_old_opset_is_converted():
    """Opset 10-12 models (QLinearConv exists since 10) are converted to 13 first:
    per-channel DequantizeLinear needs it."""
    o = one_op("QLinearConv", "u8", 5)
    for oi in o.model.opset_import:
        if oi.domain == "":
            oi.version = 11
    ref = run_onnxruntime(o.model, o.feed, optimize=False)[0]
    qdq, notes = to_qdq(o.model)
    assert "converted opset 11 -> 13" in notes[0]
    assert steps(run_onnxruntime(qdq, o.feed, optimize=False)[0], ref, o.step)[0] <= 1.0 + 1e-3


def _data_movement_model(op: str, dtype: str) -> tuple[onnx.ModelProto, dict]:
    """x -> Q -> ``op`` on the codes -> DQ: what ORT's QOperator quantizer leaves between QLinear ops."""
    np_dt = np.uint8 if dtype == "u8" else np.int8
    zp = 150 if dtype == "u8" else 20
    inits = {"s": np.array(0.04, np.float32), "z": np.array(zp, np_dt)}
    ins, attrs = ["xq"], {}
    if op == "MaxPool":
        attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    elif op.startswith("Pad"):
        inits["pads"] = np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)
        ins += ["pads"]
        if op == "Pad":
            inits["c"] = np.array(zp - 7, np_dt)       # a pad code that is not the zero point
            ins += ["c"]
        attrs = {"mode": "reflect"} if op == "PadReflect" else {}
        op = "Pad"
    elif op == "Resize":
        inits["scales"] = np.array([1, 1, 2, 2], np.float32)
        ins += ["", "scales"]
        attrs = {"mode": "nearest"}
    elif op == "Transpose":
        attrs = {"perm": [0, 2, 3, 1]}
    elif op == "Reshape":
        inits["shape"] = np.array([1, -1], np.int64)
        ins += ["shape"]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node(op, ins, ["yq"], **attrs),
             helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["y"])]
    g = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, {"x": np.random.default_rng(2).normal(0, 3, (1, 4, 5, 6)).astype(np.float32)}


@pytest.mark.parametrize("dtype", ["u8", "s8"])
@pytest.mark.parametrize("op", ["MaxPool", "Pad", "PadZero", "PadReflect", "Resize", "Transpose",
                                "Reshape"])
def test_data_movement_on_codes_is_exact(op, dtype):
    m, feed = _data_movement_model(op, dtype)
    ref = run_onnxruntime(m, feed, optimize=False)[0]
    qdq, notes = to_qdq(m)
    assert any("data movement" in n for n in notes), notes
    np.testing.assert_array_equal(run_onnxruntime(qdq, feed, optimize=False)[0], ref)
    ex, _ = compile_for(qdq, "llvm")
    np.testing.assert_array_equal(run(ex, feed), ref)


def test_ms_qlinearconv_channels_last():
    """com.microsoft QLinearConv in NHWC (what ORT's NHWC transformer writes; OIHW weights)."""
    rng = np.random.default_rng(0)
    c = {"xs": np.array(0.05, np.float32), "xz": np.array(120, np.uint8),
         "w": rng.integers(-127, 128, (6, 4, 3, 3)).astype(np.int8),
         "ws": rng.uniform(0.002, 0.01, 6).astype(np.float32), "wz": np.zeros(6, np.int8),
         "ys": np.array(0.3, np.float32), "yz": np.array(100, np.uint8),
         "b": rng.integers(-500, 500, 6).astype(np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"],
                              domain="com.microsoft", pads=[1, 1, 1, 1], channels_last=1),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 5, 4])
    g = helper.make_graph(nodes, "nhwc", [x_info],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in c.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    feed = {"x": rng.normal(0, 2, (1, 5, 5, 4)).astype(np.float32)}
    ref = run_onnxruntime(m, feed, optimize=False)[0]
    assert np.ptp(ref) > 10 * 0.3
    qdq, _ = to_qdq(m)
    ex, report = compile_for(qdq)
    assert mac_share(report) == 1.0, str(report)
    assert steps(run(ex, feed), ref, 0.3)[0] <= 1.0 + 1e-3


@pytest.mark.parametrize("op", ["QLinearGlobalAveragePool", "QLinearAveragePool"])
def test_ms_pools_channels_last(op):
    o = one_op(op, "u8", 3, shape=(1, 6, 7, 8), channels_last=1)
    ref = run_onnxruntime(o.model, o.feed, optimize=False)[0]
    qdq, _ = to_qdq(o.model)
    ex, report = compile_for(qdq)
    assert [d for d in report.regions if d.target == "dsa"], str(report)
    assert steps(run(ex, o.feed), ref, o.step)[0] <= 1.0 + 1e-3


def test_ms_quantize_dequantize_become_standard():
    """com.microsoft Quantize/DequantizeLinear (ORT's UseQDQContribOps) on 8-bit tensors."""
    o = one_op("QLinearAdd", "u8", 1)
    for n in o.model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            n.domain = "com.microsoft"
    assert has_qoperator(o.model)
    ref = run_onnxruntime(o.model, o.feed, optimize=False)[0]
    qdq, _ = to_qdq(o.model)
    assert all(n.domain == "" for n in qdq.graph.node)
    assert all(op.domain != "com.microsoft" for op in qdq.opset_import)
    ex, report = compile_for(qdq)
    assert [d for d in report.regions if d.target == "dsa"], str(report)  # the add offloads
    np.testing.assert_array_equal(run(ex, o.feed), ref)


def test_qdq_model_passes_through(tmp_path):
    from ..qdq_models import chain_net

    m = onnx.load(chain_net(tmp_path))
    assert not has_qoperator(m)
    qdq, notes = to_qdq(m)
    assert notes == []
    assert [(n.op_type, list(n.input)) for n in qdq.graph.node] == \
        [(n.op_type, list(n.input)) for n in m.graph.node]


def test_quantize_passes_a_qoperator_model_through_as_qdq():
    """dsa_tvm.quant.quantize_onnx takes an int8 model as already quantized; a QOperator one
    used to pass through as is, and to_relax() then failed in TVM's importer
    (OpNotImplemented: QLinearConv). Now it is rewritten to QDQ on the way."""
    from dsa_tvm.quant import quantize_onnx

    o = one_op("QLinearConv", "u8", 6)
    qm = quantize_onnx(o.model, None, verbose=False)
    assert qm.passthrough and not has_qoperator(qm.model)
    ex = tvm.compile(qm.to_relax(), target=dsa_tvm.target(
        dsa_tvm.load_config("default").replace(cpu_gmacs=SLOW_HOST_GMACS)))
    assert mac_share(dsa_tvm.last_compile_report()) == 1.0
    ref = run_onnxruntime(o.model, o.feed, optimize=False)[0]
    assert steps(run(ex, o.feed), ref, o.step)[0] <= 1.0 + 1e-3


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("op", ["DynamicQuantizeMatMul", "MatMulIntegerToFloat"])
def test_ort_fused_integer_matmuls(op, per_column):
    """What ORT's optimizer saves for quantize_dynamic models: MatMulInteger fused with its
    float scaling (and the dynamic quantization of A). Matches ORT to float rounding."""
    rng = np.random.default_rng(7)
    k, n = 24, 10
    shape = (n,) if per_column else ()
    c = {"B": rng.integers(-127, 128, (k, n)).astype(np.int8),
         "b_scale": rng.uniform(0.005, 0.02, shape).astype(np.float32),
         "b_zp": np.zeros(shape, np.int8), "bias": rng.normal(0, 1, n).astype(np.float32)}
    if op == "DynamicQuantizeMatMul":
        x = rng.normal(0, 2, (3, k)).astype(np.float32)
        ins, x_type = ["x", "B", "b_scale", "b_zp", "bias"], TensorProto.FLOAT
    else:
        x = rng.integers(0, 256, (3, k)).astype(np.uint8)
        c.update(a_scale=np.array(0.03, np.float32), a_zp=np.array(117, np.uint8))
        ins, x_type = ["x", "B", "a_scale", "b_scale", "a_zp", "b_zp", "bias"], TensorProto.UINT8
    g = helper.make_graph([helper.make_node(op, ins, ["y"], domain="com.microsoft")], op,
                          [helper.make_tensor_value_info("x", x_type, [3, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, name) for name, v in c.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    ref = run_onnxruntime(m, {"x": x}, optimize=False)[0]
    qdq, notes = to_qdq(m)
    assert any(op in n for n in notes)
    ex, _ = compile_for(qdq, "llvm")
    np.testing.assert_allclose(run(ex, {"x": x}), ref, rtol=1e-6, atol=1e-6 * np.ptp(ref))
