"""Integer softmax, LayerNorm and RMSNorm over the last axis, defined once (I-BERT style).

These functions are the integer semantics of the ``[norm]`` unit's row operations
and the CPU reference of the :class:`~dsa_tvm.layers.ir.Softmax`,
:class:`~dsa_tvm.layers.ir.LayerNorm` and :class:`~dsa_tvm.layers.ir.RMSNorm`
layers. Every real number (scales, eps, gamma, beta) is folded at compile time
into the integer parameters the ``*_params`` functions return; the row functions
then use integers only (int64 numpy, floor shifts ``>>`` and the ISA's rounding
shift :func:`~dsa_tvm.isa.semantics.rshift_round`), so a device and this
reference agree bit for bit.

Softmax (Kim et al., I-BERT, 2021, "i-exp"): ``d = q - max(q) <= 0`` is rescaled to
a fixed working scale ``S_W = ln2 / 2**10`` (one multiply and rounding shift),
range-reduced by ln2 (``z = -x >> 10``, ``p = x + 1024 z`` in (-ln2, 0]),
``exp(p) ~ 0.3585 (p + 1.353)**2 + 0.344`` in integers, then shifted right by
``z`` with rounding (a floor shift would drop half a unit from every small term: in
a row one key dominates, e.g. an LLM's attention sink, 2,047 other keys lost 4% of
their mass that way, against 0.4% for float rounded to the same grid). The row sum's
reciprocal is a 16-entry table seed on the normalized sum plus two Newton steps; one
more multiply and rounding shift gives the int8 (or int16) code.

LayerNorm / RMSNorm: exact integer row sums ``S1 = sum(c)``, ``S2 = sum(c**2)`` of
``c = q - zp``; ``V = N*S2 - S1**2 + eps_term`` (LayerNorm, ``= N**2 (var + eps)``
in input steps) or ``V = S2 + eps_term`` (RMSNorm); ``1/sqrt(V)`` by a 12-entry table
seed on ``V`` normalized to [2**28, 2**30) plus three Newton steps; the normalized
value in Q16 times a per-channel Q(FG) gamma plus beta, one rounding shift, zero
point, saturate. (RMSNorm's ``sqrt(N)`` lives in its gamma.)

Input width: the row functions take int8 codes, or int16 codes (NORM's ``in_wide``: a
residual stream wider than int8) with the same integer math, exact in int64: with
``|c| <= 2**15 + 128`` (an int8 zero point) and ``N <= MAX_ROW = 2**16``, ``S2 <=
2**16 (2**15 + 128)**2 < 2**46.01``, LayerNorm's ``N*S2`` and ``S1**2`` are below
``4.65e18`` and ``V`` (plus ``eps_term <= 2**58``) below ``4.94e18 < 2**63``;
``int_rsqrt`` normalizes any ``V < 2**63`` (``e <= 17``); the normalized value's
product ``num * r`` stays below ``2**33 * 2**18``; softmax's ``(q - max q) * in_mult``
below ``2**17 * 2**31``. For codes within int8 the result is the int8 path's, bit for bit
(the same function on the same integers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .semantics import quantize_multiplier, rshift_round

__all__ = ["BETA_BITS", "BETA_STEPS", "EXP_FRAC", "EXP_ZERO_SPAN", "NormParams", "SoftmaxParams",
           "int_exp", "int_norm",
           "int_reciprocal", "int_rsqrt", "int_softmax", "norm_params", "softmax_params",
           "MAX_ROW"]

#: working scale of i-exp: x = x_w * ln2 / 2**EXP_FRAC
EXP_FRAC = 10
_LN2_STEPS = 1 << EXP_FRAC
#: polynomial exp(p) ~ A (p + B)**2 + C on (-ln2, 0] (I-BERT's second-order fit)
_A, _B, _C = 0.3585, 1.353, 0.344
_QB = round(_B * _LN2_STEPS / math.log(2))
_QC = round(_C / _A * (_LN2_STEPS / math.log(2)) ** 2)
#: exp(0) = (QB**2 + QC) >> EXP_SHIFT ~ 2**14.5: a row of MAX_ROW of them fits int32
EXP_SHIFT = 8
#: ln2 periods past which exp is 0 at this precision (also bounds the working value)
_Z_MAX = 24
#: longest row the units take (the softmax sum stays below 2**31)
MAX_ROW = 1 << 16
#: reciprocal: the sum normalized to [2**13, 2**14), r ~ 2**28 / m
_RB, _RQ = 14, 28
_RECIP_SEED = np.array([round(2 ** _RQ / ((16 + i + 0.5) * 2 ** (_RB - 5))) for i in range(16)],
                       np.int64)
#: inverse square root: V normalized to [2**28, 2**30), r ~ 2**30 / sqrt(m)
_SB, _SQ = 30, 30
_RSQRT_SEED = np.array([round(2 ** _SQ / math.sqrt((i + 0.5) * 2 ** (_SB - 4)))
                        for i in range(16)], np.int64)
#: fractional bits of the normalized value
_UF = 16


def _bitlen(x: np.ndarray) -> np.ndarray:
    """Bit length of non-negative int64 values (0 for 0), exact (no float rounding)."""
    x = np.asarray(x, np.int64)
    n = np.zeros(x.shape, np.int64)
    for b in (32, 16, 8, 4, 2, 1):
        big = (x >> n) >= (np.int64(1) << b)
        n = n + np.where(big, b, 0)
    return n + (x > 0)


def _shift(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Floor shift right by ``s`` (left by ``-s``), per element."""
    x, s = np.asarray(x, np.int64), np.asarray(s, np.int64)
    return np.where(s >= 0, x >> np.clip(s, 0, 63), x << np.clip(-s, 0, 62))


# ----------------------------------------------------------------------------- softmax
def int_exp(x_w: np.ndarray) -> np.ndarray:
    """i-exp of working values ``x_w <= 0`` (scale ln2 / 2**EXP_FRAC): ``exp`` in units of
    ``A * S_W**2 * 2**EXP_SHIFT``, i.e. exp(0) = (QB**2 + QC) >> EXP_SHIFT, rounded."""
    x = np.maximum(np.asarray(x_w, np.int64), -_Z_MAX * _LN2_STEPS)
    z = (-x) >> EXP_FRAC
    p = x + (z << EXP_FRAC)
    poly = (p + _QB) * (p + _QB) + _QC
    return rshift_round(poly, z + EXP_SHIFT)


def _exp_zero_periods() -> int:
    """The ln2 periods ``z`` from which :func:`int_exp` is exactly 0 (its largest value for
    a given ``z`` is at ``p = 0``: ``(QB**2 + QC) >> (z + EXP_SHIFT)``, rounded)."""
    z = 0
    while rshift_round(np.int64(_QB * _QB + _QC), z + EXP_SHIFT) > 0:
        z += 1
    return z


#: a softmax input this far (in real units) or more below its row's maximum contributes
#: exactly 0 to :func:`int_softmax` (i-exp underflows; one ln2 period of margin for the
#: rounding of the working value), so an input grid need not reach below it
EXP_ZERO_SPAN = (_exp_zero_periods() + 1) * math.log(2)


def int_reciprocal(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(r, e) with ``1 / s ~ r * 2**-(28 + e)`` for ``s >= 1``: normalize ``s`` to
    ``m = s >> e`` in [2**13, 2**14), seed r from a 16-entry table on m's top bits,
    two Newton steps ``r += r * (2**28 - m r) / 2**28`` (floor shifts)."""
    s = np.asarray(s, np.int64)
    e = _bitlen(s) - _RB
    m = _shift(s, e)
    r = _RECIP_SEED[(m >> (_RB - 5)) - 16]
    for _ in range(2):
        r = r + ((r * ((np.int64(1 << _RQ) - m * r) >> 14)) >> 14)
    return r, e


@dataclass(frozen=True)
class SoftmaxParams:
    """Integer parameters of one softmax: input steps -> working scale, and 1/s_out."""

    in_mult: int
    in_shift: int
    out_mult: int
    out_shift: int
    out_zp: int


def softmax_params(in_scale: float, out_scale: float, out_zp: int) -> SoftmaxParams:
    """Fold the scales; ValueError if a factor is outside the REQUANT range."""
    working = math.log(2) / _LN2_STEPS
    im, ish = quantize_multiplier(in_scale / working)
    om, osh = quantize_multiplier(1.0 / out_scale)
    return SoftmaxParams(im, ish, om, osh, int(out_zp))


def _saturate(y: np.ndarray, out_wide: bool) -> np.ndarray:
    """The result codes: int8, or int16 with NORM's ``out_wide``."""
    info = np.iinfo(np.int16 if out_wide else np.int8)
    return np.clip(y, info.min, info.max).astype(info.dtype)


def int_softmax(q: np.ndarray, zp: int, p: SoftmaxParams, out_wide: bool = False) -> np.ndarray:
    """int8 softmax of int8 (or int16) codes ``q`` over the last axis (the input zero point cancels
    in ``q - max(q)``; kept in the signature for symmetry). ``out_wide``: int16 codes out
    (the same integer math, saturated at int16: probabilities on a grid fine enough for a
    long row's small weights, e.g. 1 / (127 * 256))."""
    q = np.asarray(q, np.int64)
    if q.shape[-1] > MAX_ROW:
        raise ValueError(f"softmax row of {q.shape[-1]} > {MAX_ROW}")
    d = q - q.max(axis=-1, keepdims=True)
    x_w = rshift_round(d * p.in_mult, p.in_shift)
    ex = int_exp(x_w)
    r, e = int_reciprocal(ex.sum(axis=-1, keepdims=True))
    y = rshift_round(ex * r * p.out_mult, np.minimum(_RQ + e + p.out_shift, 62))
    return _saturate(y + p.out_zp, out_wide)


# ----------------------------------------------------------------------------- norms
def int_rsqrt(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(r, e) with ``1 / sqrt(v) ~ r * 2**-(30 + e)`` for ``v >= 1`` (r = 0 for v = 0):
    ``m = v / 4**e`` in [2**28, 2**30), seed from a table on m's top 4 bits, three
    Newton steps ``r = r (3 - m r**2 / 2**60) / 2`` (floor shifts)."""
    v = np.asarray(v, np.int64)
    e = (_bitlen(v) - (_SB - 1)) >> 1
    m = _shift(v, 2 * e)
    r = _RSQRT_SEED[np.clip(m >> (_SB - 4), 0, 15)]
    for _ in range(3):
        t = ((m * r) >> 15) * r >> 15
        r = (r * (np.int64(3 << _SQ) - t)) >> (_SQ + 1)
    return np.where(v > 0, r, 0), np.where(v > 0, e, 0)


#: how far beta may reach, in output steps, for int8 (False) and int16 (True) outputs:
#: 16 times the codes' range, beyond which the output saturates whatever the row
BETA_STEPS = {False: 1 << 12, True: 1 << 20}
#: the unit's beta words hold +-2**BETA_BITS (``norm_unit``)
BETA_BITS = 58


@dataclass(frozen=True)
class NormParams:
    """Integer parameters of one LayerNorm (``center``) or RMSNorm over the last axis."""

    center: bool
    eps_term: int          # added to V: N**2 eps / s_in**2 (LN) or N eps / s_in**2 (RMS)
    gamma: np.ndarray      # int64 [C]: gamma / s_out * 2**frac (RMS: times sqrt(N))
    beta: np.ndarray       # int64 [C]: beta / s_out * 2**(16 + frac)
    frac: int
    out_zp: int


def norm_params(n: int, in_scale: float, eps: float, gamma, beta, out_scale: float,
                out_zp: int, center: bool, out_wide: bool = False) -> NormParams:
    """Fold scales, eps, gamma and beta; ValueError when they do not fit the unit.
    ``out_wide``: int16 codes out (NORM's ``out_wide``), whose beta may reach 16 times
    the int16 range in output steps, not int8's (:data:`BETA_STEPS`)."""
    if not 1 <= n <= MAX_ROW:
        raise ValueError(f"norm row of {n} not in 1..{MAX_ROW}")
    g = np.broadcast_to(np.asarray(gamma, np.float64).reshape(-1), (n,)) / out_scale
    if not center:
        g = g * math.sqrt(n)
    b = np.broadcast_to(np.asarray(0.0 if beta is None else beta, np.float64).reshape(-1),
                        (n,)) / out_scale
    gmax = float(np.abs(g).max())
    if not np.all(np.isfinite(g)) or not np.all(np.isfinite(b)) or gmax >= 2 ** 30:
        raise ValueError(f"gamma / output scale up to {gmax:g} does not fit the norm unit")
    frac = 30 if gmax == 0 else int(min(30, 30 - math.ceil(math.log2(gmax + 1))))
    steps = BETA_STEPS[out_wide]
    b = np.clip(b, -steps, steps)   # beyond it the output saturates anyway
    # beta * 2**(16 + frac) within the unit's +-2**58 (norm_unit): an int8 output's frac
    # is never limited; an int16 output's gamma / scale is large, so its frac is small
    frac = min(frac, BETA_BITS - _UF - int(math.log2(steps)))
    eps_steps = eps / in_scale ** 2 * (n * n if center else n)
    return NormParams(center, int(min(round(eps_steps), 2 ** 58)),
                      np.round(g * 2 ** frac).astype(np.int64),
                      np.round(b * 2 ** (_UF + frac)).astype(np.int64), frac, int(out_zp))


def int_norm(q: np.ndarray, zp: int, p: NormParams, out_wide: bool = False) -> np.ndarray:
    """int8 LayerNorm (``p.center``) or RMSNorm of int8 (or int16) codes over the last axis
    (int16 codes out with ``out_wide``)."""
    c = np.asarray(q, np.int64) - np.int64(zp)
    n = c.shape[-1]
    s2 = (c * c).sum(axis=-1, keepdims=True)
    if p.center:
        s1 = c.sum(axis=-1, keepdims=True)
        num, v = n * c - s1, n * s2 - s1 * s1 + p.eps_term
    else:
        num, v = c, s2 + p.eps_term
    r, e = int_rsqrt(v)
    u = rshift_round(num * r, _SQ - _UF + e)
    y = rshift_round(u * p.gamma + p.beta, _UF + p.frac)
    return _saturate(y + p.out_zp, out_wide)
