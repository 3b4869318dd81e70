"""``dsa_tvm.isa.semantics`` against hand-computed values and Python integer arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.isa import semantics as sem
from dsa_tvm.isa.instructions import AluOp

from .reference_machine import (
    low_byte_signed,
    output_stage_py,
    requant_imm_fields,
    requant_py,
    rshift_round_py,
    wrap32,
)

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)


# ----------------------------------------------------------------------------- wrap / saturate

def test_wrap_int32_hand_values():
    x = np.array([0, 1 << 31, (1 << 32) + 5, -(1 << 31) - 1, (1 << 31) - 1, -(1 << 40) - 3])
    got = sem.wrap_int32(x)
    assert got.dtype == np.int32
    assert got.tolist() == [0, -(1 << 31), 5, (1 << 31) - 1, (1 << 31) - 1, -3]


@settings(max_examples=200, deadline=None)
@given(st.integers(-(1 << 62), 1 << 62))
def test_wrap_int32_matches_python(v):
    assert int(sem.wrap_int32(np.array([v]))[0]) == wrap32(v)


def test_saturate():
    assert sem.saturate(np.array([-300, -128, 0, 127, 300]), -128, 127).tolist() == [
        -128, -128, 0, 127, 127]


# ----------------------------------------------------------------------------- rshift_round

@pytest.mark.parametrize("x,s,want", [
    (5, 1, 3),      # 2.5 -> 3 (half up)
    (-5, 1, -2),    # -2.5 -> -2 (half up, not away from zero)
    (3, 1, 2),
    (-3, 1, -1),
    (4, 1, 2),
    (7, 2, 2),      # 1.75 -> 2
    (6, 2, 2),      # 1.5 -> 2
    (-6, 2, -1),    # -1.5 -> -1
    (-7, 2, -2),    # -1.75 -> -2
    (123, 0, 123),
    (-123, 0, -123),
    (3, -2, 12),    # negative shift: left
    (-3, -4, -48),
    (1, -31, 1 << 31),
    ((1 << 31) - 1, 62, 0),
    (-(1 << 31), 32, 0),         # -0.5 -> 0
    (-(1 << 31) - 1, 32, -1),    # just below -0.5 -> -1
])
def test_rshift_round_hand_values(x, s, want):
    assert int(sem.rshift_round(np.int64(x), s)) == want


@settings(max_examples=300, deadline=None)
@given(st.integers(-(1 << 62), 1 << 62), st.integers(0, 62))
def test_rshift_round_right_matches_python(x, s):
    assert int(sem.rshift_round(np.array([x]), np.array([s]))[0]) == rshift_round_py(x, s)


@settings(max_examples=300, deadline=None)
@given(INT32, st.integers(-200, 200))
def test_rshift_round_any_shift_int32_result(x, s):
    """On int32 inputs any shift (including beyond the clamp range) gives the exact int32
    result of x * 2**-s rounded half up."""
    got = int(sem.wrap_int32(sem.rshift_round(np.array([x]), np.array([s])))[0])
    assert got == wrap32(rshift_round_py(x, s))


def test_rshift_round_vectorized_mixed_shifts():
    x = np.array([5, 5, 5, -5, 1 << 20], dtype=np.int64)
    s = np.array([1, 0, -1, 1, 70], dtype=np.int64)
    assert sem.rshift_round(x, s).tolist() == [3, 5, 10, -2, 0]


# ----------------------------------------------------------------------------- requantize

def test_requantize_hand_values():
    acc = np.array([3, -3, 5, -5, 1000, -1000, 0, 255])
    got = sem.requantize(acc, 1, 1, 0)
    assert got.dtype == np.int32
    assert got.tolist() == [2, -1, 3, -2, 127, -128, 0, 127]
    # zero point added after rounding, before saturation
    assert sem.requantize(np.array([250, -250, 3]), 1, 1, -10).tolist() == [115, -128, -8]
    # mult 3 * 2**-2: 10 * 0.75 = 7.5 -> 8; -10 -> -7.5 -> -7
    assert sem.requantize(np.array([10, -10]), 3, 2, 0).tolist() == [8, -7]


def test_requantize_per_lane_broadcast():
    acc = np.array([[100, 100, 100]])
    got = sem.requantize(acc, np.array([1, 3, 1 << 30]), np.array([0, 1, 31]), 1)
    # 100 -> 101, 150 -> 127 (saturates), 100 * 2**30 / 2**31 = 50 -> 51
    assert got.tolist() == [[101, 127, 51]]


@settings(max_examples=300, deadline=None)
@given(INT32, INT32, st.integers(0, 62), st.integers(-128, 127))
def test_requantize_matches_python(acc, mult, shift, zp):
    assert int(sem.requantize(np.array([acc]), mult, shift, zp)[0]) == requant_py(
        acc, mult, shift, zp)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 62), st.integers(-128, 127),
       st.integers(-128, 127), st.integers(-128, 127), st.booleans())
def test_requantize_per_lane_arrays_match_python(seed, top_shift, zp, b1, b2, full_range):
    """Tiles of accumulators with a multiplier and a shift per lane (the simulator's
    shape), full-range or typical values, shifts on both sides of the folded path's
    limit (``FOLD_SHIFT_MAX``), every clamp."""
    rng = np.random.default_rng(seed)
    lo, hi = min(b1, b2), max(b1, b2)
    acc = (rng.integers(-(1 << 31), 1 << 31, (3, 5, 8)) if full_range
           else rng.integers(-5000, 5000, (3, 5, 8))).astype(np.int32)
    mult = rng.integers(-(1 << 31) if full_range else 1 << 30, 1 << 31, 8).astype(np.int32)
    shift = rng.integers(0, top_shift + 1, 8).astype(np.int32)
    got = sem.requantize(acc, mult, shift, zp, lo, hi)
    want = [[[requant_py(int(a), int(m), int(s), zp, lo, hi)
              for a, m, s in zip(row, mult, shift)] for row in tile] for tile in acc]
    assert got.dtype == np.int32 and got.tolist() == want


def test_requantize_clamp_bounds_hand_values():
    acc = np.array([3, -3, 5, -5, 1000, -1000, 0, 255])
    # ReLU at zero point 0: lo = 0
    assert sem.requantize(acc, 1, 1, 0, 0, 127).tolist() == [2, 0, 3, 0, 127, 0, 0, 127]
    # ReLU6 with scale 1/2: lo = zp = -5, hi = zp + 6 / 0.5 = 7
    assert sem.requantize(acc, 1, 1, -5, -5, 7).tolist() == [-3, -5, -2, -5, 7, -5, -5, 7]
    # a clamp tighter than int8 on both sides, after the zero point is added
    assert sem.requantize(np.array([40, -40, 10]), 1, 2, 100, 90, 105).tolist() == [105, 90, 103]


def test_output_stage_hand_values():
    acc = np.array([[10, -10, 0, (1 << 31) - 1]])
    bias = np.array([5, 5, -7, 1])                    # the last lane wraps to -2**31
    mult = np.array([1, 3, 1, 1])
    shift = np.array([1, 2, 0, 31])
    got = sem.output_stage(acc, bias, mult, shift, 4, -128, 127)
    # 15/2 = 7.5 -> 8 (+4 = 12); -5*3/4 = -3.75 -> -4 (+4 = 0); -7 + 4 = -3;
    # (-2**31) / 2**31 = -1 (+4 = 3)
    assert got.dtype == np.int32
    assert got.tolist() == [[12, 0, -3, 3]]
    # ReLU (lo = zp) and ReLU6-style hi in the same pass
    assert sem.output_stage(np.array([100, -100, 4]), 0, 1, 0, -3, -3, 20).tolist() == [
        20, -3, 1]


@settings(max_examples=300, deadline=None)
@given(INT32, INT32, INT32, st.integers(0, 62), st.integers(-128, 127), st.integers(-128, 127),
       st.integers(-128, 127))
def test_output_stage_matches_python(acc, bias, mult, shift, zp, b1, b2):
    lo, hi = min(b1, b2), max(b1, b2)
    got = int(sem.output_stage(np.array([acc]), bias, mult, shift, zp, lo, hi)[0])
    assert got == output_stage_py(acc, bias, mult, shift, zp, lo, hi)
    assert lo <= got <= hi


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(1, 3), st.integers(1, 40), st.integers(0, sem.FOLD_SHIFT_MAX),
       st.integers(-128, 127), st.booleans())
def test_output_stage_int32_is_the_output_stage(data, rows, lanes, top_shift, zp, wide):
    """The simulator's REQUANT fast path (int32 rows, shifts checked in 0..FOLD_SHIFT_MAX)
    is :func:`output_stage` lane for lane, int32 wrap-around and saturation included."""
    ints = st.integers(sem.INT32_MIN, sem.INT32_MAX)
    acc, bias, mult = (np.array(data.draw(st.lists(ints, min_size=rows * lanes,
                                                   max_size=rows * lanes)),
                                np.int32).reshape(rows, lanes) for _ in range(3))
    shift = np.array(data.draw(st.lists(st.integers(0, top_shift), min_size=lanes,
                                        max_size=lanes)), np.int32)
    lo, hi = (sem.INT16_MIN, sem.INT16_MAX) if wide else (-128, 127)
    got = sem.output_stage_int32(acc, bias, mult, np.broadcast_to(shift, acc.shape), zp, lo, hi)
    want = sem.output_stage(acc, bias, mult, shift, zp, lo, hi)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int32


# ----------------------------------------------------------------------------- REQUANT immediate

@pytest.mark.parametrize("zp,lo,hi,want", [
    (0, -128, 127, 0x7F8000),
    (0, 0, 127, 0x7F0000),
    (-1, -1, -1, 0xFFFFFF),
    (5, -3, 6, 0x06FD05),
    (-128, -128, -128, 0x808080),
])
def test_requant_imm_hand_values(zp, lo, hi, want):
    assert sem.pack_requant_imm(zp, lo, hi) == want
    assert sem.split_requant_imm(want) == (zp, lo, hi)
    assert requant_imm_fields(want) == (zp, lo, hi)


@settings(max_examples=200, deadline=None)
@given(st.integers(-128, 127), st.integers(-128, 127), st.integers(-128, 127))
def test_requant_imm_round_trip(zp, b1, b2):
    lo, hi = min(b1, b2), max(b1, b2)
    imm = sem.pack_requant_imm(zp, lo, hi)
    assert 0 <= imm < (1 << 24)                      # bits 24-31 zero; fits the signed field
    assert sem.split_requant_imm(imm) == (zp, lo, hi)


@pytest.mark.parametrize("args,msg", [
    ((128, -128, 127), "zero point must be int8"),
    ((-129, -128, 127), "zero point must be int8"),
    ((0, -129, 127), "lo must be int8"),
    ((0, 0, 128), "hi must be int8"),
    ((0, 10, 9), "lo 10 > hi 9"),
])
def test_pack_requant_imm_range_checks(args, msg):
    with pytest.raises(ValueError, match=msg):
        sem.pack_requant_imm(*args)


@pytest.mark.parametrize("imm", [1 << 25, 0x7F000000, -1, -(1 << 31), 0x12345678])
def test_split_requant_imm_rejects_reserved_bits(imm):
    with pytest.raises(ValueError, match="bits 25-31"):
        sem.split_requant_imm(imm)


# ----------------------------------------------------------------------------- quantize_multiplier

@pytest.mark.parametrize("scale,want", [
    (1.0, (1 << 30, 30)),
    (0.5, (1 << 30, 31)),
    (0.75, (3 << 29, 31)),
    (2.0, (1 << 30, 29)),
    (0.25, (1 << 30, 32)),
])
def test_quantize_multiplier_hand_values(scale, want):
    assert sem.quantize_multiplier(scale) == want


def test_quantize_multiplier_rounds_up_to_next_power():
    # the mantissa rounds to 2**31: the multiplier is halved and the shift reduced
    mult, shift = sem.quantize_multiplier(1.0 - 2.0 ** -40)
    assert (mult, shift) == (1 << 30, 30)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=2.0 ** -31, max_value=2.0 ** 30, allow_nan=False))
def test_quantize_multiplier_accuracy(scale):
    mult, shift = sem.quantize_multiplier(scale)
    assert (1 << 30) <= mult < (1 << 31)
    assert 0 <= shift <= 62
    approx = math.ldexp(mult, -shift)
    assert abs(approx - scale) <= scale * 2.0 ** -31     # half an ulp of a 31-bit mantissa


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=1e-30, max_value=2.0 ** -33, allow_nan=False))
def test_quantize_multiplier_tiny_scales_clamp_shift(scale):
    mult, shift = sem.quantize_multiplier(scale)
    assert shift == 62
    assert 0 <= mult < (1 << 31)
    assert abs(math.ldexp(mult, -62) - scale) <= 2.0 ** -62


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=1e-6, max_value=100.0), INT32)
def test_quantize_multiplier_requantize_close_to_real_scale(scale, acc):
    mult, shift = sem.quantize_multiplier(scale)
    got = int(sem.requantize(np.array([acc]), mult, shift, 0)[0])
    real = max(-128.0, min(127.0, acc * scale))
    assert abs(got - real) <= 0.5 + abs(acc) * scale * 2.0 ** -30 + 1e-9


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), 2.0 ** 31, 1e12])
def test_quantize_multiplier_rejects_bad_scales(scale):
    with pytest.raises(ValueError):
        sem.quantize_multiplier(scale)


# ----------------------------------------------------------------------------- clip immediates

@settings(max_examples=200, deadline=None)
@given(st.integers(-32768, 32767), st.integers(-32768, 32767))
def test_clip_immediate_round_trip(lo, hi):
    imm = sem.pack_clip_imm(lo, hi)
    assert -(1 << 31) <= imm < (1 << 31)                 # fits the signed 32-bit field
    assert sem.split_clip_imm(imm) == (lo, hi)


# ----------------------------------------------------------------------------- alu_apply

def test_alu_apply_hand_values():
    a = np.array([10, -10, (1 << 31) - 1], dtype=np.int64)
    b = np.array([3, 3, 1], dtype=np.int64)
    d = np.array([1, 2, 3], dtype=np.int64)

    def ap(op, **kw):
        return sem.alu_apply(op, d, a, b, **kw).tolist()

    assert ap(AluOp.MOV) == [3, 3, 1]
    assert ap(AluOp.ADD) == [13, -7, -(1 << 31)]
    assert ap(AluOp.SUB) == [7, -13, (1 << 31) - 2]
    assert ap(AluOp.MUL) == [30, -30, (1 << 31) - 1]
    assert ap(AluOp.MAC) == [31, -28, -(1 << 31) + 2]
    assert ap(AluOp.MIN) == [3, -10, 1]
    assert ap(AluOp.MAX) == [10, 3, (1 << 31) - 1]
    assert ap(AluOp.SHR) == [1, -1, 1 << 30]            # 1.25 -> 1, -1.25 -> -1, half up
    assert ap(AluOp.CLIP, b2=np.array([5, 5, 5])) == [5, 3, 5]
    # REQUANT: bias = b, mult = b2, shift = b3, zp / lo / hi from the immediate
    imm = sem.pack_requant_imm(2, -128, 127)
    # 13/2 = 6.5 -> 7, -7/2 = -3.5 -> -3, (2**31 - 1) + 1 wraps to -2**31: / 2**31 = -1
    # (without the wrap it would be +1); each + 2
    assert ap(AluOp.REQUANT, b2=np.array([1, 1, 1]), b3=np.array([1, 1, 31]),
              imm=imm) == [9, -1, 1]
    assert ap(AluOp.REQUANT, b2=np.array([3, 3, 3]), b3=np.array([0, 0, 0]),
              imm=sem.pack_requant_imm(2, 2, 30)) == [30, 2, 2]   # fused ReLU + upper clamp
    with pytest.raises(ValueError):
        sem.alu_apply(15, d, a, b)
    with pytest.raises(ValueError, match="bits 25-31"):
        ap(AluOp.REQUANT, b2=b, b3=b, imm=1 << 25)
    with pytest.raises(ValueError, match="bits 8-23"):    # wide with int8 clamp bounds
        ap(AluOp.REQUANT, b2=b, b3=b, imm=sem.REQUANT_WIDE | 0x7F8000)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([op for op in AluOp if op not in (AluOp.REQUANT, AluOp.LUT)]),
       st.lists(st.tuples(INT32, INT32, INT32, INT32), min_size=1, max_size=8))
def test_alu_apply_int32_operands_match_int64(op, rows):
    """The simulator's fast path (int32 operands, wrapping in int32) gives the same results
    as the int64 path and as Python integers."""
    d, a, b, b2 = (np.array(c, dtype=np.int64) for c in zip(*rows))
    if op == AluOp.SHR:
        b = b % 140 - 70
    if op == AluOp.CLIP:
        b, b2 = np.minimum(b, b2), np.maximum(b, b2)
    wide = sem.alu_apply(op, d, a, b, b2)
    narrow = sem.alu_apply(op, d.astype(np.int32), a.astype(np.int32), b.astype(np.int32),
                           b2.astype(np.int32))
    assert narrow.dtype == np.int32 and wide.dtype == np.int32
    assert narrow.tolist() == wide.tolist()
    if op in (AluOp.ADD, AluOp.MUL, AluOp.MAC, AluOp.MAC8):
        want = {AluOp.ADD: lambda x, y, z: y + z, AluOp.MUL: lambda x, y, z: y * z,
                AluOp.MAC: lambda x, y, z: x + y * z,
                AluOp.MAC8: lambda x, y, z: x + low_byte_signed(y) * low_byte_signed(z)}[op]
        assert narrow.tolist() == [wrap32(want(int(x), int(y), int(z)))
                                   for x, y, z in zip(d, a, b)]
