"""int32 biases never wrap (issue 11, finding 2).

A tiny input scale (activations ~1e-6, or all-zero calibration clamped to the smallest
scale) used to make the quantizer emit a bias scale other than input x weight scale, and
the compiler rescaled that bias into accumulator units past int32 (255 steps off). Now the
quantizer raises the input scale until the bias fits, and the compiler range-checks any
bias it rescales (CPU fallback with the reason). References: TVM's llvm build of the same
QDQ module, onnxruntime with graph optimizations off, and the FP32 model.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.models import run_onnxruntime
from dsa_tvm.quant import quantize_onnx
from dsa_tvm.quant.metrics import cosine
from dsa_tvm.quant.qparams import (
    BIAS_BUDGET,
    bias_input_scale_floor,
    bias_qparams,
    bias_weight_scale_floor,
    quantize_bias,
    quantize_weight,
    weight_qparams,
    worst_case_sum,
)
from dsa_tvm.quant.relax_quantize import quantize_relax

from ..qdq_models import QDQGraph, make_model, node, rand

SHAPE = (1, 3, 8, 8)


def conv_relu(seed: int = 0):
    rng = np.random.default_rng(seed)
    inits = {"W": rand(rng, 8, 3, 3, 3), "B": rand(rng, 8)}
    return make_model([node("Conv", ["x", "W", "B"], ["c"], pads=[1] * 4, name="conv"),
                       node("Relu", ["c"], ["out"], name="relu")], inits, {"x": SHAPE}, {"out": None})


def dead_channel_conv(seed: int = 0):
    """A conv whose first output channel has all-zero weights and a bias: its weight scale
    sits at the smallest scale, so its bias in s_x * s_w units is astronomically large."""
    rng = np.random.default_rng(seed)
    w = rand(rng, 8, 3, 3, 3)
    w[0] = 0.0
    b = rand(rng, 8)
    b[0] = 0.75
    return make_model([node("Conv", ["x", "W", "B"], ["c"], pads=[1] * 4, name="conv"),
                       node("Relu", ["c"], ["out"], name="relu")], {"W": w, "B": b},
                      {"x": SHAPE}, {"out": None})


def _feeds(scale: float, n: int = 4, seed: int = 1):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal(SHAPE) * scale).astype(np.float32)} for _ in range(n)]


def _run(ex, x: np.ndarray) -> np.ndarray:
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _dsa_and_llvm(mod: tvm.IRModule, x: np.ndarray):
    """DSA build (slow host: the tiny conv offloads) and llvm build of ``mod`` on ``x``."""
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=0.01)
    ex = tvm.compile(mod, target=dsa_tvm.target(cfg))
    rep = dsa_tvm.last_compile_report()
    return _run(ex, x), _run(tvm.compile(mod, target="llvm"), x), rep


def _inits(model) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


@pytest.mark.parametrize("scale", [1e-6, 0.0], ids=["tiny", "all_zero"])
def test_onnx_path_bias_stays_in_accumulator_units_and_dsa_matches(scale):
    m = conv_relu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all-zero calibration warns (tested elsewhere)
        qm = quantize_onnx(m, _feeds(scale), show_progress=False)
    ini = _inits(qm.model)
    want = np.float32(ini["x/scale"]) * ini["conv/W_scale"].astype(np.float32)
    np.testing.assert_array_equal(ini["conv/B_scale"], want)   # no rescale left to the compiler
    peak = np.abs(ini["conv/B_int32"].astype(np.int64)) + worst_case_sum(ini["conv/W_int8"], 0)
    assert peak.max() <= BIAS_BUDGET
    x = _feeds(scale if scale else 1e-6, n=1, seed=7)[0]["x"]
    got, llvm, rep = _dsa_and_llvm(qm.to_relax(), x)
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    step = float(ini["out/scale"])
    ort = run_onnxruntime(qm.model, {"x": x}, optimize=False)[0]
    assert np.abs(got - llvm).max() <= step * 1.001      # was 158-255 steps
    assert np.abs(got - ort).max() <= step * 1.001
    fp32 = run_onnxruntime(m, {"x": x})[0]
    assert cosine(fp32, got) > 0.99                      # was 0.567


@pytest.mark.parametrize("scale", [1e-6, 0.0], ids=["tiny", "all_zero"])
def test_relax_path_bias_fits_and_dsa_matches_llvm(scale):
    m = conv_relu()
    mod = from_onnx(m, keep_params_in_input=False)
    qmod, _ = quantize_relax(mod, _feeds(scale))
    x = _feeds(scale if scale else 1e-6, n=1, seed=7)[0]["x"]
    got, llvm, rep = _dsa_and_llvm(qmod, x)
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    step = np.abs(llvm[llvm != 0]).min() if np.any(llvm) else 1.0  # ReLU output: multiples of its scale
    assert np.abs(got - llvm).max() <= step * 1.001
    fp32 = run_onnxruntime(m, {"x": x})[0]
    assert cosine(fp32, got) > 0.99


def test_rescaled_bias_past_int32_falls_back_to_the_cpu(tmp_path):
    """A hand-written QDQ conv whose bias scale is 3e6 x input scale x weight scale: the
    rescaled bias cannot fit int32, so the conv runs on the CPU (with the reason) and the
    output is what TVM's llvm build and onnxruntime compute."""
    g = QDQGraph(0)
    rng = g.rng
    xs, ws = 0.05, rng.uniform(0.005, 0.02, 6).astype(np.float32)
    x = g.qdq("x", xs, 3)
    wd = g.weight(rng.integers(-127, 128, (6, 4, 3, 3)), ws)
    bd = g.bias(rng.integers(-2000, 2000, 6), ws * xs * 3e6)
    y = g.qdq(g.op("Conv", [x, wd, bd], pads=[1, 1, 1, 1]), 40.0, 0)
    path = g.save(tmp_path / "big_bias.onnx", {"x": (1, 4, 6, 6)}, y, (1, 6, 6, 6))
    import onnx

    model = onnx.load(path)
    xin = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    got, llvm, rep = _dsa_and_llvm(from_onnx(model, keep_params_in_input=False), xin)
    assert not [d for d in rep.regions if d.target == "dsa"], str(rep)
    reasons = " ".join(c.reason for c in rep.partition.cpu_ops)
    assert "int32 accumulator" in reasons, str(rep.partition)
    ort = run_onnxruntime(model, {"x": xin}, optimize=False)[0]
    np.testing.assert_array_equal(got, llvm)                 # was 255 steps off
    assert np.abs(got - ort).max() <= 40.0 * 1.001


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=6),
       st.floats(1e-3, 10.0), st.integers(1, 600), st.integers(0, 2 ** 16))
def test_scale_floor_keeps_every_bias_in_budget(bias, w_mag, k, seed):
    """At the floor (or any larger input scale) the int32 bias is exact (no clipping) and
    bias + the worst int8 x int8 sum stays within the budget (exact integer arithmetic)."""
    rng = np.random.default_rng(seed)
    b = np.array(bias, np.float32)
    w = (rng.standard_normal((b.size, k)) * w_mag).astype(np.float32)
    ws = weight_qparams(w, 0)
    wq = quantize_weight(w, ws, 0)
    floor = bias_input_scale_floor(b, ws, wq, 0)
    for x_scale in (max(floor, 1e-8), max(floor, 1e-8) * 3):
        bs = bias_qparams(np.float32(x_scale), ws, b.size)
        exact = np.round(b.astype(np.float64) / bs.astype(np.float64))
        bq = quantize_bias(b, bs)
        np.testing.assert_array_equal(bq.astype(np.float64), exact)
        assert (np.abs(bq.astype(np.int64)) + worst_case_sum(wq, 0)).max() <= BIAS_BUDGET * (1 + 1e-6)


def test_dead_channel_raises_its_weight_scale_not_the_input_scale():
    """A dead channel (all-zero weights, a bias) must not raise the shared input scale:
    that cost EfficientNet-Lite0 its accuracy (cosine 0.994 -> 0.739). Its own weight
    scale goes up instead (free: its weights are zero); the model stays exact on the DSA."""
    m = dead_channel_conv()
    feeds = _feeds(1.0)
    qm = quantize_onnx(m, feeds, show_progress=False)
    ini = _inits(qm.model)
    xs = np.concatenate([f["x"].ravel() for f in feeds])
    calibrated = (max(xs.max(), 0) - min(xs.min(), 0)) / 255
    assert float(ini["x/scale"]) <= calibrated * 1.0001          # not floored
    peak = np.abs(ini["conv/B_int32"].astype(np.int64)) + worst_case_sum(ini["conv/W_int8"], 0)
    assert peak.max() <= BIAS_BUDGET
    x = _feeds(1.0, n=1, seed=7)[0]["x"]
    got, llvm, rep = _dsa_and_llvm(qm.to_relax(), x)
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    step = float(ini["out/scale"])
    assert np.abs(got - llvm).max() <= step * 1.001
    assert cosine(run_onnxruntime(m, {"x": x})[0], got) > 0.99
    # the Relax path: the same rule
    qmod, _ = quantize_relax(from_onnx(m, keep_params_in_input=False), feeds)
    got_r, llvm_r, _ = _dsa_and_llvm(qmod, x)
    assert cosine(run_onnxruntime(m, {"x": x})[0], got_r) > 0.99
    assert np.abs(got_r - llvm_r).max() <= step * 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=6),
       st.floats(1e-12, 1.0), st.floats(1e-10, 1.0), st.integers(1, 600), st.integers(0, 2 ** 16))
def test_weight_scale_floor_keeps_every_bias_in_budget(bias, w_mag, x_scale, k, seed):
    """Per-channel weight scales raised to the floor keep each int32 bias exact and
    bias + the worst int8 x int8 sum within the budget (exact integer arithmetic)."""
    rng = np.random.default_rng(seed)
    b = np.array(bias, np.float32)
    w = (rng.standard_normal((b.size, k)) * w_mag).astype(np.float32)
    ws = np.maximum(weight_qparams(w, 0), bias_weight_scale_floor(b, x_scale, k))
    wq = quantize_weight(w, ws, 0)
    bs = bias_qparams(np.float32(x_scale), ws, b.size)
    bq = quantize_bias(b, bs)
    np.testing.assert_array_equal(bq.astype(np.float64), np.round(b.astype(np.float64) / bs))
    assert (np.abs(bq.astype(np.int64)) + worst_case_sum(wq, 0)).max() <= BIAS_BUDGET * (1 + 1e-6)
