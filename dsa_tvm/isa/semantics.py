"""Integer semantics of the DSA, defined once.

The simulator computes with these functions and the compiler's CPU reference
of a quantized graph calls the same ones, so "bit-exact" means one definition.
All functions take and return numpy integer arrays (or Python ints).
"""

from __future__ import annotations

import numpy as np

INT8_MIN, INT8_MAX = -128, 127
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
#: Shift amounts accepted by REQUANT (right shift of the 64-bit product).
REQUANT_SHIFT_RANGE = (0, 62)


def wrap_int32(x: np.ndarray) -> np.ndarray:
    """Two's-complement wrap-around of int64 values to int32 (the accumulator's overflow)."""
    return np.asarray(x, dtype=np.int64).astype(np.int32)


def saturate(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.clip(x, lo, hi)


def rshift_round(x: np.ndarray, shift: np.ndarray | int) -> np.ndarray:
    """Arithmetic right shift rounding half up: floor(x / 2**s + 1/2), on int64.

    A shift of 0 returns x; a negative shift shifts left by -shift (bits above
    bit 63 are lost). Shifts are clamped to [-32, 62]: int32 results are the
    same for any larger magnitude.
    """
    x = np.asarray(x, dtype=np.int64)
    s = np.asarray(shift, dtype=np.int64)
    if s.size and (s.min() < 0 or s.max() > 62):
        s = np.clip(s, -32, 62)
        with np.errstate(over="ignore"):
            left = np.left_shift(x, np.maximum(-s, 0))
        right = np.maximum(s, 0)
        half = np.left_shift(np.int64(1), right) >> 1
        return np.where(s >= 0, (x + half) >> right, left)
    half = np.left_shift(np.int64(1), s) >> 1  # 0 for a shift of 0
    return (x + half) >> s


def requantize(acc: np.ndarray, mult: np.ndarray | int, shift: np.ndarray | int,
               zero_point: int) -> np.ndarray:
    """int8 result of ``sat8(rshift_round(acc * mult, shift) + zero_point)``.

    ``acc`` int32 accumulators, ``mult`` int32 fixed-point multipliers and
    ``shift`` right shifts in REQUANT_SHIFT_RANGE (per lane, broadcastable):
    the real scale is ``mult * 2**-shift``. Returns int32 values in [-128, 127].
    """
    prod = np.asarray(acc, dtype=np.int64) * np.asarray(mult, dtype=np.int64)
    y = rshift_round(prod, shift) + np.int64(zero_point)
    return saturate(y, INT8_MIN, INT8_MAX).astype(np.int32)


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """(mult, shift) with mult in [2**30, 2**31) and ``mult * 2**-shift`` closest to scale.

    Used by the compiler to turn a real rescale factor into REQUANT parameters.
    """
    if not scale > 0:
        raise ValueError(f"requantize scale must be positive, got {scale}")
    mant, exp = np.frexp(scale)  # scale = mant * 2**exp, mant in [0.5, 1)
    mult = int(round(float(mant) * (1 << 31)))
    shift = 31 - int(exp)
    if mult == 1 << 31:
        mult //= 2
        shift -= 1
    lo, hi = REQUANT_SHIFT_RANGE
    if shift > hi:  # tiny scale: lose mantissa bits rather than fail
        mult >>= shift - hi
        shift = hi
    if shift < lo:
        raise ValueError(f"requantize scale {scale} is too large for the REQUANT shift range")
    return mult, shift


def alu_apply(op: int, dst: np.ndarray, a: np.ndarray, b: np.ndarray,
              b2: np.ndarray | None = None, zero_point: int = 0) -> np.ndarray:
    """One vector ALU operation on int64 operand arrays; returns int32 results.

    ``op`` is an ``AluOp`` value; ``b2`` is the second parameter row of CLIP and
    REQUANT (hi, shift). ``b`` is the immediate (broadcast) in immediate form;
    ``zero_point`` is REQUANT's immediate.
    """
    from .instructions import AluOp  # local: keep this module importable on its own

    with np.errstate(over="ignore"):
        if op == AluOp.MOV:
            r = np.broadcast_to(b, a.shape)
        elif op == AluOp.ADD:
            r = a + b
        elif op == AluOp.SUB:
            r = a - b
        elif op == AluOp.MUL:
            r = a * b
        elif op == AluOp.MAC:
            r = dst + a * b
        elif op == AluOp.MIN:
            r = np.minimum(a, b)
        elif op == AluOp.MAX:
            r = np.maximum(a, b)
        elif op == AluOp.SHR:
            r = rshift_round(a, b)
        elif op == AluOp.CLIP:
            r = np.minimum(np.maximum(a, b), b2)
        elif op == AluOp.REQUANT:
            return requantize(a, b, b2, zero_point)
        else:
            raise ValueError(f"unknown ALU op {op}")
    return wrap_int32(r)


def split_clip_imm(imm: int) -> tuple[int, int]:
    """(lo, hi) of a CLIP immediate: low and high 16 bits, each signed."""
    lo = imm & 0xFFFF
    hi = (imm >> 16) & 0xFFFF
    return (lo - 0x10000 if lo & 0x8000 else lo), (hi - 0x10000 if hi & 0x8000 else hi)


def pack_clip_imm(lo: int, hi: int) -> int:
    """The CLIP immediate for ``clamp(x, lo, hi)``, both in int16 range."""
    for v in (lo, hi):
        if not -32768 <= v <= 32767:
            raise ValueError(f"CLIP immediate bounds must be int16, got {v}")
    word = (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)
    return word - (1 << 32) if word & (1 << 31) else word
