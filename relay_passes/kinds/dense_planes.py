"""A dense layer on an int16 input (W8A16) as two int8 byte planes on the int8 MAC array.

An LLM's down_proj input, the SiLU-gate product, needs a finer grid than int8 static
codes: its rows differ by orders of magnitude. On SmolLM2 an int16 static grid there
halves the W8A8 step's KL divergence from FP32, as much as per-token int8 grids do
(``benchmarks/llm_qdq_proxy.py --wide-inputs down_proj/MatMul``). The array multiplies
int8 codes, so the int16 input ``x`` (symmetric) is split exactly into two int8 planes,
``x = 256 * hi + lo``, which run through one dense as rows of one matrix (the weights
stream once) and join in its accumulator before the one requantize:

* ``planes = BytePlanes(x)``: the hi rows, ``rshift_round(x, 8)`` (half up, int8; ``x >=
  32640`` would give 128, so it saturates: such an ``x`` counts as 32639), then the lo
  rows, ``x - 256 hi`` (exact, in [-128, 127]), stacked on the rows axis; one pass that
  reads each code once (the ``planes`` room).
* ``y = Dense(planes, planes=True, lo_shift=s)``: ``acc = (acc_hi << (8 - s)) +
  rshift_round(acc_lo, s)`` (SHR and MAC on the accumulator rows), the product on the
  grid of ``2**s`` input steps, then the bias (rounded onto that grid the same way) and
  the per-channel requantize, factor ``2**s s_x s_w[n] / s_y``. ``s`` is the smallest
  shift whose joined sums stay within int32 for any input (:func:`plane_lo_shift`):
  0, the exact product, whenever ``256 * 128 * max_n sum_k |W[n, k]|`` fits (SmolLM2's
  down_proj: every layer).

Against the exact int16 x int8 product a join with ``s > 0`` drops at most half a joined
unit, and the bias as much: ``2**s s_x s_w[n] / s_y`` output steps, relatively most on a
row of small gate products, which lives almost all in the lo plane. (On SmolLM2 the
first form of this join, ``s = 8`` everywhere, and the exact one score the same
perplexity on the DSA, +4.7%: docs/llm.md.)

An earlier form requantized both planes' sums onto one int16 grid that held any plane's
largest sum and added them: that grid's step was 34 to 450 output steps on SmolLM2's
layers, and cost the W8A8 model 5.6 points of perplexity against the exact product
(docs/llm.md).
"""

from __future__ import annotations

import numpy as np

from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.ir import BytePlanes, Dense, Layer, QTensor, Requant
from dsa_tvm.layers.reference import PLANE_SHIFT

from .add import WIDE_ADD_MULT_BITS


def plane_lo_shift(weight: np.ndarray, bias: np.ndarray) -> int | None:
    """The smallest right shift ``s`` of the lo plane's sums whose join ``(acc_hi << (8 -
    s)) + rshift_round(acc_lo, s) + bias >> s`` stays within int32 for any input: each
    plane's codes are in [-128, 127] (hi saturates at 127), so ``|acc_*| <= 128 max_n
    sum_k |W[n, k]|``. None if no shift does."""
    col = 128 * int(np.abs(weight.astype(np.int64)).sum(axis=1).max(initial=0))
    top = int(np.abs(np.asarray(bias, np.int64)).max(initial=0))
    for s in range(PLANE_SHIFT + 1):
        if (col << (PLANE_SHIFT - s)) + (col >> s) + 1 + (top >> s) + 1 <= sem.INT32_MAX:
            return s
    return None


def join_fits(factors: tuple[float, float], y_scale: float) -> str | None:
    """None if the add joining two byte planes can take ``factors`` (each plane's real
    factor onto the output grid ``y_scale``): both within an int16 operand's multiplier
    bits; else why not."""
    big = max(factors)
    if not 0 < big < 2.0 ** WIDE_ADD_MULT_BITS:
        return (f"the byte planes' add factor {big:g} is not in (0, 2^{WIDE_ADD_MULT_BITS}) "
                f"(output scale {y_scale:g})")
    return None


def joined_bias(bias: np.ndarray, lo_shift: int) -> np.ndarray:
    """The bias on a plane dense's joined grid (``2**lo_shift`` product units), rounded as
    the join rounds the lo plane's sums."""
    return sem.rshift_round(np.asarray(bias, np.int64), lo_shift).astype(np.int32)


def byte_plane_layers(name: str, x: QTensor, y: QTensor, weight: np.ndarray,
                      bias: np.ndarray, requant: Requant, lo_shift: int) -> tuple[Layer, ...]:
    """The layers of ``y = x @ weight.T + bias`` for an int16 ``x`` (rows of its last axis;
    zero point 0), ``weight`` int8 [N, K], ``bias`` int32 [N] in product units
    (``s_x s_w[n]``), ``requant`` the REQUANT of the joined sums (factors ``2**lo_shift
    s_x s_w[n] / s_y``), ``lo_shift`` from :func:`plane_lo_shift`."""
    shape = tuple(x.shape)
    planes = QTensor(f"{name}/planes", shape[:-2] + (2 * shape[-2], shape[-1]), x.scale, 0)
    return (BytePlanes(f"{name}/planes", x, planes),
            Dense(name, planes, y, weight, joined_bias(bias, lo_shift), requant, planes=True,
                  lo_shift=lo_shift))
