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
    if isinstance(shift, (int, np.integer)) and 0 <= shift <= 62:   # one shift (an ALU
        return (x + ((1 << int(shift)) >> 1)) >> int(shift)          # immediate): no checks
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


#: largest shift the folded requantize takes: the zero point x 2**shift plus the product
#: (< 2**62) stays inside int64
FOLD_SHIFT_MAX = 52


def _requantize_folded(y: np.ndarray, s: np.ndarray, zero_point: int, lo: int,
                       hi: int) -> np.ndarray:
    """:func:`requantize` of the int64 products ``y`` (modified) in four passes: the rounding
    half and the zero point added in one (``floor(v / 2**s) + zp == floor((v + zp * 2**s)
    / 2**s)``), the shift, the clamp against scalars (the ufuncs themselves: ``np.clip``'s
    wrapper costs more than the pass on a tile), the cast."""
    one = np.left_shift(np.int64(1), s)
    y += (one >> 1) + np.int64(zero_point) * one
    y >>= s
    np.maximum(y, lo, out=y)
    np.minimum(y, hi, out=y)
    return y.astype(np.int32)


def output_stage_int32(acc: np.ndarray, bias: np.ndarray, mult: np.ndarray,
                       shift: np.ndarray, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """:func:`output_stage` of int32 arrays whose shifts the caller has checked lie in
    0..FOLD_SHIFT_MAX (the simulator's REQUANT: a tile is a few dozen lanes, where each
    numpy call's overhead is the cost): the same passes without the general checks."""
    y = np.multiply(np.add(acc, bias, dtype=np.int32), mult, dtype=np.int64)  # int32 wrap
    return _requantize_folded(y, shift.astype(np.int64), zero_point, lo, hi)


def requantize(acc: np.ndarray, mult: np.ndarray | int, shift: np.ndarray | int,
               zero_point: int = 0, lo: int = INT8_MIN, hi: int = INT8_MAX) -> np.ndarray:
    """int8 core of the output stage: ``clamp(rshift_round(acc * mult, shift) + zero_point,
    lo, hi)``.

    ``acc`` int32 accumulators, ``mult`` int32 fixed-point multipliers and ``shift``
    right shifts in REQUANT_SHIFT_RANGE (per lane, broadcastable): the real scale is
    ``mult * 2**-shift``. ``lo``/``hi`` are int8 bounds (the defaults saturate to int8;
    ``lo = zero_point`` is ReLU, ``hi = zero_point + round(6 / scale)`` ReLU6). The
    product is exact in int64. Returns int32 values in [lo, hi].
    """
    y = np.asarray(np.multiply(acc, mult, dtype=np.int64))  # exact: int32 x int32 fits int64
    s = np.asarray(shift)
    if s.dtype not in (np.int32, np.int64):
        s = s.astype(np.int64)
    if (s.size and y.ndim and np.broadcast_shapes(y.shape, s.shape) == y.shape
            and s.min() >= 0 and s.max() <= FOLD_SHIFT_MAX):
        return _requantize_folded(y, s.astype(np.int64, copy=False), zero_point, lo, hi)
    # one reduction: negative shifts are huge when viewed as unsigned
    if s.size and s.view(np.uint32 if s.dtype == np.int32 else np.uint64).max() > 62:
        y = rshift_round(y, s)
    else:  # rshift_round for shifts in 0..62, in place: + 2**(s-1) (0 for s = 0), >> s
        y = y + (np.left_shift(np.int64(1), s) >> 1)  # (may broadcast y to s's shape)
        y >>= s
    y += np.int64(zero_point)
    np.maximum(y, np.int64(lo), out=y)
    np.minimum(y, np.int64(hi), out=y)
    return y.astype(np.int32)


def output_stage(acc: np.ndarray, bias: np.ndarray | int, mult: np.ndarray | int,
                 shift: np.ndarray | int, zero_point: int = 0, lo: int = INT8_MIN,
                 hi: int = INT8_MAX) -> np.ndarray:
    """The fused output stage (ALU REQUANT): bias add, requantize, zero point, clamp.

    ``clamp(rshift_round(wrap32(acc + bias) * mult, shift) + zero_point, lo, hi)``:
    the bias is added to the int32 accumulator with int32 wrap-around, then
    :func:`requantize` does the rest. Every argument but the immediates is per lane
    (broadcastable). Returns int32 values in [lo, hi].
    """
    acc, bias = np.asarray(acc), np.asarray(bias)
    with np.errstate(over="ignore"):
        if acc.dtype == np.int32 and bias.dtype == np.int32:
            biased = acc + bias  # numpy's int32 add wraps
        else:
            biased = wrap_int32(acc.astype(np.int64) + bias.astype(np.int64))
    return requantize(biased, mult, shift, zero_point, lo, hi)


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


def quantize_multipliers(factors: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_multiplier` of each real factor: (mult, shift) as int32 arrays."""
    pairs = [quantize_multiplier(float(f)) for f in np.asarray(factors, np.float64).reshape(-1)]
    return (np.array([p[0] for p in pairs], np.int32), np.array([p[1] for p in pairs], np.int32))


_AluOp = None


def alu_apply(op: int, dst: np.ndarray, a: np.ndarray, b: np.ndarray,
              b2: np.ndarray | None = None, b3: np.ndarray | None = None,
              imm: int = 0) -> np.ndarray:
    """One vector ALU operation on integer operand arrays; returns int32 results.

    For LUT, ``b`` is the whole table (:func:`table_lookup`).
    ``b``, ``b2``, ``b3`` are the parameter rows b, b + 1, b + 2 of the tensor form
    (CLIP reads two: lo, hi; REQUANT three: bias, mult, shift); in the immediate
    form ``b`` is the immediate (and CLIP's ``b``/``b2`` its two halves). ``imm`` is
    the raw immediate, which REQUANT splits into zero point and clamp bounds
    (:func:`split_requant_imm`).

    Operands may be int32 or int64. The int32 wrap-around of ADD, SUB, MUL and MAC is
    numpy's own int32 arithmetic when every operand is int32 (the simulator's fast
    path); int64 operands are wrapped at the end. SHR and REQUANT compute in int64.
    """
    global _AluOp
    if _AluOp is None:  # imported late: keep this module importable on its own
        from .instructions import AluOp as _AluOp
    AluOp = _AluOp

    with np.errstate(over="ignore"):
        if op == AluOp.MOV:
            r = np.broadcast_to(b, np.shape(a))
        elif op == AluOp.ADD:
            r = a + b
        elif op == AluOp.SUB:
            r = a - b
        elif op == AluOp.MUL:
            r = a * b
        elif op == AluOp.MAC:
            r = dst + a * b
        elif op == AluOp.MAC8:  # the operands' low bytes (a C cast to int8 keeps them)
            r = dst + (np.asarray(a).astype(np.int8).astype(np.int32)
                       * np.asarray(b).astype(np.int8).astype(np.int32))
        elif op == AluOp.MIN:
            r = np.minimum(a, b)
        elif op == AluOp.MAX:
            r = np.maximum(a, b)
        elif op == AluOp.SHR:
            r = rshift_round(a, b)
        elif op == AluOp.CLIP:
            r = np.minimum(np.maximum(a, b), b2)
        elif op == AluOp.REQUANT:
            zp, lo, hi = split_requant_imm(imm)
            return output_stage(a, b, b2, b3, zp, lo, hi)
        elif op == AluOp.LUT:
            return table_lookup(a, b)
        else:
            raise ValueError(f"unknown ALU op {op}")
    r = np.asarray(r)
    return r if r.dtype == np.int32 else wrap_int32(r)


def table_lookup(a: np.ndarray, table: np.ndarray) -> np.ndarray:
    """ALU LUT: ``table[clamp(a, -128, 127) + 128]``, int32.

    ``table`` is the flat table (256 entries, entry i for input code i - 128); out-of-range
    accumulators saturate to the nearest code, as the int8 tensor they stand for would.
    """
    t = np.asarray(table).reshape(-1)
    if t.size < 256:
        raise ValueError(f"an activation table has 256 entries, got {t.size}")
    idx = np.clip(np.asarray(a, dtype=np.int64), INT8_MIN, INT8_MAX) + 128
    return t[:256].astype(np.int32, copy=False)[idx]


INT4_MIN, INT4_MAX = -8, 7


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """int8 codes in [-8, 7] -> bytes holding two each, the even-indexed code in the low
    nibble (an odd count gets a zero high nibble): how a WGT4 load finds them in DRAM."""
    c = np.asarray(codes).reshape(-1).astype(np.int16)
    if c.size and (c.min() < INT4_MIN or c.max() > INT4_MAX):
        raise ValueError(f"int4 codes lie in [{INT4_MIN}, {INT4_MAX}], got "
                         f"[{int(c.min())}, {int(c.max())}]")
    if c.size % 2:
        c = np.append(c, 0)
    nib = (c & 0xF).astype(np.uint8)
    return nib[0::2] | (nib[1::2] << 4)


def _nibble_pairs() -> np.ndarray:
    """(256, 2) int8: the sign-extended low and high nibble of every byte."""
    b = np.arange(256, dtype=np.uint8)
    return np.stack([(b << 4).view(np.int8) >> 4, b.view(np.int8) >> 4], axis=1)


_NIBBLES = _nibble_pairs()


def unpack_int4(raw: np.ndarray) -> np.ndarray:
    """Bytes (any shape, last axis bytes) -> int8 codes, twice as many along the last axis,
    each nibble sign-extended (the inverse of :func:`pack_int4`); one table lookup per
    byte (4x faster than shifting each nibble out)."""
    b = np.asarray(raw, dtype=np.uint8)
    return np.take(_NIBBLES, b, axis=0).reshape(b.shape[:-1] + (2 * b.shape[-1],))


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) else v


def split_clip_imm(imm: int) -> tuple[int, int]:
    """(lo, hi) of a CLIP immediate: low and high 16 bits, each signed."""
    return _signed(imm & 0xFFFF, 16), _signed((imm >> 16) & 0xFFFF, 16)


def pack_clip_imm(lo: int, hi: int) -> int:
    """The CLIP immediate for ``clamp(x, lo, hi)``, both in int16 range."""
    for v in (lo, hi):
        if not -32768 <= v <= 32767:
            raise ValueError(f"CLIP immediate bounds must be int16, got {v}")
    word = (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)
    return word - (1 << 32) if word & (1 << 31) else word


INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
#: REQUANT immediate bit 24: the wide output stage (clamp to int16, bits 8-23 zero)
REQUANT_WIDE = 1 << 24
#: REQUANT immediate bits that must be zero (bits 25-31).
REQUANT_IMM_RESERVED = 0x7F << 25


def pack_requant_imm(zero_point: int = 0, lo: int | None = None, hi: int | None = None, *,
                     wide: bool = False) -> int:
    """The REQUANT immediate: ``zero_point`` in bits 0-7, ``lo`` in bits 8-15, ``hi`` in
    bits 16-23, each a signed int8 (``lo``/``hi`` default to -128, 127); bits 24-31 zero.
    ``lo <= hi`` is required (ReLU: ``lo = zero_point``; no activation: ``-128, 127``).

    ``wide``: bit 24 set, the result clamps to int16 [-32768, 32767] (an int16 output, e.g.
    the residual stream an ACC16 store writes); the zero point is still added, bits 8-23
    stay zero, so ``lo``/``hi`` must be left out (or be exactly -32768, 32767)."""
    if not INT8_MIN <= int(zero_point) <= INT8_MAX:
        raise ValueError(f"REQUANT zero point must be int8 (-128..127), got {zero_point}")
    if wide:
        if (lo, hi) not in ((None, None), (INT16_MIN, INT16_MAX)):
            raise ValueError(f"a wide REQUANT clamps to int16 [{INT16_MIN}, {INT16_MAX}]; its "
                             f"clamp bounds are not programmable (got lo {lo}, hi {hi})")
        return (int(zero_point) & 0xFF) | REQUANT_WIDE
    lo = INT8_MIN if lo is None else lo
    hi = INT8_MAX if hi is None else hi
    for name, v in (("lo", lo), ("hi", hi)):
        if not INT8_MIN <= int(v) <= INT8_MAX:
            raise ValueError(f"REQUANT {name} must be int8 (-128..127), got {v}")
    if lo > hi:
        raise ValueError(f"REQUANT clamp bounds are empty: lo {lo} > hi {hi}")
    return (int(zero_point) & 0xFF) | ((int(lo) & 0xFF) << 8) | ((int(hi) & 0xFF) << 16)


def requant_imm_is_wide(imm: int) -> bool:
    """Whether a REQUANT immediate has the wide bit (24) set (int16 clamp)."""
    return bool(int(imm) & REQUANT_WIDE)


def split_requant_imm(imm: int) -> tuple[int, int, int]:
    """(zero_point, lo, hi) of a REQUANT immediate: the clamp it applies, int8 bounds from
    bits 8-23, or with the wide bit (24) the int16 bounds -32768, 32767. ValueError if a
    reserved bit (25-31) is set, or a wide immediate has bits 8-23 set."""
    imm = int(imm)
    if imm & ~0x1FFFFFF:
        raise ValueError(f"REQUANT immediate {imm & 0xFFFFFFFF:#x} has bits 25-31 set; they "
                         f"must be zero (zero point, lo, hi occupy bits 0-23, wide bit 24)")
    zp = _signed(imm & 0xFF, 8)
    if imm & REQUANT_WIDE:
        if imm & 0xFFFF00:
            raise ValueError(f"wide REQUANT immediate {imm:#x} has bits 8-23 set; a wide "
                             f"REQUANT clamps to int16, its lo and hi bytes must be zero")
        return zp, INT16_MIN, INT16_MAX
    return zp, _signed((imm >> 8) & 0xFF, 8), _signed((imm >> 16) & 0xFF, 8)
