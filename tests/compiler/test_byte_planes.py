"""The byte-plane layers of a W8A16 dense on their own (``layers.ir.BytePlanes``, the
``planes`` room; ``Dense.planes``, the conv room's join): bit-exact on every preset over
ranks, rows, widths off the block and saturating codes; the split's estimate is its
simulated cycles; the physics bounds (every code read and written once); the refusals
name their cause."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers import ir as L
from dsa_tvm.layers.reference import join_planes_shifted, split_planes, stacked_byte_planes
from dsa_tvm.lowering.region import compile_region, lowering_supports
from tir_schedules.kinds.planes import estimate_planes_cycles

from .test_lowering import CFGS, check, region


def _planes(lead: tuple[int, ...], m: int, k: int) -> L.BytePlanes:
    x = L.QTensor("x", (*lead, m, k), 1e-3, 0, "int16")
    return L.BytePlanes("bp", x, L.QTensor("p", (*lead, 2 * m, k), 1e-3, 0))


def _codes(rng, shape) -> np.ndarray:
    """int16 codes with the ends of the range (the split saturates from 32640) mixed in."""
    x = rng.integers(-32768, 32768, shape).astype(np.int16)
    x.flat[: min(x.size, 4)] = (32767, -32768, 32639, 32640)[: min(x.size, 4)]
    return x


_LEAD = st.sampled_from([(), (1,), (3,)])


@pytest.mark.parametrize("preset", list(CFGS))
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(lead=_LEAD, m=st.integers(1, 300), k=st.integers(1, 200), seed=st.integers(0, 2**31))
@example(lead=(1,), m=511, k=1536, seed=0)                 # SmolLM2's down_proj, prefill
def test_byte_planes_are_bit_exact_and_cost_what_they_estimate(preset, lead, m, k, seed):
    cfg = CFGS[preset]
    ly = _planes(lead, m, k)
    if lowering_supports(ly, cfg):       # a 1,536-code row on edge's accumulator
        assert cfg.name == "edge", lowering_supports(ly, cfg)
        return
    rng = np.random.default_rng(seed)
    x = _codes(rng, ly.input.shape)
    reg = region([ly.input], [ly])
    res = check(reg, cfg, rng, xs={"x": x})
    planes = stacked_byte_planes(x).astype(np.int64)
    hi, lo = planes[..., :m, :], planes[..., m:, :]
    np.testing.assert_array_equal(256 * hi + lo, np.minimum(x, 32639))   # x rebuilt
    plan = compile_region(reg, cfg).plans[0]
    assert res.counters["cycles"] == estimate_planes_cycles(cfg, plan.shape, plan.knobs)
    codes = x.size
    assert res.counters["dram_read_bytes"] >= 2 * codes        # each int16 code once
    assert res.counters["dram_write_bytes"] >= 2 * codes       # and as two int8 codes
    assert res.counters["cycles"] >= 4 * codes / cfg.bandwidth_bytes_per_cycle


@pytest.mark.parametrize("preset", list(CFGS))
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(lead=_LEAD, m=st.integers(1, 40), k=st.integers(1, 130), n=st.integers(1, 70),
       bias=st.booleans(), lo_shift=st.integers(0, 8), seed=st.integers(0, 2**31))
def test_a_plane_dense_joins_its_planes_bit_exactly(preset, lead, m, k, n, bias, lo_shift,
                                                    seed):
    """BytePlanes then the plane dense in one program (several row and channel tiles, each
    with both planes of its rows); the join is ``(acc_hi << (8 - lo_shift)) +
    rshift_round(acc_lo, lo_shift)``."""
    cfg = CFGS[preset]
    rng = np.random.default_rng(seed)
    bp = _planes(lead, m, k)
    w = rng.integers(-127, 128, (n, k), dtype=np.int8)
    b = rng.integers(-5000, 5000, n).astype(np.int32) if bias else np.zeros(n, np.int32)
    mult, shift = sem.quantize_multipliers(rng.uniform(0.001, 0.05, n))
    y = L.QTensor("y", (*lead, m, n), 0.05, 0, "int16")
    d = L.Dense("d", bp.output, y, w, b, L.Requant(mult, shift, 0, L.WIDE_CLIP), planes=True,
                lo_shift=lo_shift)
    check(region([bp.input], [bp, d]), cfg, rng, xs={"x": _codes(rng, bp.input.shape)})


def test_the_join_shifts_hi_left_and_rounds_the_lo_sums_half_up():
    acc = np.array([[10, -3], [128, -129]], np.int64)                     # rows: hi, lo
    np.testing.assert_array_equal(join_planes_shifted(acc, 8), [[11, -4]])
    np.testing.assert_array_equal(join_planes_shifted(acc, 0), [[2688, -897]])   # exact
    np.testing.assert_array_equal(join_planes_shifted(acc, 3), [[336, -112]])
    big = np.array([[2**31 - 1], [128]], np.int64)                        # int32 wraps
    assert join_planes_shifted(big, 8)[0, 0] == sem.wrap_int32(2**31)


def test_split_planes_on_int16_codes_is_the_definition_for_every_code():
    """The int32 fast path the host takes for an int16 cache (each decode step splits the
    whole cache) against the definition, ``hi = clamp(rshift_round(y, 8))``, ``lo =
    clamp(y - 256 hi)``, on every int16 code: saturation from 32640 up included."""
    y = np.arange(-32768, 32768, dtype=np.int64)
    hi = np.clip(sem.rshift_round(y, 8), -128, 127)
    lo = np.clip(y - 256 * hi, -128, 127)
    for codes in (y.astype(np.int16), y.astype(np.int16).reshape(16, 64, 64)):
        got_hi, got_lo = split_planes(codes)
        np.testing.assert_array_equal(got_hi.reshape(-1), hi)
        np.testing.assert_array_equal(got_lo.reshape(-1), lo)
    assert split_planes(np.array([32767], np.int16))[1][0] == 127     # saturated: 32639


def test_refusals_name_the_cause():
    cfg = CFGS["default"]
    x8 = L.QTensor("x", (4, 16), 1e-3, 0)
    assert "int16 codes with zero point 0" in lowering_supports(
        L.BytePlanes("bp", x8, L.QTensor("p", (8, 16), 1e-3, 0)), cfg)
    empty = L.QTensor("x", (0, 16), 1e-3, 0, "int16")
    assert "empty tensor" in lowering_supports(
        L.BytePlanes("bp", empty, L.QTensor("p", (0, 16), 1e-3, 0)), cfg)
    x = L.QTensor("x", (4, 16), 1e-3, 0, "int16")
    assert "(..., 2M, K)" in lowering_supports(
        L.BytePlanes("bp", x, L.QTensor("p", (4, 32), 1e-3, 0)), cfg)
    odd = L.QTensor("p", (5, 16), 1e-3, 0)
    y = L.QTensor("y", (2, 8), 0.05, 0)
    d = L.Dense("d", odd, y, np.ones((8, 16), np.int8), np.zeros(8, np.int32),
                L.Requant(np.array([1 << 30]), np.array([31]), 0, (-128, 127)), planes=True)
    assert "even rows axis" in lowering_supports(d, cfg)
