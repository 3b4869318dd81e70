"""The ``[norm]`` units as the ISA sees them: the ``NORM`` instruction's parameter block,
its result on accumulator rows, and its cost.

A program hands the units their integer parameters in the accumulator (int32 words
packed ``block_out`` per row, loaded from a constant DRAM region by an ACC load, as the
activation table arrives): ``HEADER_WORDS`` scalar words, then for the norms three runs
of ``ceil(n / block_out)`` rows: gamma (int32 per channel), the low and the high words
of beta (int64 per channel). Softmax's header is ``in_mult, in_shift, out_mult,
out_shift, out_zp``; a norm's ``eps_term`` (low, high word), ``frac``, ``out_zp``. The
math is :mod:`dsa_tvm.isa.intnorm`, called here and nowhere restated; the cost,
:func:`norm_cycles`, is what the timing model charges and the compiler estimates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..intmath import ceil_div
from . import intnorm as inn
from .instructions import NormOp
from .semantics import INT8_MAX, INT8_MIN, INT16_MAX, INT16_MIN

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

#: scalar words at the head of every parameter block
HEADER_WORDS = 8
#: row passes a unit makes over each row, per operation (softmax: max, exp and sum,
#: scale; the norms: sums, normalize)
PASSES: dict[NormOp, int] = {NormOp.SOFTMAX: 3, NormOp.LAYERNORM: 2, NormOp.RMSNORM: 2}
#: bounds the parameters must keep for the integer semantics to hold in int64
_EPS_MAX = 1 << 58
_BETA_MAX = 1 << inn.BETA_BITS
_MASK32 = (1 << 32) - 1


def row_span(n: int, block_out: int) -> int:
    """Accumulator rows one row of ``n`` codes spans."""
    return ceil_div(n, block_out)


def param_rows(op: NormOp, n: int, block_out: int) -> int:
    """Accumulator rows of the parameter block of ``op`` over rows of ``n``."""
    head = ceil_div(HEADER_WORDS, block_out)
    return head if op == NormOp.SOFTMAX else head + 3 * row_span(n, block_out)


def _split64(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(v, np.int64)
    return (v & _MASK32).astype(np.uint32).view(np.int32), (v >> 32).astype(np.int32)


def _join64(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (np.asarray(hi, np.int64) << 32) | (np.asarray(lo, np.int32).view(np.uint32)
                                               .astype(np.int64))


def pack_params(op: NormOp, params, n: int, block_out: int) -> np.ndarray:
    """The int32 ``[param_rows, block_out]`` block of ``params`` (``intnorm.SoftmaxParams``
    or ``NormParams``) for rows of ``n``."""
    span = row_span(n, block_out)
    head = np.zeros(ceil_div(HEADER_WORDS, block_out) * block_out, np.int64)
    if op == NormOp.SOFTMAX:
        head[:5] = [params.in_mult, params.in_shift, params.out_mult, params.out_shift,
                    params.out_zp]
        return head.astype(np.int32).reshape(-1, block_out)
    if params.center != (op == NormOp.LAYERNORM):
        raise ValueError(f"{op.name} with parameters of center={params.center}")
    lo, hi = _split64(np.int64(params.eps_term))
    head[:4] = [int(lo), int(hi), params.frac, params.out_zp]
    chan = np.zeros((3, span * block_out), np.int64)
    chan[0, :n] = params.gamma
    blo, bhi = _split64(params.beta)
    chan[1, :n], chan[2, :n] = blo, bhi
    return np.concatenate([head.astype(np.int32), chan.astype(np.int32).reshape(-1)]).reshape(
        -1, block_out)


def unpack_params(op: NormOp, block: np.ndarray, n: int):
    """The parameters a block holds (inverse of :func:`pack_params`); ValueError naming
    the word when one is outside what the units take."""
    words = np.asarray(block, np.int32).reshape(-1)
    bo = np.asarray(block).shape[-1]
    h = words[:HEADER_WORDS].astype(np.int64)
    if op == NormOp.SOFTMAX:
        in_mult, in_shift, out_mult, out_shift, out_zp = (int(v) for v in h[:5])
        if in_mult < 0:
            raise ValueError(f"softmax in_mult {in_mult} is negative (the working value "
                             f"x - max(x) must stay <= 0)")
        if not 0 <= in_shift <= 62:
            raise ValueError(f"softmax in_shift {in_shift} is outside 0..62")
        return inn.SoftmaxParams(in_mult, in_shift, out_mult, out_shift, out_zp)
    eps = int(_join64(words[0], words[1]))
    frac, out_zp = int(h[2]), int(h[3])
    if not 0 <= eps <= _EPS_MAX:
        raise ValueError(f"norm eps_term {eps} is outside 0..2**58")
    if not 0 <= frac <= 30:
        raise ValueError(f"norm frac {frac} is outside 0..30")
    base = ceil_div(HEADER_WORDS, bo) * bo
    span = row_span(n, bo) * bo
    gamma = words[base:base + n].astype(np.int64)
    beta = _join64(words[base + span:base + span + n], words[base + 2 * span:base + 2 * span + n])
    if np.abs(beta).max(initial=0) > _BETA_MAX:
        raise ValueError(f"norm beta up to {int(np.abs(beta).max())} is outside +-2**58")
    return inn.NormParams(op == NormOp.LAYERNORM, eps, gamma, beta, frac, out_zp)


#: the codes the units read: int8, or int16 with NORM's ``in_wide``
CODE_RANGE = {False: (INT8_MIN, INT8_MAX), True: (INT16_MIN, INT16_MAX)}


def apply(op: NormOp, x: np.ndarray, in_zp: int, params, in_wide: bool = False,
          out_wide: bool = False) -> np.ndarray:
    """The unit's result on ``x`` (rows of int32 lanes holding codes; clamped to int8
    first, as the units read int8 codes, or to int16 with ``in_wide``):
    :mod:`dsa_tvm.isa.intnorm`, whose integer math is exact for int16 codes too (every
    intermediate stays inside int64 for rows up to ``intnorm.MAX_ROW``). Softmax takes
    wide rows as well (``q - max(q)`` then spans 17 bits; its product with ``in_mult``
    stays below 2**48). ``out_wide``: the results saturate at int16, not int8 (for an
    ACC16 store)."""
    lo, hi = CODE_RANGE[bool(in_wide)]
    q = np.clip(np.asarray(x, np.int64), lo, hi).astype(np.int16 if in_wide else np.int8)
    if op == NormOp.SOFTMAX:
        return inn.int_softmax(q, in_zp, params, out_wide)
    return inn.int_norm(q, in_zp, params, out_wide)


def norm_cycles(cfg: "HardwareConfig", op: NormOp, n: int, rows: int) -> int:
    """Cycles the ``[norm]`` units take for ``rows`` rows of ``n``: rows spread over the
    units, each row ``PASSES[op]`` passes at ``norm_elements_per_cycle`` plus
    ``norm_row_latency_cycles`` (reciprocal / inverse square root). ValueError without units."""
    units = int(cfg.norm_units)
    if units < 1:
        raise ValueError(f"'{cfg.name}' has no [norm] units (norm_units = 0)")
    per_row = PASSES[op] * ceil_div(n, cfg.norm_elements_per_cycle) + cfg.norm_row_latency_cycles
    return ceil_div(rows, units) * per_row
