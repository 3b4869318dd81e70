"""The real scales of a match as the integers the DSA computes with.

Shared by the constraints (``supported.py``: do the integers fit?) and the
conversion to layers (``to_layers.py``: fold them), so both read the same numbers.
"""

from __future__ import annotations

import numpy as np

from .patterns import Match

#: Add: both rescale factors are multiplied by 2**n with n chosen so they stay below
#: 2**ADD_MULT_BITS; (x - zp) * mult then cannot overflow the int32 accumulator.
ADD_MULT_BITS = 21


def rescale_factors(m: Match) -> np.ndarray:
    """The real factors the layer's REQUANT must represent (float64, one per channel or one)."""
    s_in = float(m.inputs[0].qp.scale[0])
    s_out = float(m.out.scale[0])
    if m.kind in ("conv2d", "dense"):
        return s_in * m.weight.qp.scale.astype(np.float64) / s_out
    if m.kind == "batch_matmul":
        return np.array([s_in * float(m.inputs[1].qp.scale[0]) / s_out])
    if m.kind == "avg_pool2d":
        kh, kw = (int(v) for v in m.op.attrs.pool_size)
        return np.array([s_in / (s_out * kh * kw)])
    if m.kind == "global_avg_pool":
        h, w = m.inputs[0].shape[2:]
        return np.array([s_in / (s_out * h * w)])
    if m.kind == "add":
        other = m.addend if m.addend is not None else m.inputs[1]
        return np.array([s_in / s_out, float(other.qp.scale[0]) / s_out])
    return np.array([s_in / s_out])


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
