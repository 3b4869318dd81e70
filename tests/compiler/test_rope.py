"""Rotary position embedding on the vector unit (``tir_schedules.kinds.rope``): compiled,
simulated and compared bit for bit with the integer reference on every preset (partial
tiles, one or many positions, zero points, tables up to the int32 wrap), and the integer
definition against float RoPE on real cos/sin tables. The front end does not produce the
layer yet (issue 13: Llama's RoPE); this is the device side it will lower to."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers import ir as L
from dsa_tvm.lowering.region import compile_region, lowering_supports
from tir_schedules.kinds.rope import run_rope

from .test_lowering import CFGS, FEW, PRESETS, check, qt, region, requant

FRAC = 14


def _rope(rng, shape, cos, sin, rq) -> L.Rope:
    x = qt(rng, "x", shape)
    y = L.QTensor("y", shape, 0.05, rq.zero_point)
    return L.Rope("rope", x, y, cos.astype(np.int32), sin.astype(np.int32), rq)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_rope_bit_exact(preset, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = cfg.block_out * draw(st.sampled_from([2, 4]))
    p = draw(st.integers(1, 20))
    lead = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=1)))  # rows views
    big = draw(st.booleans())   # tables near the int32 wrap: both sides wrap alike
    hi = 2**23 if big else 2**FRAC
    cos, sin = (rng.integers(-hi, hi, (p, d)) for _ in range(2))
    rq = requant(rng, d, 1.0 / (64 * 2**FRAC))
    ly = _rope(rng, (*lead, p, d), cos, sin, rq)
    assert lowering_supports(ly, cfg) is None
    check(region([ly.input], [ly]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_int16_rope_bit_exact_and_close_to_float(preset, data):
    """int16 codes in (zero point 0) and int16 or int8 out (an LLM's Q and K on int16
    grids): the simulator against the integer reference, both ends of the code range, and
    the integer result within two int16 output steps (one int8) of float RoPE on real
    tables."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = cfg.block_out * draw(st.sampled_from([2, 4]))
    p = draw(st.integers(1, 12))
    ang = np.arange(p)[:, None] * (1.0 / 10000 ** (np.arange(0, d, 2) / d))[None, :]
    ang = np.concatenate([ang, ang], -1)
    sign = np.concatenate([-np.ones(d // 2), np.ones(d // 2)])
    cos, sin = np.round(np.cos(ang) * 2**FRAC), np.round(np.sin(ang) * sign * 2**FRAC)
    out16 = draw(st.booleans())
    sx = 1e-3
    sy = sx * (1.0 if out16 else 300.0)
    m, s = sem.quantize_multiplier(sx / (sy * 2**FRAC))
    rq = L.Requant(np.array([m], np.int32), np.array([s], np.int32), 0,
                   L.WIDE_CLIP if out16 else (-128, 127))
    x = L.QTensor("x", (2, p, d), sx, 0, "int16")
    y = L.QTensor("y", (2, p, d), sy, 0, "int16" if out16 else "int8")
    ly = L.Rope("rope", x, y, cos.astype(np.int32), sin.astype(np.int32), rq)
    assert lowering_supports(ly, cfg) is None
    codes = rng.integers(-32768, 32768, (2, p, d)).astype(np.int16)
    codes.reshape(-1)[:2] = (-32768, 32767)
    got = check(region([x], [ly]), cfg, rng, xs={"x": codes})
    assert got is not None
    xf = codes.astype(np.float64) * sx
    rot = np.concatenate([-xf[..., d // 2:], xf[..., :d // 2]], -1)
    bound = 32767 if out16 else 127
    want = np.clip(np.round((xf * np.cos(ang) + rot * np.sin(ang)) / sy), -bound - 1,
                   bound)
    # the tables' 2^-14 rounding on int16 codes: 2 x 32768 x 2^-15 = 2 int16 steps at most
    assert np.abs(run_rope(ly, {"x": codes}).astype(np.float64) - want).max() <= (
        2 if out16 else 1)
    shifted = L.Rope("rope", L.QTensor("x", (2, p, d), sx, 3, "int16"), y, ly.cos, ly.sin, rq)
    assert "zero point 3" in lowering_supports(shifted, cfg)


def test_rope_matches_float_rotary_embedding():
    """Real tables (2^14 fixed point): the integer result within one output step of float
    ``x * cos + rotate_half(x) * sin`` on the dequantized codes."""
    rng = np.random.default_rng(3)
    p, d = 12, 32
    inv = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    ang = np.arange(p)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], -1)
    cos_f, sin_f = np.cos(ang), np.sin(ang)
    sign = np.concatenate([-np.ones(d // 2), np.ones(d // 2)])
    cos = np.round(cos_f * 2**FRAC)
    sin = np.round(sin_f * sign * 2**FRAC)
    sx, sy, zx, zy = 0.04, 0.05, 3, -2
    m, s = sem.quantize_multiplier(sx / (sy * 2**FRAC))
    rq = L.Requant(np.array([m], np.int32), np.array([s], np.int32), zy)
    x = L.QTensor("x", (2, p, d), sx, zx)
    ly = L.Rope("rope", x, L.QTensor("y", (2, p, d), sy, zy), cos.astype(np.int32),
                sin.astype(np.int32), rq)
    codes = rng.integers(-128, 128, (2, p, d), dtype=np.int8)
    got = run_rope(ly, {"x": codes}).astype(np.float64)
    xf = (codes.astype(np.float64) - zx) * sx
    half = d // 2
    rot = np.concatenate([-xf[..., half:], xf[..., :half]], -1)
    want = np.clip(np.round((xf * cos_f + rot * sin_f) / sy) + zy, -128, 127)
    assert np.abs(got - want).max() <= 1


@pytest.mark.parametrize("preset", PRESETS)
def test_rope_refuses_lane_moves_and_images(preset):
    cfg = CFGS[preset]
    rng = np.random.default_rng(0)
    d = cfg.block_out        # half a row is half a block: the swap would move lanes
    ly = _rope(rng, (2, 4, d), np.ones((4, d)), np.ones((4, d)), requant(rng, d, 1e-3))
    why = lowering_supports(ly, cfg)
    assert why is not None and "whole number" in why
    with pytest.raises(ValueError):
        compile_region(region([ly.input], [ly]), cfg)
    image = _rope(rng, (1, 2, 4, 2 * d), np.ones((4, 2 * d)), np.ones((4, 2 * d)),
                  requant(rng, 2 * d, 1e-3))
    assert "NCHW image" in lowering_supports(image, cfg)
