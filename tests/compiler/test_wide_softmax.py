"""Attention probabilities on int16 (``quant.api.SOFTMAX_OUT_WIDE``): the softmax writes
int16 codes (NORM's ``out_wide``) and P @ V runs as two byte planes
(``relay_passes.kinds.matmul_planes``), in one launch, bit-exact against the integer
reference, closer to onnxruntime's float softmax than the int8 probabilities are; the
tiles of V made once for both planes; what the planes cannot take stays on the CPU with
the reason."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import helper

from dsa_tvm.layers.ir import BatchMatmul
from dsa_tvm.quant.api import SOFTMAX_OUT, SOFTMAX_OUT_WIDE

from .test_dense_planes import _one_launch_bit_exact, _ort, _run
from .test_wide_mul import _model, _qdq
from .test_wide_output import _compile

S_STEP, V_STEP = 0.06, 0.02


def _attention(b: int, m: int, k: int, n: int, y_step: float, wide: bool = True,
               p_zp: int = 0, v16: bool = False, v_step: float = V_STEP) -> onnx.ModelProto:
    """s (scores) -> Q/DQ int8 -> Softmax -> Q/DQ int16 (or int8) -> MatMul with v (Q/DQ
    int8, or int16 with ``v16``, zero point 0) -> Q/DQ int8."""
    p = SOFTMAX_OUT_WIDE if wide else SOFTMAX_OUT
    inits: dict = {}
    nodes = (_qdq("s", "int8", S_STEP, 0, inits)
             + [helper.make_node("Softmax", ["sd"], ["p"], axis=-1)]
             + _qdq("p", "int16" if wide else "int8", p.scale, p_zp if wide else p.zero_point,
                    inits)
             + _qdq("v", "int16" if v16 else "int8", v_step, 0, inits)
             + [helper.make_node("MatMul", ["pd", "vd"], ["o"])]
             + _qdq("o", "int8", y_step, 0, inits)
             + [helper.make_node("Identity", ["od"], ["y"])])
    return _model(nodes, inits, {"s": (b, m, k), "v": (b, k, n)}, (b, m, n), "attention")


def _inputs(b: int, m: int, k: int, n: int, seed: int, spread: float = 2.0):
    rng = np.random.default_rng(seed)
    s = np.clip(rng.normal(0, spread, (b, m, k)), -7, 7).astype(np.float32)
    s[..., 0] += 3                                         # a sink-like score
    v = np.clip(rng.normal(0, 0.8, (b, k, n)), -2.5, 2.5).astype(np.float32)
    return s, v


def _bit_exact_and_near_ort(ex, rep, model, dims, seed: int, spread: float) -> None:
    """One launch bit-exact against the integer reference, and within the float softmax's
    reach of onnxruntime: the i-exp's error on the probabilities (a few 1e-3 at most,
    times sum |v|) and the output's rounding; the planes themselves cost 1/256 of a step."""
    s, v = _inputs(*dims, seed, spread)
    got = _one_launch_bit_exact(ex, rep, s, v)
    ref = _ort(model, s=s, v=v)
    k = dims[2]
    bound = V_STEP * 1.6 + 4e-3 * np.abs(v).max() + 1e-3 * np.abs(v).max() * min(k, 64) / 8
    assert np.abs(got - ref).max() <= bound, (np.abs(got - ref).max(), bound)


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 3), m=st.integers(1, 5), k=st.one_of(st.integers(1, 40),
                                                              st.integers(41, 600)),
       n=st.sampled_from([16, 32, 64]), seed=st.integers(0, 2 ** 16),
       spread=st.sampled_from([0.3, 2, 6]))
@example(b=3, m=3, k=512, n=64, seed=0, spread=0.3)     # SmolLM2's decode at context 512
def test_int16_probabilities_run_in_one_launch_as_byte_planes(b, m, k, n, seed, spread):
    """(V's lane axis whole blocks: on-device weight tiles need it, int8 or not.)"""
    model = _attention(b, m, k, n, V_STEP)
    ex, rep = _compile(model)
    layers = rep.regions[0].region.layers
    kinds = [type(ly).__name__ for ly in layers]
    assert kinds == ["Softmax", "Permute", "BatchMatmul"], kinds
    soft, tiles, mm = layers
    assert soft.planes and soft.output.dtype == "int8" and mm.planes   # the fused planes
    assert soft.output.shape[-2] == 2 * m and mm.b.name == tiles.output.name
    _bit_exact_and_near_ort(ex, rep, model, (b, m, k, n), seed, spread)


def test_int16_probabilities_beat_int8_ones_against_the_float_softmax():
    """Rows of 512 flat scores: with int8 probabilities P @ V drifts (weights near 1/512
    round to 0 or 1/256); with int16 ones the DSA's output stays within a step or two of
    the float attention."""
    b, m, k, n = 2, 3, 512, 32
    s, v = _inputs(b, m, k, n, 5, spread=0.4)
    d = np.round(s / S_STEP) * S_STEP
    e = np.exp(d - d.max(-1, keepdims=True))
    exact = (e / e.sum(-1, keepdims=True)) @ (np.round(v / V_STEP) * V_STEP)
    err = {}
    for wide in (False, True):
        ex, rep = _compile(_attention(b, m, k, n, 2e-3, wide))
        assert [r.target for r in rep.regions] == ["dsa"]
        err[wide] = float(np.sqrt(((_run(ex, s, v) - exact) ** 2).mean()))
    assert err[True] < 0.5 * err[False], err
    assert err[True] < 2e-3, err


@settings(max_examples=6, deadline=None)
@given(b=st.integers(1, 3), m=st.integers(1, 4), k=st.integers(1, 600),
       n=st.sampled_from([16, 64]), seed=st.integers(0, 2 ** 16),
       spread=st.sampled_from([0.3, 2, 6]))
@example(b=3, m=3, k=512, n=64, seed=0, spread=0.3)
def test_int16_v_runs_its_planes_against_the_probabilities_planes(b, m, k, n, seed, spread):
    """V on an int16 grid (256 times finer) too: the softmax writes its planes once and one
    planes matmul per plane of V joins them exactly, the two products on grids spanning
    twice the output's range joined by one add; one launch, bit-exact, as close to
    onnxruntime as int8 V is (V's own rounding gone)."""
    model = _attention(b, m, k, n, V_STEP, v16=True, v_step=V_STEP / 256)
    ex, rep = _compile(model)
    layers = rep.regions[0].region.layers
    kinds = [type(ly).__name__ for ly in layers]
    assert kinds.count("BatchMatmul") == 2 and kinds[0] == "Softmax", kinds
    assert layers[0].planes and all(ly.planes for ly in layers if isinstance(ly, BatchMatmul))
    _bit_exact_and_near_ort(ex, rep, model, (b, m, k, n), seed, spread)


def test_what_the_planes_cannot_take_stays_on_the_cpu():
    model = _attention(1, 2, 24, 8, V_STEP, p_zp=7)
    ex, rep = _compile(model)
    reason = "an int16 operand with zero point 7"
    assert not any(isinstance(ly, BatchMatmul) for r in rep.regions if r.target == "dsa"
                   for ly in r.region.layers)
    assert reason in str(rep)
    s, v = _inputs(1, 2, 24, 8, 1)
    np.testing.assert_allclose(_run(ex, s, v), _ort(model, s=s, v=v), atol=1e-5)
