"""A softmax behind an additive attention mask (``quantize_norms``): the mask's values must
not set the softmax input's int8 grid. Before the fix, BERT's ``finfo(float32).min`` mask
stretched the grid to 1e38 wide, every real score rounded to one code, and
all-MiniLM-L6-v2 with int8 softmax kept 0.47 of its embedding cosine."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.isa.intnorm import EXP_ZERO_SPAN, int_exp, int_softmax, softmax_params
from dsa_tvm.quant.observers import MASKED, SoftmaxInputObserver, make_observer
from dsa_tvm.quant.qparams import activation_qparams

from .. import qdq_models as qm

ort = pytest.importorskip("onnxruntime")

NEG = float(np.finfo(np.float32).min)


def _observe(batches, method="minmax"):
    o = SoftmaxInputObserver(make_observer(method), EXP_ZERO_SPAN)
    for b in batches:
        o.update(b)
    return o


def test_exp_is_zero_from_the_span_on():
    """The span is where the unit's exponential underflows: zero at and past it, not before."""
    from dsa_tvm.isa.intnorm import EXP_FRAC
    steps = int(np.ceil(EXP_ZERO_SPAN / np.log(2) * (1 << EXP_FRAC)))
    assert (int_exp(-np.arange(steps, steps + 50_000)) == 0).all()
    assert int_exp(np.array([-(steps - 2 * (1 << EXP_FRAC))])) > 0  # two periods before: not 0


@given(st.integers(0, 2**31 - 1), st.sampled_from([-1e4, -1e9, NEG]),
       st.sampled_from(["minmax", "percentile", "mse", "entropy"]))
@settings(max_examples=25, deadline=None)
def test_mask_values_never_set_the_range(seed, mask, method):
    rng = np.random.default_rng(seed)
    scores = rng.normal(0, 3, (4, 2, 6, 9)).astype(np.float32)
    hidden = rng.random((4, 1, 1, 9)) < 0.4
    hidden[..., 0] = False                      # one key always visible
    x = scores + np.where(hidden, np.float32(mask), np.float32(0))
    lo, hi = _observe([x], method).range()
    real = x[x > MASKED]
    floor = float(x.max(-1).min()) - EXP_ZERO_SPAN
    assert hi <= float(real.max()) + 1e-6 and lo >= min(float(real.min()), floor) - 1e-6
    if method == "minmax":                     # every real score held, nothing more
        assert lo == pytest.approx(min(float(real.min()), floor), abs=1e-5)
        assert hi == pytest.approx(float(real.max()))


def test_without_mask_values_it_is_the_plain_observer():
    x = np.random.default_rng(1).normal(0, 40, (3, 5, 7)).astype(np.float32)
    plain = make_observer("minmax")
    plain.update(x)
    assert _observe([x]).range() == plain.range()


def test_rows_masked_entirely_are_left_out():
    x = np.zeros((2, 4), np.float32)
    x[0] = [1.0, 2.0, NEG, NEG]
    x[1] = NEG                                  # a padded query row: all keys hidden
    lo, hi = _observe([x]).range()
    assert hi == 2.0 and lo == pytest.approx(2.0 - EXP_ZERO_SPAN)


def test_every_row_masked_on_every_batch_is_an_error():
    o = _observe([np.full((2, 3), NEG, np.float32)])
    with pytest.raises(ValueError, match="masked entirely"):
        o.range()
    assert MASKED > -1e4


def test_a_masked_key_contributes_exactly_zero_on_the_grid():
    """Saturated at the grid's minimum, a masked key's probability is 0 and the others are
    what the row without it gives, bit for bit."""
    rng = np.random.default_rng(3)
    scores = rng.normal(0, 2, (64, 12)).astype(np.float32)
    x = scores.copy()
    x[:, -3:] = NEG
    lo, hi = _observe([x]).range()
    qp = activation_qparams(lo, hi)
    codes = np.clip(np.round(x / qp.scale) + qp.zero_point, -128, 127).astype(np.int64)
    p = softmax_params(qp.scale, 1 / 256, -128)
    full, part = int_softmax(codes, qp.zero_point, p), int_softmax(codes[:, :-3], qp.zero_point, p)
    assert (full[:, -3:] == -128).all()
    np.testing.assert_array_equal(full[:, :-3], part)


def _attention(t: int = 8) -> onnx.ModelProto:
    """scores + additive mask -> Softmax -> @ V: BERT's attention after Q @ K^T."""
    rng = np.random.default_rng(0)
    nodes = [qm.node("Add", ["s", "m"], ["sm"], name="mask"),
             qm.node("Softmax", ["sm"], ["p"], name="softmax", axis=-1),
             qm.node("MatMul", ["p", "v"], ["y"], name="pv")]
    inits = {"v": rng.normal(0, 1, (t, 16)).astype(np.float32)}
    return qm.make_model(nodes, inits, {"s": (1, 2, t, t), "m": (1, 1, 1, t)},
                         {"y": (1, 2, t, 16)})


def _feed(rng, t: int = 8) -> dict[str, np.ndarray]:
    valid = rng.integers(2, t + 1)
    m = np.where(np.arange(t) < valid, 0.0, NEG).astype(np.float32).reshape(1, 1, 1, t)
    return {"s": rng.normal(0, 3, (1, 2, t, t)).astype(np.float32), "m": m}


def test_masked_attention_keeps_its_probabilities():
    """quantize_norms on padded inputs: the int8 softmax's probabilities stay within a few
    output steps of FP32's (onnxruntime on the QDQ model, optimizations off)."""
    from dsa_tvm.quant.api import quantize_onnx

    rng = np.random.default_rng(0)
    net = _attention()
    q = quantize_onnx(net, [_feed(rng) for _ in range(16)], show_progress=False,
                      quantize_norms=True, split_outliers=False)
    lo, _ = q.ranges["sm"]
    assert lo > MASKED, lo
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with_p = onnx.ModelProto()
    with_p.CopyFrom(q.model)
    with_p.graph.output.append(onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(with_p.SerializeToString(), so)
    ref = ort.InferenceSession(net.SerializeToString(), so)
    for _ in range(4):
        feed = _feed(rng)
        p = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))["p"]
        z = feed["s"] + feed["m"]
        want = np.exp(z - z.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        assert np.abs(p - want).max() < 8 / 256
        y, y_ref = sess.run(["y"], feed)[0], ref.run(None, feed)[0]
        assert float((y * y_ref).sum() / np.linalg.norm(y) / np.linalg.norm(y_ref)) > 0.995


def _log_masked(t: int = 8) -> onnx.ModelProto:
    """The mask made in the graph, ``log(keep)``: 0 where a key is kept, -inf where not."""
    net = _attention(t)
    nodes = [qm.node("Log", ["keep"], ["m"], name="log_mask"), *net.graph.node]
    del net.graph.node[:]
    net.graph.node.extend(nodes)
    (m,) = [i for i in net.graph.input if i.name == "m"]
    m.name = "keep"
    return net


def test_a_minus_infinity_mask_calibrates_and_nan_still_stops():
    from dsa_tvm.quant.api import quantize_onnx

    rng = np.random.default_rng(1)
    feeds = [_feed(rng) for _ in range(4)]
    for f in feeds:
        f["keep"] = (f.pop("m") == 0).astype(np.float32)
    q = quantize_onnx(_log_masked(), feeds, show_progress=False, quantize_norms=True,
                      split_outliers=False)
    assert MASKED < q.ranges["sm"][0] < 0
    feeds[2]["keep"][..., -1] = -1.0     # log(-1): NaN inside the graph
    with pytest.raises(ValueError, match="NaN"):
        quantize_onnx(_log_masked(), feeds, show_progress=False, quantize_norms=True,
                      split_outliers=False)


def test_cli_quantize_norms_puts_the_softmax_on_int8(tmp_path):
    from dsa_tvm.cli import main

    rng = np.random.default_rng(2)
    src = tmp_path / "att.onnx"
    onnx.save(_attention(), src)
    feeds = [_feed(rng) for _ in range(4)]
    np.savez(tmp_path / "cal.npz", s=np.concatenate([f["s"] for f in feeds]),
             m=np.concatenate([f["m"] for f in feeds]))
    for flag, int8 in (([], False), (["--quantize-norms"], True)):  # the softmax's input
        out = tmp_path / f"q{int8}.onnx"
        assert main(["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "-o", str(out),
                     "--quiet", "--no-outlier-split", *flag]) == 0
        q = onnx.load(str(out))
        quantized = {n.input[0].removesuffix("/fp32") for n in q.graph.node
                     if n.op_type == "QuantizeLinear"}
        assert ("sm" in quantized) == int8, quantized
    from dsa_tvm.quant.api import quantize_onnx
    q = quantize_onnx(_attention(), feeds, show_progress=False, split_outliers=False)
    assert "quantize_norms=True" in q.summary()   # the FP32 softmax says how to move it
