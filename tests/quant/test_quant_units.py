"""Quantizer building blocks against hand-computed and independent numpy references:
observers, scales and zero points, weight/bias quantization, bias correction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsa_tvm.quant.bias_correction import conv_shift, dense_shift
from dsa_tvm.quant.metrics import cosine, sqnr_db, topk_agreement
from dsa_tvm.quant.observers import (
    METHODS,
    EntropyObserver,
    HistogramObserver,
    MinMaxObserver,
    MSEObserver,
    PercentileObserver,
    make_observer,
    quant_error,
)
from dsa_tvm.quant.qparams import (
    activation_qparams,
    bias_qparams,
    quantize_bias,
    quantize_weight,
    weight_qparams,
)

finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)

# ----------------------------------------------------------------------------- observers


@given(st.lists(st.lists(finite, min_size=1, max_size=30), min_size=1, max_size=5))
def test_minmax_is_the_range_of_all_batches(batches):
    obs = MinMaxObserver()
    for b in batches:
        obs.update(np.array(b, np.float32))
    flat = np.concatenate([np.array(b, np.float32) for b in batches])
    assert obs.range() == (float(flat.min()), float(flat.max()))


def test_observer_without_data_says_so():
    with pytest.raises(ValueError, match="saw no data"):
        MinMaxObserver().range()


@pytest.mark.parametrize("seed", range(4))
def test_histogram_range_doubling_is_exact(seed):
    """Growing the range merges bins pairwise: the counts equal one np.histogram of all the
    data over the final range."""
    rng = np.random.default_rng(seed)
    obs = HistogramObserver(bins=512)
    parts = [rng.normal(0, 1, 2000), rng.normal(0, 5, 2000), rng.uniform(-40, 30, 2000)]
    for p in parts:
        obs.update(p.astype(np.float32))
    assert obs.radius >= 40
    want, _ = np.histogram(np.concatenate(parts).astype(np.float32), bins=512,
                           range=(-obs.radius, obs.radius))
    assert obs.counts.sum() == 6000
    assert np.abs(obs.counts - want).sum() <= 4  # values landing exactly on an edge, at most


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, 200_000).astype(np.float32)
    obs = PercentileObserver(percentile=99.0)
    obs.update(x)
    lo, hi = obs.range()
    width = 2 * obs.radius / obs.bins
    assert abs(lo - np.percentile(x, 0.5)) <= 2 * width
    assert abs(hi - np.percentile(x, 99.5)) <= 2 * width


def test_percentile_one_sided_clips_only_the_top():
    rng = np.random.default_rng(1)
    x = np.abs(rng.standard_cauchy(100_000)).astype(np.float32)
    obs = PercentileObserver(percentile=99.0)
    obs.update(x)
    lo, hi = obs.range()
    assert lo == pytest.approx(float(x.min()))
    assert hi == pytest.approx(np.percentile(x, 99.0), rel=0.05)


def _fake_quant_mse(x: np.ndarray, lo: float, hi: float) -> float:
    """Independent reference: quantize-dequantize on 255 steps over [lo, hi], numpy."""
    step = (hi - lo) / 255
    q = np.clip(np.round((x - lo) / step), 0, 255) * step + lo
    return float(np.mean((x - q) ** 2))


def test_mse_observer_finds_the_best_clipping():
    """Checked by brute force on the samples themselves (not the histogram)."""
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.laplace(0, 1, 100_000), [40.0, -35.0]]).astype(np.float32)
    mse, mm = MSEObserver(), MinMaxObserver()
    mse.update(x)
    mm.update(x)
    lo, hi = mse.range()
    best = _fake_quant_mse(x, lo, hi)
    brute = min(_fake_quant_mse(x, -35 * a, 40 * a) for a in np.linspace(0.05, 1, 96))
    assert best <= 1.05 * brute
    assert best < 0.9 * _fake_quant_mse(x, *mm.range())
    assert hi < 40 and lo > -35


def test_quant_error_of_a_histogram_matches_samples():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 50_000)
    obs = HistogramObserver(bins=4096)
    obs.update(x)
    est = quant_error(obs.centers, obs.counts, -0.5, 0.5) / x.size
    assert est == pytest.approx(_fake_quant_mse(x, -0.5, 0.5), rel=0.05)


def test_entropy_clips_a_long_tail_but_not_the_bulk():
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.normal(0, 1, 200_000), rng.normal(0, 1, 20) * 30]).astype(np.float32)
    obs = EntropyObserver()
    obs.update(x)
    lo, hi = obs.range()
    assert 2.5 < hi < 0.9 * float(x.max())
    assert lo == pytest.approx(-hi)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_covers_a_uniform_tensor(method):
    x = np.linspace(-3, 5, 100_001, dtype=np.float32)
    obs = make_observer(method)
    obs.update(x)
    lo, hi = obs.range()
    assert -3.0 <= lo <= -2.6 and 4.4 <= hi <= 5.0, (method, lo, hi)


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="unknown calibration method 'kl'"):
        make_observer("kl")

# ----------------------------------------------------------------------------- scales


def test_activation_qparams_hand_computed():
    qp = activation_qparams(-1.0, 3.0)
    assert qp.scale == pytest.approx(4.0 / 255)
    assert qp.zero_point == round(-128 + 1.0 / (4.0 / 255))  # -64
    sym = activation_qparams(-1.0, 3.0, symmetric=True)
    assert sym.scale == pytest.approx(3.0 / 127) and sym.zero_point == 0
    relu = activation_qparams(0.0, 6.0)
    assert relu.zero_point == -128 and relu.scale == pytest.approx(6.0 / 255)
    # the range always includes 0
    pos = activation_qparams(2.0, 4.0)
    assert pos.zero_point == -128 and pos.scale == pytest.approx(4.0 / 255)


@given(st.floats(-1e3, 0), st.floats(0, 1e3), st.booleans())
def test_activation_qparams_represent_their_range(lo, hi, symmetric):
    qp = activation_qparams(lo, hi, symmetric)
    assert qp.scale > 0 and -128 <= qp.zero_point <= 127
    assert qp.dequantize(qp.quantize(np.zeros(1)))[0] == 0.0  # zero is exact
    x = np.linspace(lo, hi, 101)
    err = np.abs(qp.dequantize(qp.quantize(x)) - x)
    assert err.max() <= qp.scale * 0.5 + 1e-6 * max(1.0, abs(lo), hi) or hi - lo < 1e-6


def test_weight_scales_per_output_channel():
    w = np.array([[[[1.0, -2.0]]], [[[0.5, 0.25]]], [[[0.0, 0.0]]]], np.float32)  # [3, 1, 1, 2]
    s = weight_qparams(w, 0)
    np.testing.assert_allclose(s[:2], [2.0 / 127, 0.5 / 127], rtol=1e-6)
    assert s[2] > 0  # an all-zero channel still gets a positive scale
    q = quantize_weight(w, s, 0)
    np.testing.assert_array_equal(q[:, 0, 0, :], [[64, -127], [127, 64], [0, 0]])
    t = weight_qparams(w, None)
    assert t.size == 1 and t[0] == pytest.approx(2.0 / 127)


def test_weight_axis_one_for_matmul():
    w = np.array([[1.0, 10.0], [-3.0, 5.0]], np.float32)  # [K, N]: scales per column
    s = weight_qparams(w, 1)
    np.testing.assert_allclose(s, [3.0 / 127, 10.0 / 127], rtol=1e-6)
    np.testing.assert_array_equal(quantize_weight(w, s, 1), [[42, 127], [-127, 64]])


def test_int4_weight_codes_are_absmax_per_channel():
    w = np.array([[1.0, 10.0], [-3.5, 4.0], [0.2, -0.1]], np.float32)  # [K, N]
    s = weight_qparams(w, 1, bits=4)
    np.testing.assert_allclose(s, [3.5 / 7, 10.0 / 7], rtol=1e-6)
    q = quantize_weight(w, s, 1, 4)
    np.testing.assert_array_equal(q, [[2, 7], [-7, 3], [0, 0]])
    with pytest.raises(ValueError, match=r"weight_bits must be one of \(4, 8\), got 2"):
        weight_qparams(w, 1, bits=2)


def test_bias_scale_is_input_times_weight_scale():
    ws = np.array([0.01, 0.02], np.float32)
    bs = bias_qparams(0.5, ws, 2)
    np.testing.assert_allclose(bs, [0.005, 0.01], rtol=1e-6)
    np.testing.assert_array_equal(quantize_bias(np.array([1.0, -1.0]), bs), [200, -100])

# ----------------------------------------------------------------------------- bias correction


def _conv_valid(x: np.ndarray, w: np.ndarray, groups: int) -> np.ndarray:
    """Independent reference: a direct grouped conv2d without padding (numpy loops)."""
    n, c, h, wd = x.shape
    o, ig, kh, kw = w.shape
    og = o // groups
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1))
    for oc in range(o):
        g = oc // og
        for i in range(h - kh + 1):
            for j in range(wd - kw + 1):
                patch = x[:, g * ig:(g + 1) * ig, i:i + kh, j:j + kw]
                out[:, oc, i, j] = (patch * w[oc]).sum((1, 2, 3))
    return out


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_conv_shift_predicts_the_mean_output_error(groups):
    rng = np.random.default_rng(groups)
    x = rng.normal(1.0, 0.3, (2, 4, 6, 6)) * rng.uniform(0.5, 2, (1, 4, 1, 1))
    dw = rng.normal(0, 0.01, (4, 4 // groups, 3, 3))
    want = _conv_valid(x, dw, groups).mean((0, 2, 3))
    # a constant-mean input (no padding) makes the prediction exact up to sampling
    xm = np.ones_like(x) * x.mean((0, 2, 3), keepdims=True)
    exact = _conv_valid(xm, dw, groups).mean((0, 2, 3))
    got = conv_shift(dw, x.mean((0, 2, 3)), groups)
    np.testing.assert_allclose(got, exact, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got, want, rtol=0.2, atol=1e-3)


def test_dense_shift_both_layouts():
    rng = np.random.default_rng(0)
    x = rng.normal(0.5, 1, (64, 5))
    dw = rng.normal(0, 0.01, (5, 3))
    want = (x @ dw).mean(0)
    np.testing.assert_allclose(dense_shift(dw, x.mean(0), False), want, rtol=1e-9)
    np.testing.assert_allclose(dense_shift(dw.T, x.mean(0), True), want, rtol=1e-9)

# ----------------------------------------------------------------------------- metrics


def test_metrics_hand_computed():
    assert cosine(np.array([1.0, 0]), np.array([0, 2.0])) == pytest.approx(0.0)
    assert cosine(np.array([1.0, 2]), np.array([2.0, 4])) == pytest.approx(1.0)
    assert sqnr_db(np.array([3.0, 4.0]), np.array([3.0, 3.0])) == pytest.approx(10 * math.log10(25.0))
    assert sqnr_db(np.ones(3), np.ones(3)) == math.inf
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]])
    got = np.array([[0.9, 0.8, 0.0], [0.7, 0.2, 0.1]])
    assert topk_agreement(ref, got, 1) == 0.5
    assert topk_agreement(ref, got, 2) == 1.0
    # a tie at the top counts as the lower index, like np.argmax
    tied = np.zeros((1, 2000))
    tied[0, [3, 1500]] = 1.0
    want = np.zeros((1, 2000))
    want[0, 1500] = 1.0
    assert topk_agreement(want, tied, 1) == 0.0 and topk_agreement(want, tied, 2) == 1.0


def test_channel_mean_observer_against_numpy():
    from dsa_tvm.quant.observers import ChannelMeanObserver

    rng = np.random.default_rng(0)
    xs = [rng.normal(i, 2, (2, 5, 3, 4)).astype(np.float32) for i in range(3)]
    obs = ChannelMeanObserver(1)
    for x in xs:
        obs.update(x)
    allx = np.concatenate(xs)
    np.testing.assert_allclose(obs.mean(), allx.mean((0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(obs.absmax, np.abs(allx).max((0, 2, 3)), rtol=1e-6)
    last = ChannelMeanObserver(-1)
    last.update(allx)
    np.testing.assert_allclose(last.mean(), allx.mean((0, 1, 2)), rtol=1e-6)
