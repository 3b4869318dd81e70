"""Integer softmax / LayerNorm / RMSNorm (dsa_tvm.layers.intnorm): bit-exact against an
independent scalar Python-int model of the same spec, and within a stated bound of
float64 math; the room's reference, cost and refusal; the [norm] description fields."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import load_config
from dsa_tvm.layers import intnorm as inn
from dsa_tvm.layers.ir import LayerNorm, QTensor, Region, RMSNorm, Softmax
from tir_schedules.kinds import UnsupportedLayer, recipe, room_of, run_region
from tir_schedules.kinds.norm import norm_cycles


# ----------------------------------------------------------------------------- scalar model
def _rnd(x: int, s: int) -> int:
    """Rounding half up shift right (left if s < 0), on Python ints."""
    return x << -s if s < 0 else (x + ((1 << s) >> 1)) >> s


def _fl(x: int, s: int) -> int:
    return x << -s if s < 0 else x >> s


def scalar_softmax(row: list[int], p: inn.SoftmaxParams) -> list[int]:
    qb = round(1.353 * 1024 / math.log(2))
    qc = round(0.344 / 0.3585 * (1024 / math.log(2)) ** 2)
    mx = max(row)
    ex = []
    for v in row:
        x = max(_rnd((v - mx) * p.in_mult, p.in_shift), -24 * 1024)
        z = (-x) // 1024
        pp = x + 1024 * z
        ex.append(_rnd((pp + qb) ** 2 + qc, z + 8))      # a rounding shift
    s = sum(ex)
    e = s.bit_length() - 14
    m = _fl(s, e)
    r = round(2 ** 28 / (((m >> 9) + 0.5) * 2 ** 9))
    for _ in range(2):
        r = r + ((r * ((2 ** 28 - m * r) >> 14)) >> 14)
    out = []
    for v in ex:
        y = _rnd(v * r * p.out_mult, min(28 + e + p.out_shift, 62)) + p.out_zp
        out.append(min(max(y, -128), 127))
    return out


def scalar_norm(row: list[int], zp: int, p: inn.NormParams) -> list[int]:
    """The norms' spec (isa.intnorm) in Python integers, which never overflow: the oracle
    for the int64 numpy version, and the check that its intermediates fit int64."""
    c = [v - zp for v in row]
    n = len(c)
    s1, s2 = sum(c), sum(v * v for v in c)
    if p.center:
        num, v = [n * x - s1 for x in c], n * s2 - s1 * s1 + p.eps_term
    else:
        num, v = c, s2 + p.eps_term
    assert v < 1 << 63   # what the int64 version relies on
    if v == 0:
        r, e = 0, 0
    else:
        e = (v.bit_length() - 29) >> 1
        m = _fl(v, 2 * e)
        r = round(2 ** 30 / math.sqrt(((m >> 26) + 0.5) * 2 ** 26))
        for _ in range(3):
            t = ((m * r) >> 15) * r >> 15
            r = (r * (3 * 2 ** 30 - t)) >> 31
    out = []
    for i, x in enumerate(num):
        assert abs(x * r) < 1 << 62
        u = _rnd(x * r, 14 + e)
        y = _rnd(u * int(p.gamma[i]) + int(p.beta[i]), 16 + p.frac) + p.out_zp
        out.append(min(max(y, -128), 127))
    return out


def _rows(q: np.ndarray) -> list[list[int]]:
    return [[int(v) for v in r] for r in q.reshape(-1, q.shape[-1])]


_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).flatmap(
    lambda lead: st.integers(1, 200).map(lambda n: (*lead, n)))
_scales = st.floats(1e-4, 20.0).map(float)


def _codes(seed: int, shape: tuple[int, ...], mode: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if mode == 0:
        return rng.integers(-128, 128, shape).astype(np.int8)
    if mode == 1:  # all-equal rows
        return np.broadcast_to(rng.integers(-128, 128, (*shape[:-1], 1)), shape).astype(np.int8)
    return rng.choice(np.array([-128, 127], np.int8), shape)  # saturated codes


# ----------------------------------------------------------------------------- bit exact
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=_shapes, s_in=_scales, out_zp=st.sampled_from([-128, 0]),
       seed=st.integers(0, 2 ** 16), mode=st.integers(0, 2))
def test_softmax_matches_scalar_model(shape, s_in, out_zp, seed, mode):
    q = _codes(seed, shape, mode)
    p = inn.softmax_params(s_in, 1 / 256, out_zp)
    got = inn.int_softmax(q, 0, p)
    assert got.shape == q.shape and got.dtype == np.int8
    want = [scalar_softmax(r, p) for r in _rows(q)]
    assert _rows(got) == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=_shapes, s_in=_scales, zp=st.integers(-20, 20), center=st.booleans(),
       eps=st.sampled_from([0.0, 1e-12, 1e-5, 0.1]), seed=st.integers(0, 2 ** 16),
       mode=st.integers(0, 2), s_out=st.sampled_from([1e-3, 0.02, 0.5]))
def test_norm_matches_scalar_model(shape, s_in, zp, center, eps, seed, mode, s_out):
    q = _codes(seed, shape, mode)
    n = shape[-1]
    rng = np.random.default_rng(seed + 1)
    p = inn.norm_params(n, s_in, eps, rng.normal(1, 0.3, n), rng.normal(0, 0.2, n) if center
                        else None, s_out, 3, center)
    got = inn.int_norm(q, zp, p)
    assert got.shape == q.shape and got.dtype == np.int8
    assert _rows(got) == [scalar_norm(r, zp, p) for r in _rows(q)]


# ----------------------------------------------------------------------------- vs float
def _float_softmax(q, s):
    x = s * q.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("s_in", [1e-4, 0.01, 0.1, 1.0, 50.0])
@pytest.mark.parametrize("n", [1, 7, 16, 77, 384])
def test_softmax_close_to_float(s_in, n):
    q = np.random.default_rng(n).integers(-128, 128, (6, n)).astype(np.int8)
    y = inn.int_softmax(q, 0, inn.softmax_params(s_in, 1 / 256, -128))
    prob = (y.astype(np.float64) + 128) / 256
    # one output step (1/256) plus the rounding half step covers i-exp and the reciprocal
    assert np.abs(prob - np.clip(_float_softmax(q, s_in), 0, 255 / 256)).max() <= 1.5 / 256


def test_softmax_all_equal_rows_are_uniform():
    q = np.full((2, 3, 40), 17, np.int8)
    y = inn.int_softmax(q, 5, inn.softmax_params(0.05, 1 / 256, -128))
    assert np.all(y == round(256 / 40) - 128)


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("s_in", [1e-3, 0.05, 2.0])
def test_norm_within_one_step_of_float(center, s_in):
    n = 384
    rng = np.random.default_rng(1)
    q = rng.integers(-128, 128, (8, n)).astype(np.int8)
    g, b = rng.normal(1, 0.2, n), rng.normal(0, 0.1, n)
    x = s_in * (q.astype(np.float64) - 3)
    if center:
        f = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
    else:
        f = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g
    s_out = np.abs(f).max() / 127
    y = inn.int_norm(q, 3, inn.norm_params(n, s_in, 1e-5, g, b if center else None, s_out, 0,
                                           center))
    assert np.abs(y - np.clip(np.round(f / s_out), -128, 127)).max() <= 1


def test_layernorm_constant_rows_give_beta_and_saturate():
    n = 32
    beta = np.linspace(-1, 1, n)
    p = inn.norm_params(n, 0.1, 1e-5, np.ones(n), beta, 1 / 64, 0, True)
    y = inn.int_norm(np.full((3, n), -7, np.int8), 0, p)
    assert np.array_equal(y[0], np.clip(np.round(beta * 64), -128, 127).astype(np.int8))
    big = inn.norm_params(n, 0.1, 1e-5, np.full(n, 100.0), None, 0.01, 0, True)
    q = np.arange(n, dtype=np.int8)[None]
    y = inn.int_norm(q, 0, big)
    assert y.min() == -128 and y.max() == 127


@pytest.mark.parametrize("beta_steps", [3000, 5000, 30000, -31000])
def test_an_int16_output_reaches_its_beta(beta_steps):
    """An int16 output (NORM's out_wide) takes a beta far beyond int8's reach: 5,000 steps
    is one embedding LayerNorm feature of all-MiniLM-L6-v2 on its int16 grid, which the
    int8 clip (4,096 steps) moved by 904 steps for every token."""
    n, s_in, s_out = 48, 0.01, 2e-4
    rng = np.random.default_rng(0)
    q = rng.integers(-20000, 20000, (4, n))
    x = q * s_in
    g, b = rng.normal(0, 0.05, n), np.zeros(n)
    b[7] = beta_steps * s_out
    f = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
    want = np.clip(np.round(f / s_out), -32768, 32767)
    p = inn.norm_params(n, s_in, 1e-5, g, b, s_out, 0, True, out_wide=True)
    assert np.abs(inn.int_norm(q, 0, p, out_wide=True) - want).max() <= 1
    assert np.abs(p.beta).max() <= 2 ** inn.BETA_BITS


def test_hostile_parameters_raise():
    with pytest.raises(ValueError):
        inn.softmax_params(1e12, 1 / 256, -128)  # input scale beyond the REQUANT range
    with pytest.raises(ValueError):
        inn.int_softmax(np.zeros((1, inn.MAX_ROW + 1), np.int8), 0,
                        inn.softmax_params(0.1, 1 / 256, -128))
    with pytest.raises(ValueError):
        inn.norm_params(8, 0.1, 1e-5, np.full(8, np.inf), None, 0.1, 0, False)
    with pytest.raises(ValueError):
        inn.norm_params(8, 0.1, 1e-5, np.full(8, 1e12), None, 1e-3, 0, False)


# ----------------------------------------------------------------------------- room, config
def _layers(shape):
    t_in, t_out = QTensor("x", shape, 0.05, 0), QTensor("y", shape, 1 / 256, -128)
    n = shape[-1]
    sm = Softmax("sm", t_in, t_out, inn.softmax_params(0.05, 1 / 256, -128))
    ln = LayerNorm("ln", t_in, QTensor("y", shape, 0.03, 0),
                   inn.norm_params(n, 0.05, 1e-5, np.ones(n), np.zeros(n), 0.03, 0, True))
    rms = RMSNorm("rms", t_in, QTensor("y", shape, 0.03, 0),
                  inn.norm_params(n, 0.05, 1e-5, np.ones(n), None, 0.03, 0, False))
    return sm, ln, rms


def test_room_reference_cost_and_refusal():
    shape = (1, 2, 5, 24)
    q = np.random.default_rng(0).integers(-128, 128, shape).astype(np.int8)
    cfg = load_config("default").replace(norm_units=0)
    for ly in _layers(shape):
        assert room_of(ly).name == "norm"
        out = run_region(Region("r", [ly.input], [ly.output], [ly]), {"x": q})["y"]
        want = (inn.int_softmax(q, 0, ly.params) if isinstance(ly, Softmax)
                else inn.int_norm(q, 0, ly.params))
        assert np.array_equal(out, want)
        with pytest.raises(UnsupportedLayer, match="no \\[norm\\] units"):
            recipe(ly, cfg)
        with pytest.raises(ValueError):
            norm_cycles(cfg, ly)
        two = cfg.replace(norm_units=2)
        with pytest.raises(UnsupportedLayer, match="NCHW image"):  # 4-D: rows view needed
            recipe(ly, two)
        passes = 3 if isinstance(ly, Softmax) else 2
        per_row = passes * math.ceil(24 / two.norm_elements_per_cycle) + two.norm_row_latency_cycles
        assert norm_cycles(two, ly) == 5 * per_row  # 10 rows over 2 units


def test_norm_units_change_the_fingerprint():
    cfg = load_config("default").replace(norm_units=0)
    assert cfg.replace(norm_units=1).fingerprint != cfg.fingerprint
