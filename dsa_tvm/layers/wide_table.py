"""An element-wise function of one int16 tensor on the vector unit's 256-entry table.

The activation table (ALU LUT) indexes 256 entries, an int8 code's worth. An int16 code
``x`` is split as the byte planes are, ``x = 256 hi + lo`` (``hi = rshift_round(x, 8)``,
at most 127, so ``lo`` is in [-128, 127], [-128, 255] in the top segment), and the
function is a line per segment of 256 codes: two tables of 256 int32 entries, ``base``
and ``slope`` in ``2**frac`` output codes, give ``acc = base[hi] + slope[hi] * lo`` and
``y = rshift_round(acc, frac)`` clamped to int16. Every step is an existing ALU op (SHR,
MIN, MAC, LUT, LUT, MAC, REQUANT wide), so no new hardware is involved.

The compiler knows the function exactly (the chain's 65,536 output codes, from TVM's own
llvm build: ``relay_passes.table_chains``), fits each segment's line to them by least
squares, and measures the fit on every input code: :attr:`WideTableFit.error`, the largest
difference from the exact codes, which the front end reports and bounds
(:data:`MAX_ERROR_CODES`). An LLM's SiLU on an int16 gate is within a few codes of 32,767.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsa_tvm.isa import semantics as sem

#: input codes of int16, and the table's segments
CODES = 1 << 16
SEGMENTS = 256
#: the largest segment index (``hi`` is clamped to it: the top segment is 384 codes wide)
TOP = SEGMENTS // 2 - 1
#: the fit is refused (the chain stays on the CPU) beyond this many output codes from the
#: exact function: 1/8 of an int8 step of the same range, or the int16 grid buys nothing
MAX_ERROR_CODES = 32
#: accumulator headroom: |base| + |slope| * 255 stays below this
_ACC_LIMIT = (1 << 31) - 1


@dataclass(frozen=True)
class WideTableFit:
    base: np.ndarray      # int32 [256]: segment h - 128's line at lo = 0, 2**frac codes
    slope: np.ndarray     # int32 [256]: its slope per input code, 2**frac codes
    frac: int             # fraction bits of both (the REQUANT's shift)
    error: int            # largest |interpolated - exact| over every input code


def all_codes() -> np.ndarray:
    """Every int16 code, in table order (entry i is input code i - 32768)."""
    return np.arange(-(CODES // 2), CODES // 2, dtype=np.int64)


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(hi, lo)`` with ``x = 256 hi + lo``, as the ALU computes them (SHR 8, MIN 127, MAC)."""
    x = np.asarray(x, dtype=np.int64)
    hi = np.minimum(sem.rshift_round(x, 8), TOP)
    return hi, x - 256 * hi


def interpolate(x: np.ndarray, base: np.ndarray, slope: np.ndarray, frac: int) -> np.ndarray:
    """The int16 output codes of int16 codes ``x`` (the integer reference: int32 wrap-around
    at every ALU op, as the vector unit computes it)."""
    hi, lo = split(x)
    b = np.asarray(base, np.int64).reshape(-1)[hi + 128]
    m = np.asarray(slope, np.int64).reshape(-1)[hi + 128]
    acc = sem.wrap_int32(b + sem.wrap_int32(m * lo))
    return sem.output_stage(acc.astype(np.int32), 0, 1, frac, 0, sem.INT16_MIN,
                            sem.INT16_MAX).astype(np.int16)


def fit(codes: np.ndarray) -> WideTableFit:
    """The least-squares line of each segment through ``codes`` (int [65536]: the exact
    output code of every input code, entry i for input code i - 32768). Saturated codes
    are left out of a segment's fit when two or more are not: the output stage's int16
    clamp gives them back wherever the line runs past the bound (a kink no line holds)."""
    y = np.asarray(codes, dtype=np.float64).reshape(-1)
    if y.size != CODES:
        raise ValueError(f"a wide table fits {CODES} codes, got {y.size}")
    if not np.isfinite(y).all():
        raise ValueError("a wide table's codes must be finite")
    x = all_codes()
    hi, lo = split(x)
    seg = hi + 128
    lo = lo.astype(np.float64)
    inside = ((y > sem.INT16_MIN) & (y < sem.INT16_MAX)).astype(np.float64)
    w = np.where(np.bincount(seg, weights=inside, minlength=SEGMENTS)[seg] >= 2, inside, 1.0)

    def sums(v):
        return np.bincount(seg, weights=w * v, minlength=SEGMENTS)

    n, sl, sll, sy, sly = sums(1.0), sums(lo), sums(lo * lo), sums(y), sums(lo * y)
    den = n * sll - sl * sl
    m = np.where(den > 0, (n * sly - sl * sy) / np.where(den > 0, den, 1), 0.0)
    b = (sy - m * sl) / np.maximum(n, 1)
    peak = float(np.max(np.abs(b) + np.abs(m) * 255.0)) + 1.0
    frac = int(np.clip(np.floor(np.log2(_ACC_LIMIT / (2 * peak))), 0, 30))
    base = np.round(b * 2.0 ** frac).astype(np.int32)
    slope = np.round(m * 2.0 ** frac).astype(np.int32)
    got = interpolate(x, base, slope, frac).astype(np.int64)
    error = int(np.max(np.abs(got - np.asarray(codes, np.int64).reshape(-1))))
    return WideTableFit(base, slope, frac, error)
