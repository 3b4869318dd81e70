"""The quantizer on small FP32 graphs: batch-norm folding, QDQ placement, shared scales,
weights/biases against a numpy recomputation, FP32 fallbacks, pass-through of QDQ models,
data sources, the outlier split, the accuracy report and the CLI; and one network
quantized by us, compiled for the DSA, bit-exact against the integer reference."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.models import calibration_data, get_model, run_onnxruntime
from dsa_tvm.quant import prepare, quantize_onnx
from dsa_tvm.quant.accuracy import accuracy_report, mixed_precision, sensitivity
from dsa_tvm.quant.data import as_feeds
from dsa_tvm.quant.metrics import cosine
from dsa_tvm.quant.qparams import activation_qparams
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

from ..qdq_models import make_model, node, quantize, rand


def _inits(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def _feeds(shape, n=6, seed=0, name="x"):
    rng = np.random.default_rng(seed)
    return [{name: rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)]


def conv_bn_net(seed=0) -> onnx.ModelProto:
    """conv -> BN -> relu -> maxpool -> conv -> add(residual from maxpool) -> GAP -> flatten -> gemm."""
    rng = np.random.default_rng(seed)
    c = 8
    inits = {"W1": rand(rng, c, 3, 3, 3), "B1": rand(rng, c),
             "g": rng.uniform(0.5, 2, c).astype(np.float32), "b": rand(rng, c),
             "m": rand(rng, c, scale=0.3), "v": rng.uniform(0.5, 2, c).astype(np.float32),
             "W2": rand(rng, c, c, 3, 3, scale=0.2), "Wf": rand(rng, 10, c), "Bf": rand(rng, 10)}
    nodes = [node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1] * 4, name="conv1"),
             node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn"], name="bn1"),
             node("Relu", ["bn"], ["r1"], name="relu1"),
             node("MaxPool", ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             node("Conv", ["p", "W2"], ["c2"], pads=[1] * 4, name="conv2"),
             node("Add", ["c2", "p"], ["a"], name="add"),
             node("Relu", ["a"], ["r2"], name="relu2"),
             node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
             node("Flatten", ["gap"], ["f"], name="flatten"),
             node("Gemm", ["f", "Wf", "Bf"], ["y"], transB=1, name="fc")]
    return make_model(nodes, inits, {"x": (1, 3, 8, 8)}, {"y": (1, 10)})


@pytest.fixture(scope="module")
def net():
    return conv_bn_net()


@pytest.fixture(scope="module")
def qnet(net):
    return quantize_onnx(net, _feeds((1, 3, 8, 8), 8), show_progress=False)


# ----------------------------------------------------------------------------- batch norm


def test_batch_norm_is_folded_exactly(net):
    folded, names = prepare(net)
    assert names == ["bn1"]
    assert not any(n.op_type == "BatchNormalization" for n in folded.graph.node)
    for f in _feeds((1, 3, 8, 8), 3, seed=5):
        np.testing.assert_allclose(run_onnxruntime(folded, f)[0], run_onnxruntime(net, f)[0],
                                   rtol=1e-4, atol=1e-4)


def test_folded_weights_match_the_formula(net):
    folded, _ = prepare(net)
    conv = next(n for n in folded.graph.node if n.name == "conv1")
    i, o = _inits(folded), _inits(net)
    k = o["g"] / np.sqrt(o["v"] + 1e-5)
    np.testing.assert_allclose(i[conv.input[1]], o["W1"] * k[:, None, None, None], rtol=1e-5)
    np.testing.assert_allclose(i[conv.input[2]], (o["B1"] - o["m"]) * k + o["b"], rtol=1e-5, atol=1e-6)


def test_quantized_model_has_no_batch_norm_and_int8_conv_weights(qnet):
    ops = [n.op_type for n in qnet.model.graph.node]
    assert "BatchNormalization" not in ops
    assert qnet.folded_bn == ["bn1"]
    conv1 = next(n for n in qnet.model.graph.node if n.name == "conv1")
    wdq = next(n for n in qnet.model.graph.node if n.output[0] == conv1.input[1])
    assert wdq.op_type == "DequantizeLinear"

# ----------------------------------------------------------------------------- QDQ form


def test_weights_and_bias_recomputed_with_numpy(qnet):
    """conv1's int8 weights, scales and int32 bias, recomputed from the folded FP32 weights
    and the calibrated input scale (bias without the correction term)."""
    fp, q = _inits(qnet.fp32), _inits(qnet.model)
    conv = next(n for n in qnet.fp32.graph.node if n.name == "conv1")
    w = fp[conv.input[1]]
    s = np.abs(w).reshape(w.shape[0], -1).max(1) / 127
    np.testing.assert_allclose(q["conv1/W_scale"], s, rtol=1e-6)
    np.testing.assert_array_equal(q["conv1/W_int8"], np.clip(np.round(w / s[:, None, None, None]), -127, 127))
    assert q["conv1/W_int8"].dtype == np.int8 and not q["conv1/W_zero_point"].any()
    x_scale = float(q["x/scale"])
    np.testing.assert_allclose(q["conv1/B_scale"], x_scale * s, rtol=1e-6)
    assert q["conv1/B_int32"].dtype == np.int32
    lo, hi = qnet.ranges["x"]
    want = activation_qparams(lo, hi)
    assert x_scale == pytest.approx(want.scale) and int(q["x/zero_point"]) == want.zero_point


def test_bias_correction_moves_the_bias_by_the_predicted_shift(net):
    feeds = _feeds((1, 3, 8, 8), 8)
    on = quantize_onnx(net, feeds, show_progress=False)
    off = quantize_onnx(net, feeds, show_progress=False, bias_correction=False)
    b_on = _inits(on.model)["conv2/B_int32"].astype(np.int64)  # conv2 had no bias: one is added
    assert "conv2/B_int32" not in _inits(off.model)
    assert np.any(b_on != 0)


def test_pool_and_flatten_share_their_input_scale(qnet):
    q = _inits(qnet.model)
    for a, b in (("r1", "p"), ("gap", "f")):
        assert float(q[f"{a}/scale"]) == float(q[f"{b}/scale"]), (a, b)
        assert int(q[f"{a}/zero_point"]) == int(q[f"{b}/zero_point"])


def test_residual_add_and_relu_fold_into_one_quantize(qnet):
    q = {n.name: n for n in qnet.model.graph.node}
    # the add's output is not quantized on its own: relu2's output is (relu folds into it)
    assert "a/QuantizeLinear" not in q and "r2/QuantizeLinear" in q
    assert "c2/QuantizeLinear" in q and "p/QuantizeLinear" in q
    lo, hi = qnet.ranges["r2"]
    assert lo >= 0


def test_every_quantized_activation_is_int8_per_tensor(qnet):
    inits = _inits(qnet.model)
    for n in qnet.model.graph.node:
        if n.op_type == "QuantizeLinear":
            assert inits[n.input[1]].size == 1
            assert inits[n.input[2]].dtype == np.int8


def test_keep_fp32_leaves_the_layer_float(net):
    qm = quantize_onnx(net, _feeds((1, 3, 8, 8), 4), keep_fp32=["conv2"], show_progress=False)
    conv2 = next(n for n in qm.model.graph.node if n.name == "conv2")
    assert conv2.input[1] in _inits(qm.model)  # a float initializer, no DequantizeLinear
    assert _inits(qm.model)[conv2.input[1]].dtype == np.float32
    assert "conv2" not in qm.quantized_layers and "conv1" in qm.quantized_layers
    assert "kept in FP32 on request" in qm.summary()


def test_unsupported_ops_stay_fp32():
    rng = np.random.default_rng(0)
    inits = {"W1": rand(rng, 4, 3, 3, 3), "W2": rand(rng, 4, 4, 1, 1)}
    nodes = [node("Conv", ["x", "W1"], ["c"], pads=[1] * 4, name="c1"), node("Sigmoid", ["c"], ["s"]),
             node("Conv", ["s", "W2"], ["d"], name="c2"), node("Softmax", ["d"], ["y"], axis=1)]
    m = make_model(nodes, inits, {"x": (1, 3, 5, 5)}, {"y": None})
    qm = quantize_onnx(m, _feeds((1, 3, 5, 5), 4), show_progress=False)
    assert set(qm.quantized_layers) == {"c1", "c2"}
    ops = [n.op_type for n in qm.model.graph.node]
    assert ops.count("Sigmoid") == 1 and ops.count("Softmax") == 1
    f = _feeds((1, 3, 5, 5), 1, seed=3)[0]
    assert cosine(run_onnxruntime(m, f)[0], run_onnxruntime(qm.model, f, optimize=False)[0]) > 0.99


def test_nothing_to_quantize_is_an_error():
    m = make_model([node("Relu", ["x"], ["y"])], {}, {"x": (1, 4)}, {"y": None})
    with pytest.raises(ValueError, match="nothing to quantize"):
        quantize_onnx(m, _feeds((1, 4), 2), show_progress=False)

def test_concat_inputs_and_output_share_one_scale():
    """Two convs concatenated, then a conv: the concat is int8 and its operands agree on
    one grid (the union of their ranges)."""
    rng = np.random.default_rng(0)
    inits = {"W1": rand(rng, 4, 3, 1, 1), "W2": rand(rng, 4, 3, 1, 1, scale=5.0), "W3": rand(rng, 2, 8, 1, 1)}
    nodes = [node("Conv", ["x", "W1"], ["a"], name="c1"), node("Conv", ["x", "W2"], ["b"], name="c2"),
             node("Concat", ["a", "b"], ["cat"], axis=1, name="cat"),
             node("Conv", ["cat", "W3"], ["y"], name="c3")]
    m = make_model(nodes, inits, {"x": (1, 3, 4, 4)}, {"y": None})
    qm = quantize_onnx(m, _feeds((1, 3, 4, 4), 4), show_progress=False)
    q = _inits(qm.model)
    scales = {t: float(q[f"{t}/scale"]) for t in ("a", "b", "cat")}
    assert len(set(scales.values())) == 1, scales
    lo = min(qm.ranges[t][0] for t in ("a", "b", "cat"))
    hi = max(qm.ranges[t][1] for t in ("a", "b", "cat"))
    assert scales["a"] == pytest.approx(activation_qparams(lo, hi).scale)
    assert "cat" in {f.name for f in qm.plan.followers}


# ----------------------------------------------------------------------------- pass-through


def test_qdq_models_pass_through(tmp_path, net):
    qdq = onnx.load(str(quantize(net, tmp_path, name="ortq")))
    qm = quantize_onnx(qdq, None, show_progress=False)
    assert qm.passthrough and "already quantized" in qm.summary()
    assert qm.model.SerializeToString() == qdq.SerializeToString()
    mod = from_onnx(qdq, keep_params_in_input=False)
    assert dsa_tvm.quantize(mod, verbose=False) is mod


def test_fp32_relax_module_is_quantized_in_relax(net):
    """An FP32 Relax module (no ONNX source) goes through dsa_tvm.quant.relax_quantize."""
    mod = from_onnx(net, keep_params_in_input=False)
    qmod = dsa_tvm.quantize(mod, _feeds((1, 3, 8, 8), 2), verbose=False, show_progress=False)
    names = set()
    relax.analysis.post_order_visit(
        qmod["main"].body, lambda e: names.add(getattr(getattr(e, "op", None), "name", "")))
    assert "relax.quantize" in names and "relax.dequantize" in names
    with pytest.raises(ValueError, match="calibration_data is required"):
        dsa_tvm.quantize(mod, verbose=False)

# ----------------------------------------------------------------------------- data


def test_calibration_data_sources(tmp_path):
    shapes = {"x": (1, 3, 8, 8)}
    arr = np.random.default_rng(0).normal(size=(5, 3, 8, 8)).astype(np.float32)
    assert len(as_feeds(arr, shapes)) == 5
    assert len(as_feeds(arr[:, None], shapes)) == 5
    np.savez(tmp_path / "c.npz", x=arr)
    feeds = as_feeds(tmp_path / "c.npz", shapes, limit=3)
    assert len(feeds) == 3 and feeds[0]["x"].shape == (1, 3, 8, 8)
    from PIL import Image

    for i in range(3):
        img = (np.random.default_rng(i).uniform(0, 255, (20, 30, 3))).astype(np.uint8)
        Image.fromarray(img).save(tmp_path / f"img{i}.png")
    feeds = as_feeds(tmp_path, shapes, preprocess="unit")
    assert len(feeds) == 3 and feeds[0]["x"].shape == (1, 3, 8, 8)
    assert 0 <= feeds[0]["x"].min() and feeds[0]["x"].max() <= 1
    with pytest.raises(ValueError, match="does not fit the model input"):
        as_feeds(np.zeros((2, 5)), shapes)
    with pytest.raises(ValueError, match="no array for model input"):
        as_feeds({"y": arr}, shapes)

# ----------------------------------------------------------------------------- outliers


def outlier_dense(seed=0) -> onnx.ModelProto:
    """LayerNorm -> MatMul + bias with one huge output channel -> residual -> LayerNorm."""
    rng = np.random.default_rng(seed)
    d = 32
    w = rand(rng, d, d, scale=0.2)
    w[:, 5] *= 150  # output channel 5 dwarfs the rest (BERT's FFN output has such channels)
    inits = {"W": w, "B": rand(rng, d), "g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)}
    nodes = [node("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1),
             node("MatMul", ["h", "W"], ["m"], name="dense"), node("Add", ["m", "B"], ["o"]),
             node("Add", ["o", "x"], ["r"]), node("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1)]
    return make_model(nodes, inits, {"x": (1, 16, d)}, {"y": (1, 16, d)})


def test_outlier_split_is_exact_in_fp32_and_helps_int8():
    m = outlier_dense()
    feeds = _feeds((1, 16, 32), 6)
    on = quantize_onnx(m, feeds, show_progress=False)
    off = quantize_onnx(m, feeds, show_progress=False, split_outliers=False)
    assert on.side_path and not off.side_path
    ev = _feeds((1, 16, 32), 4, seed=9)
    for f in ev:  # the rewritten FP32 graph computes the same function
        np.testing.assert_allclose(run_onnxruntime(on.fp32, f)[0], run_onnxruntime(m, f)[0],
                                   rtol=1e-4, atol=1e-4)
    assert "dense" in on.quantized_layers
    c_on = accuracy_report(on, ev, per_layer=False).cosine
    c_off = accuracy_report(off, ev, per_layer=False).cosine
    assert c_on > c_off and c_on > 0.999, (c_on, c_off)

# ----------------------------------------------------------------------------- report


def test_accuracy_report_table_and_json(qnet):
    ev = _feeds((1, 3, 8, 8), 4, seed=7)
    rep = accuracy_report(qnet, ev, with_sensitivity=True, name="net", show_progress=False)
    text = str(rep)
    assert "output y: cosine" in text and "top1 agreement" in text and "conv1" in text
    data = json.loads(rep.to_json())
    assert data["output_cosine"]["y"] == pytest.approx(rep.cosine)
    assert {r["layer"] for r in data["layers"]} >= {"relu1", "pool", "relu2", "fc"}
    for r in rep.layers:
        assert -1 <= r.cosine <= 1 + 1e-9
    gains = [s.gain for s in rep.sensitivity]
    assert gains == sorted(gains, reverse=True) and len(gains) == 3
    assert set(rep.topk) == {"top1", "top5"}


def test_mixed_precision_reaches_its_target_or_says_how_far(qnet):
    ev = _feeds((1, 3, 8, 8), 4, seed=7)
    base = accuracy_report(qnet, ev, per_layer=False).cosine
    target = 1 - (1 - base) / 3
    ranking = sensitivity(qnet, ev, show_progress=False)
    best, kept, cos = mixed_precision(qnet, ev, target, max_fp32=3, ranking=ranking, show_progress=False)
    helpful = [s.layer for s in ranking if s.gain > 0]
    assert kept and kept == helpful[:len(kept)]  # most sensitive first
    assert cos >= target or len(kept) == min(3, len(helpful))
    assert cos > base
    assert set(best.options.keep_fp32) == set(kept)

# ----------------------------------------------------------------------------- CLI


def test_cli_quantize_writes_model_and_report(tmp_path, net, capsys):
    from dsa_tvm.cli import main

    src = tmp_path / "net.onnx"
    onnx.save(net, src)
    np.savez(tmp_path / "cal.npz", x=np.stack([f["x"] for f in _feeds((1, 3, 8, 8), 4)]))
    rc = main(["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "--method", "percentile",
               "--eval", "synthetic:2", "-o", str(tmp_path / "q.onnx"), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "quantized 3 weighted layers" in out and "output y: cosine" in out
    assert onnx.load(str(tmp_path / "q.onnx")).graph.node
    rep = json.loads((tmp_path / "q.report.json").read_text())
    assert rep["method"] == "percentile" and rep["layers"]
    assert main(["quantize", str(src), "--calib", str(tmp_path / "nope.npz")]) == 2


def test_cli_quantize_w4a8_writes_int4_codes(tmp_path, net, capsys):
    from dsa_tvm.cli import main

    src = tmp_path / "net.onnx"
    onnx.save(net, src)
    np.savez(tmp_path / "cal.npz", x=np.stack([f["x"] for f in _feeds((1, 3, 8, 8), 4)]))
    assert main(["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "--weight-bits",
                 "4", "--quiet"]) == 0
    assert "int4 weights" in capsys.readouterr().out
    q = onnx.load(str(tmp_path / "net_w4a8.onnx"))   # the default name says what it is
    codes = [onnx.numpy_helper.to_array(i) for i in q.graph.initializer
             if i.name.endswith("/W_int8")]
    assert codes and all(c.min() >= -7 and c.max() <= 7 for c in codes)
    with pytest.raises(SystemExit):   # argparse names the choices
        main(["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "--weight-bits", "3"])
    assert "invalid choice: 3 (choose from 4, 8)" in capsys.readouterr().err

# ----------------------------------------------------------------------------- on the DSA


def test_our_quantized_network_runs_bit_exact_on_the_dsa():
    """MobileNetV2 (depthwise, relu6, residual adds), quantized by us: every MAC offloaded,
    every launch equal to the integer reference, the output within one step of the QDQ
    graph run op by op."""
    fp = get_model("mobilenet_v2", quantized=False, input_size=32, width_mult=0.25, num_classes=100)
    qm = quantize_onnx(fp, calibration_data(fp, 8, 0), show_progress=False)
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=0.01)
    ex = tvm.compile(qm.to_relax(), target=dsa_tvm.target(cfg))
    rep = dsa_tvm.last_compile_report()
    assert all(d.target == "dsa" for d in rep.regions), str(rep)
    assert not [op for op in rep.partition.cpu_ops if op.macs], str(rep)
    feed = calibration_data(fp, 1, 3)[0]
    take_launches()
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(feed["input"]))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    launches = take_launches()
    regions = {d.name: d.region for d in rep.regions}
    assert launches
    for la in launches:
        want = run_region(regions[la.program.name], la.inputs)
        for name, arr in la.outputs.items():
            np.testing.assert_array_equal(arr, want[name])
    ref = run_onnxruntime(qm.model, feed, optimize=False)[0]
    step = float(_inits(qm.model)[f"{qm.fp32.graph.output[0].name}/scale"])
    assert np.abs(got - ref).max() <= step * (1 + 1e-3)
