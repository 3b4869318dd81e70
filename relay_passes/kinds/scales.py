"""The real scales of a match as the integers the DSA computes with.

Shared by the constraints (do the integers fit?) and the conversions to layers
(fold them), so both read the same numbers. Every real scale is folded here,
once, with ``semantics.quantize_multiplier``; the codegen and the CPU reference
then only ever see integers. Quantization follows ``real = scale * (q - zero_point)``.
"""

from __future__ import annotations

import math

import numpy as np

from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.ir import WIDE_CLIP, Requant

from .match import LoweringError, Match


def requant(factors: np.ndarray, m: Match) -> Requant:
    """REQUANT parameters for real ``factors`` (one per channel or one), clipped by the fused
    activation."""
    mult, shift = sem.quantize_multipliers(factors)
    return Requant(mult, shift, int(m.out.zero_point[0]), clip_bounds(m))


def quantized_bound(v: float, scale: float, zp: int) -> int:
    """The int8 code of a clamp bound ``v`` (+-inf: the int8 range's end)."""
    if math.isinf(v):
        return sem.INT8_MAX if v > 0 else sem.INT8_MIN
    return int(np.clip(np.round(np.float32(v) / np.float32(scale)) + zp, sem.INT8_MIN, sem.INT8_MAX))


def clip_bounds(m: Match) -> tuple[int, int]:
    """The fused activation as int8 bounds in the output's integer domain: ReLU / Clip fold
    into the REQUANT clip because quantization is monotone,
    ``q(clip(v, lo, hi)) = clip(q(v), q(lo), q(hi))``."""
    if m.out.dtype == "int16":   # REQUANT's wide mode (a fused activation is refused)
        return WIDE_CLIP
    if m.act is None:
        return (sem.INT8_MIN, sem.INT8_MAX)
    _, lo, hi = m.act
    s, zp = float(m.out.scale[0]), int(m.out.zero_point[0])
    return (quantized_bound(lo, s, zp), quantized_bound(hi, s, zp))


def accumulator_bias(m: Match, channels: int) -> np.ndarray:
    """The bias in accumulator units ``s_in * s_w[c]`` (float64 integers, not clipped): as
    is when its scale already is that (what quantizers emit), else rescaled to it."""
    b = m.bias.value.astype(np.float64).reshape(-1)
    want = float(m.inputs[0].qp.scale[0]) * np.broadcast_to(
        m.weight.qp.scale.astype(np.float64), (channels,))
    have = np.broadcast_to(m.bias.qp.scale.astype(np.float64), (channels,))
    if np.allclose(have, want, rtol=1e-6, atol=0):
        return b
    return np.round(b * have / want)


def int32_bias(m: Match, channels: int) -> np.ndarray:
    """The layer's int32 bias (zeros without one), in accumulator units."""
    if m.bias is None:
        return np.zeros(channels, np.int32)
    b = accumulator_bias(m, channels)  # the "bias" constraint checked that it fits int32
    if np.abs(b).max() > sem.INT32_MAX:
        raise LoweringError(f"bias {np.abs(b).max():.4g} does not fit int32 (unchecked region?)")
    return b.astype(np.int32)


def channel_addend(value: np.ndarray, out_shape: tuple[int, ...],
                   axis: int | None = None) -> np.ndarray | None:
    """The per-channel vector a constant broadcasts to along ``axis`` (default: the
    layers' channel axis, 1 of an NCHW output, the last one otherwise), or None if it
    varies along any other axis."""
    rank = len(out_shape)
    if value.ndim > rank:
        return None
    full = value.reshape((1,) * (rank - value.ndim) + value.shape)
    axis = (1 if rank == 4 else rank - 1) if axis is None else axis % rank
    if any(d != 1 for i, d in enumerate(full.shape) if i != axis):
        return None
    if full.shape[axis] not in (1, out_shape[axis]):
        return None
    return np.broadcast_to(full.reshape(-1), (out_shape[axis],))


def in_out_factor(m: Match) -> np.ndarray:
    """``s_in / s_out``: the factor of every one-input layer that keeps its values
    (pool windows, ReLU, Clip, rescale)."""
    return np.array([float(m.inputs[0].qp.scale[0]) / float(m.out.scale[0])])
