"""quantize_norms: Softmax, LayerNormalization and the exported RMSNorm chain get int8 in
and out (so the front end's norm kinds match them); off by default (FP32 on the CPU)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

tvm = pytest.importorskip("tvm")
ort = pytest.importorskip("onnxruntime")

from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

from dsa_tvm.hw.config import load_config  # noqa: E402
from dsa_tvm.quant.api import quantize_onnx  # noqa: E402
from relay_passes.partition import partition_for_dsa  # noqa: E402

from .. import qdq_models as qm  # noqa: E402

D = 24


def _net() -> onnx.ModelProto:
    """dense -> residual add -> LayerNorm -> dense -> RMSNorm(Pow, ReduceMean, Add, Sqrt, Div, Mul) -> dense
    -> Softmax."""
    rng = np.random.default_rng(0)
    w = {f"w{i}": (rng.normal(0, 1, (D, D)) / np.sqrt(D)).astype(np.float32) for i in range(3)}
    inits = {**w, "g": rng.uniform(0.5, 1.5, D).astype(np.float32),
             "b": rng.normal(0, 0.1, D).astype(np.float32), "two": np.float32(2.0),
             "eps": np.float32(1e-6), "axes": np.array([-1], np.int64)}
    n = qm.node
    nodes = [n("MatMul", ["x", "w0"], ["h0"], name="mm0"),
             n("Add", ["h0", "x"], ["r"], name="residual"),
             n("LayerNormalization", ["r", "g", "b"], ["ln"], name="ln", axis=-1, epsilon=1e-5),
             n("MatMul", ["ln", "w1"], ["h1"], name="mm1"),
             n("Pow", ["h1", "two"], ["p"], name="rms.pow"),
             n("ReduceMean", ["p", "axes"], ["ms"], name="rms.mean", keepdims=1),
             n("Add", ["ms", "eps"], ["me"], name="rms.add"),
             n("Sqrt", ["me"], ["rt"], name="rms.sqrt"),
             n("Div", ["h1", "rt"], ["nd"], name="rms.div"),
             n("Mul", ["nd", "g"], ["rms"], name="rms.mul"),
             n("MatMul", ["rms", "w2"], ["h2"], name="mm2"),
             n("Softmax", ["h2"], ["y"], name="softmax", axis=-1)]
    m = qm.make_model(nodes, inits, {"x": (2, 5, D)}, {"y": (2, 5, D)})
    m.opset_import[0].version = 18  # ReduceMean takes axes as an input
    return m


def _feeds(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (2, 5, D)).astype(np.float32)} for _ in range(n)]


def _consumers_of_dq(model: onnx.ModelProto) -> set[str]:
    dq = {o for nd in model.graph.node if nd.op_type == "DequantizeLinear" for o in nd.output}
    return {nd.name for nd in model.graph.node if any(i in dq for i in nd.input)}


def _quantized_outputs(model: onnx.ModelProto) -> set[str]:
    """Tensors with a QuantizeLinear (the quantizer renames the float tensor '<t>/fp32')."""
    return {nd.input[0].removesuffix("/fp32") for nd in model.graph.node
            if nd.op_type == "QuantizeLinear"}


def test_norms_stay_fp32_by_default():
    q = quantize_onnx(_net(), _feeds(), show_progress=False)
    outs = _quantized_outputs(q.model)
    # the residual add feeding the LayerNorm and the softmax output stay FP32 (the RMSNorm
    # input and the LayerNorm output are int8 anyway: the dense layers quantize them)
    assert "r" not in outs and "y" not in outs


def test_quantize_norms_puts_int8_around_each_row_op():
    net = _net()
    q = quantize_onnx(net, _feeds(), show_progress=False, quantize_norms=True)
    readers, outs = _consumers_of_dq(q.model), _quantized_outputs(q.model)
    assert {"softmax", "ln", "rms.pow", "rms.div"} <= readers
    assert {"r", "y", "ln", "rms"} <= outs
    assert not {"p", "ms", "me", "rt", "nd"} & outs  # the chain's interior stays float
    assert "rms.sqrt" not in q.summary()  # interior nodes are not listed as FP32 leftovers
    # accuracy: int8 row ops cost little against the same model with them in FP32
    x = _feeds(1, seed=9)[0]
    f = ort.InferenceSession(net.SerializeToString()).run(None, x)[0]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    cos = {}
    for on in (False, True):
        qq = quantize_onnx(net, _feeds(16), show_progress=False, quantize_norms=on)
        g = ort.InferenceSession(qq.model.SerializeToString(), so).run(None, x)[0]
        cos[on] = float((f * g).sum() / np.linalg.norm(f) / np.linalg.norm(g))
    assert cos[True] > 0.99 and cos[True] >= cos[False] - 0.002, cos
    # and the front end sees the three row ops: on the CPU for the unit's reason without
    # [norm] units, none of them left there with them
    mod = from_onnx(q.model, keep_params_in_input=False)
    _, report = partition_for_dsa(mod, load_config("default").replace(norm_units=0))
    reasons = "\n".join(c.reason for c in report.cpu_ops)
    for kind in ("softmax", "layer_norm", "rms_norm"):
        assert f"dsa.{kind}" in reasons and "no [norm] units" in reasons, reasons
    _, report = partition_for_dsa(mod, load_config("default").replace(norm_units=1))
    reasons = "\n".join(c.reason for c in report.cpu_ops)
    assert not any(f"dsa.{k}" in reasons for k in ("softmax", "layer_norm", "rms_norm")), reasons


def test_rsqrt_form_of_rmsnorm_is_one_chain():
    """Llama's ``x * torch.rsqrt(mean(x**2) + eps) * w`` exports as Mul(x, Div(1, Sqrt)):
    int8 in and out, its interior float, like the Div form."""
    net = _net()
    nodes = list(net.graph.node)
    k = next(i for i, nd in enumerate(nodes) if nd.name == "rms.div")
    nodes[k:k + 1] = [qm.node("Div", ["one", "rt"], ["inv"], name="rms.inv"),
                      qm.node("Mul", ["h1", "inv"], ["nd"], name="rms.scale")]
    del net.graph.node[:]
    net.graph.node.extend(nodes)
    net.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    q = quantize_onnx(net, _feeds(), show_progress=False, quantize_norms=True)
    readers, outs = _consumers_of_dq(q.model), _quantized_outputs(q.model)
    assert {"rms.pow", "rms.scale"} <= readers and "rms" in outs
    assert not {"p", "ms", "me", "rt", "inv", "nd"} & outs


def test_softmax_output_is_quantized_to_steps_of_one_256th():
    """Whatever the calibration saw (rows far from one-hot here), probabilities get the
    fixed grid 1/256 with zero point -128: 0 .. 255/256."""
    q = quantize_onnx(_net(), _feeds(), show_progress=False, quantize_norms=True)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in q.model.graph.initializer}
    (node,) = [nd for nd in q.model.graph.node if nd.op_type == "QuantizeLinear"
               and nd.input[0].removesuffix("/fp32") == "y"]
    assert float(inits[node.input[1]]) == 1 / 256 and int(inits[node.input[2]]) == -128
