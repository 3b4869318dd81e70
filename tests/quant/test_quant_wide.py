"""``wide_tensors``: activations the quantizer puts on symmetric int16 grids (a decoder's
residual stream), the rest int8; the model goes to opset 21 for the int16 Q/DQ, the
widened tensors stay quantized where only FP32 ops read them, and onnxruntime runs the
result with a far smaller rounding on the widened tensor."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

ort = pytest.importorskip("onnxruntime")

from dsa_tvm.quant.api import quantize_onnx  # noqa: E402
from dsa_tvm.quant.qparams import activation_qparams  # noqa: E402

from .test_quant_norms import _feeds, _net  # noqa: E402


def _zero_points(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.input[0].removesuffix("/fp32"): inits[n.input[2]] for n in model.graph.node
            if n.op_type == "QuantizeLinear"}


def _run(model: onnx.ModelProto, feed: dict, outputs: list[str]) -> list[np.ndarray]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    known = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                          for t in outputs if t not in known)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so).run(outputs, feed)


def test_wide_tensors_are_int16_and_the_rest_int8():
    q = quantize_onnx(_net(), _feeds(), show_progress=False, quantize_norms=True,
                      wide_tensors={"r", "h0"})
    zps = _zero_points(q.model)
    assert zps["r"].dtype == zps["h0"].dtype == np.int16
    assert int(zps["r"]) == 0                     # symmetric: the DSA's int16 grids
    assert {zps[t].dtype for t in zps if t not in ("r", "h0")} == {np.dtype(np.int8)}
    assert q.model.opset_import[0].version >= 21
    onnx.checker.check_model(q.model)
    # the widened tensor's own rounding is 256 times finer than an int8 grid's, and the
    # model still runs close to FP32
    feed = _feeds(1, seed=3)[0]
    r_pre, r_dq, y = _run(q.model, feed, ["r/fp32", "r", "y"])
    (y_fp32,) = _run(q.fp32, feed, ["y"])
    lo, hi = q.ranges["r"]
    int8_step = activation_qparams(lo, hi, symmetric=True).scale
    assert 0 < np.abs(r_dq - r_pre).max() <= int8_step / 250
    plain = quantize_onnx(_net(), _feeds(), show_progress=False, quantize_norms=True)
    (y_int8,) = _run(plain.model, feed, ["y"])
    assert np.abs(y - y_fp32).max() <= np.abs(y_int8 - y_fp32).max() * 1.1


def test_a_wide_tensor_read_only_by_fp32_ops_stays_quantized():
    """The residual add feeding a LayerNorm is pruned in int8 (FP32 readers only); named
    wide, it keeps its (int16) quantization, which the DSA's add and norm rooms read."""
    plain = quantize_onnx(_net(), _feeds(), show_progress=False)
    assert "r" not in _zero_points(plain.model)
    wide = quantize_onnx(_net(), _feeds(), show_progress=False, wide_tensors={"r"})
    assert _zero_points(wide.model)["r"].dtype == np.int16


@pytest.mark.parametrize("names", [{"no_such_tensor"}, "no_such_tensor"])
def test_unknown_wide_tensor_is_named(names):
    with pytest.raises(ValueError, match=r"\['no_such_tensor'\]"):
        quantize_onnx(_net(), _feeds(), show_progress=False, wide_tensors=names)


def test_activation_bits_other_than_8_or_16_are_refused():
    with pytest.raises(ValueError, match="int8 or int16"):
        activation_qparams(-1.0, 1.0, bits=12)
    qp = activation_qparams(-3.0, 2.0, bits=16)
    assert qp.zero_point == 0 and qp.scale == pytest.approx(3.0 / 32767, rel=1e-6)
    codes = qp.quantize(np.array([-1e9, 0.0, 1e9]))
    assert codes.dtype == np.int16 and codes.tolist() == [-32768, 0, 32767]


def test_a_model_the_converter_cannot_upgrade_gets_the_fix(monkeypatch):
    from onnx import version_converter

    def fail(*_a, **_k):
        raise RuntimeError("No Adapter For Pretend op")

    monkeypatch.setattr(version_converter, "convert_version", fail)
    with pytest.raises(ValueError, match="export it at opset 21, or quantize without"):
        quantize_onnx(_net(), _feeds(), show_progress=False, wide_tensors={"r"})


def test_wide_norms_widens_each_norms_stream_and_needs_quantize_norms():
    """``wide_norms``: each norm's input and output, and the residual Add's inputs before
    it, int16 (``_net``: the LayerNorm reads ``r = h0 + x``; the RMSNorm reads ``h1``)."""
    q = quantize_onnx(_net(), _feeds(), show_progress=False, quantize_norms=True,
                      wide_norms=True)
    zps = _zero_points(q.model)
    wide = {t for t, z in zps.items() if z.dtype == np.int16}
    assert wide == {"x", "h0", "r", "ln", "h1", "rms"}, wide   # x: the Add's other input
    assert zps["h2"].dtype == zps["y"].dtype == np.int8    # the softmax's stay int8
    with pytest.raises(ValueError, match="pass quantize_norms=True"):
        quantize_onnx(_net(), _feeds(), show_progress=False, wide_norms=True)
