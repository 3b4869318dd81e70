"""A dense layer on an int16 input (W8A16) as two int8 byte planes on the int8 MAC array.

An LLM's down_proj input, the SiLU-gate product, needs a finer grid than int8 static
codes: its rows differ by orders of magnitude. On SmolLM2 an int16 static grid there
halves the W8A8 step's KL divergence from FP32, as much as per-token int8 grids do
(``benchmarks/llm_qdq_proxy.py --wide-inputs down_proj/MatMul``). The array multiplies
int8 codes, so the int16 input ``x`` (symmetric) is split exactly into two int8 planes,
``x = 256 * hi + lo``, which run through the dense as rows of one matrix (the weights
stream once), each plane's sums requantized onto one int16 grid and added with the
factor 256 between them. Every step is an existing layer, so the integer reference and
the DSA agree by construction:

* ``hi = Rescale(x)``: ``rshift_round(x, 8)`` (half up), int8; ``x >= 32640`` would give
  128, so it saturates: such an ``x`` counts as 32639.
* ``lo = Add(x * 1 + hi * -256)``: int8, exact (in [-128, 127]).
* ``planes = Concat(hi, lo)`` along the rows axis.
* ``partial = Dense(planes)``: int16 on the grid ``s_p`` whose 32767 is the largest sum
  any plane of codes in [-128, 128] can reach, ``128 * s_x * max_n(s_w[n] * sum|W[n]|)``:
  no plane saturates, whatever the input.
* ``p_hi, p_lo = Slice(partial)``: the two halves of the rows.
* ``y = Add(p_hi * 256 s_p / s_y + p_lo * s_p / s_y)``: the output grid and its clip.

Against the exact int16 x int8 product the planes' rounding costs at most
``129 * s_p / s_y`` output codes (the 256-times term's half step plus the other's).
"""

from __future__ import annotations

import numpy as np

from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.ir import WIDE_CLIP, Add, Concat, Dense, Layer, QTensor, Requant, Rescale, Slice
from dsa_tvm.layers.reference import PLANE_SHIFT

from .add import WIDE_ADD_MULT_BITS, add_multipliers

#: the planes' split: hi carries the codes' top byte (``layers.reference.PLANE_SHIFT``)
PLANE = 1 << PLANE_SHIFT


def plane_scale(x: QTensor, weight: np.ndarray, w_scales: np.ndarray) -> float:
    """``s_p``: the partial sums' int16 grid, 32767 at the largest |sum| a plane reaches."""
    col = np.abs(weight.astype(np.int64)).sum(axis=1) * np.broadcast_to(
        np.asarray(w_scales, np.float64), (weight.shape[0],))
    return max(float((PLANE // 2) * x.scale * col.max()), 1e-30) / sem.INT16_MAX


def join_factors(s_p: float, y_scale: float) -> tuple[float, float]:
    """The real factors of the add that joins the planes: (256 s_p / s_y, s_p / s_y)."""
    return PLANE * s_p / y_scale, s_p / y_scale


def join_fits(factors: tuple[float, float], y_scale: float) -> str | None:
    """None if the add joining two byte planes can take ``factors`` (each plane's real
    factor onto the output grid ``y_scale``): both within an int16 operand's multiplier
    bits; else why not."""
    big = max(factors)
    if not 0 < big < 2.0 ** WIDE_ADD_MULT_BITS:
        return (f"the byte planes' add factor {big:g} is not in (0, 2^{WIDE_ADD_MULT_BITS}) "
                f"(output scale {y_scale:g})")
    return None


def split_layers(name: str, x: QTensor) -> tuple[tuple[Layer, Layer], QTensor, QTensor]:
    """``x = 256 hi + lo`` for int16 codes ``x`` (zero point 0): the Rescale making ``hi``
    and the Add making ``lo``, and the two int8 planes (both carry ``x``'s label)."""
    hi = QTensor(f"{name}/hi", x.shape, x.scale, 0)
    lo = QTensor(f"{name}/lo", x.shape, x.scale, 0)
    one = np.array([1], np.int32)
    int8 = (sem.INT8_MIN, sem.INT8_MAX)
    return (Rescale(f"{name}/hi", x, hi, Requant(one, np.array([PLANE_SHIFT], np.int32), 0, int8)),
            Add(f"{name}/lo", x, hi, lo, 1, -PLANE, Requant(one, np.array([0], np.int32), 0,
                                                            int8))), hi, lo


def byte_plane_layers(name: str, x: QTensor, y: QTensor, weight: np.ndarray,
                      w_scales: np.ndarray, clip: tuple[int, int]) -> tuple[Layer, ...]:
    """The layers of ``y = x @ weight.T`` for an int16 ``x`` (rows of its last axis; zero
    point 0), ``weight`` int8 [N, K] with per-channel real scales ``w_scales``, into ``y``
    (the same leading axes) with ``clip`` (int8 bounds or WIDE_CLIP)."""
    rows = len(x.shape) - 2
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    n = weight.shape[0]
    doubled = lead[:rows] + (2 * lead[rows],)
    split, hi, lo = split_layers(name, x)               # the concat is a byte copy
    planes = QTensor(f"{name}/planes", doubled + (k,), x.scale, 0)
    s_p = plane_scale(x, weight, w_scales)
    partial = QTensor(f"{name}/partial", doubled + (n,), s_p, 0, "int16")
    p_hi = QTensor(f"{name}/p_hi", lead + (n,), s_p, 0, "int16")
    p_lo = QTensor(f"{name}/p_lo", lead + (n,), s_p, 0, "int16")
    one = np.array([1], np.int32)
    factors = x.scale * np.broadcast_to(np.asarray(w_scales, np.float64), (n,)) / s_p
    mult, shift = sem.quantize_multipliers(factors)
    am, bm, sh = add_multipliers(*join_factors(s_p, y.scale),
                                 bits=(WIDE_ADD_MULT_BITS, WIDE_ADD_MULT_BITS))
    return (
        *split,
        Concat(f"{name}/planes", (hi, lo), planes, axis=rows),
        Dense(f"{name}/partial", planes, partial, weight, np.zeros(n, np.int32),
              Requant(mult, shift, 0, WIDE_CLIP)),
        Slice(f"{name}/p_hi", partial, p_hi, 0, axis=rows),
        Slice(f"{name}/p_lo", partial, p_lo, lead[rows], axis=rows),
        Add(name, p_hi, p_lo, y, am, bm, Requant(one, np.array([sh], np.int32), y.zero_point,
                                                 clip)),
    )
