"""Integer helpers of the CPU reference: requantize, centre on the zero point, pad, window.

Each layer kind's reference (``tir_schedules.kinds``: ``run_layer``, ``run_region``)
executes its layers with exactly the semantics documented in
:mod:`dsa_tvm.layers.ir` on these helpers, using the simulator's own rounding and
wrapping code (:mod:`dsa_tvm.isa.semantics`), so a DSA program and the reference
must agree bit for bit. Plain numpy.
"""

from __future__ import annotations

import numpy as np

from ..isa import semantics as sem
from .ir import QTensor, Requant
from .layouts import same_bytes

__all__ = ["PLANE_SHIFT", "apply_requant", "byte_planes", "centered", "join_planes",
           "join_planes_shifted", "pad", "stacked_byte_planes", "windows"]

#: int16 codes as two int8 byte planes: ``y = 2**PLANE_SHIFT * hi + lo``
PLANE_SHIFT = 8


def apply_requant(acc: np.ndarray, rq: Requant, axis: int) -> np.ndarray:
    """int8 ``clamp(requantize(acc), lo, hi)`` (int16 in the wide mode); per-channel
    parameters run along ``axis``."""
    acc = sem.wrap_int32(acc)
    m = np.asarray(rq.multiplier, np.int64).reshape(-1)
    s = np.asarray(rq.shift, np.int64).reshape(-1)
    if m.size > 1 or s.size > 1:
        c = acc.shape[axis]
        shape = [1] * acc.ndim
        shape[axis] = c
        m = np.broadcast_to(m, (c,)).reshape(shape)
        s = np.broadcast_to(s, (c,)).reshape(shape)
    else:
        m, s = m[0], s[0]
    lo, hi = rq.clip
    y = sem.requantize(acc, m, s, rq.zero_point, lo, hi)
    return y.astype(np.int16 if rq.wide else np.int8)


def byte_planes(y: np.ndarray) -> np.ndarray:
    """int16 codes ``y`` (rows on the last axis) as int8 byte planes, rows interleaved: row
    ``r`` becomes rows ``2r``, ``hi = clamp(rshift_round(y, 8), int8)``, and ``2r + 1``,
    ``lo = clamp(y - 256 hi, int8)`` (``y`` from 32640 up counts as 32639): what the
    softmax room's REQUANT (shift 8), MAC (-256) and CLIP compute."""
    hi, lo = split_planes(y)
    both = np.stack([hi, lo], axis=-2).astype(np.int8)     # (..., rows, 2, n)
    return both.reshape(y.shape[:-2] + (2 * y.shape[-2] if y.ndim > 1 else 2, y.shape[-1]))


def stacked_byte_planes(y: np.ndarray) -> np.ndarray:
    """int16 codes ``y`` (..., M, n) as int8 byte planes stacked on the rows axis, (...,
    2M, n): the hi rows, then the lo rows (``layers.ir.BytePlanes``)."""
    hi, lo = split_planes(y)
    return np.concatenate([hi, lo], axis=-2).astype(np.int8)


def split_planes(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) of int16 codes: ``hi = clamp(rshift_round(y, 8), int8)``,
    ``lo = clamp(y - 256 hi, int8)``; int32 for an int16 (or int8) array, which is every
    step's KV cache at decode (int32 passes, no lower clamp: neither plane can fall below
    -128), else int64."""
    y = np.asarray(y)
    if y.dtype in (np.int16, np.int8):
        y = y.astype(np.int32)
        hi = (y + (1 << (PLANE_SHIFT - 1))) >> PLANE_SHIFT      # >= -128 for any int16
        np.minimum(hi, sem.INT8_MAX, out=hi)
        lo = y - (hi << PLANE_SHIFT)                             # in -128..255
        return hi, np.minimum(lo, sem.INT8_MAX, out=lo)
    y = np.asarray(y, np.int64)
    hi = np.clip(sem.rshift_round(y, PLANE_SHIFT), sem.INT8_MIN, sem.INT8_MAX)
    return hi, np.clip(y - (hi << PLANE_SHIFT), sem.INT8_MIN, sem.INT8_MAX)


def join_planes(acc: np.ndarray) -> np.ndarray:
    """Sums of interleaved byte-plane rows (axis -2) joined as the DSA does (int32 wrap):
    ``256 acc[2m] + acc[2m + 1]``."""
    acc = sem.wrap_int32(np.asarray(acc, np.int64))
    return sem.wrap_int32(sem.wrap_int32(acc[..., 0::2, :] << PLANE_SHIFT) + acc[..., 1::2, :])


def join_planes_shifted(acc: np.ndarray, lo_shift: int) -> np.ndarray:
    """Sums of stacked byte planes (axis -2: the first half of the rows hi, the second lo)
    joined as a dense's accumulator does (int32 wrap): ``(acc_hi << (8 - lo_shift)) +
    rshift_round(acc_lo, lo_shift)``, the product on the grid of ``2**lo_shift`` input
    steps: exact at 0, and at most half a step off otherwise, where the exact
    ``256 acc_hi`` could leave int32 (``Dense.lo_shift``)."""
    acc = sem.wrap_int32(np.asarray(acc, np.int64))
    m = acc.shape[-2] // 2
    hi = sem.wrap_int32(acc[..., :m, :] << (PLANE_SHIFT - lo_shift))
    return sem.wrap_int32(hi + sem.rshift_round(acc[..., m:, :], lo_shift))


def centered(x: np.ndarray, t: QTensor) -> np.ndarray:
    """``x - zero_point`` as int64 (the value every layer starts from), in ``t``'s view."""
    if tuple(x.shape) != tuple(t.shape) and same_bytes(tuple(x.shape), tuple(t.shape)):
        x = x.reshape(t.shape)  # an (N, C, 1, 1) image a dense reads as (N, C) rows
    if tuple(x.shape) != tuple(t.shape):
        raise ValueError(f"tensor '{t.name}': expected shape {t.shape}, got {x.shape}")
    return x.astype(np.int64) - np.int64(t.zero_point)


def windows(xc: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
             dilation: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """[N, C, OH, OW, KH, KW] view of the (already padded) NCHW input."""
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilation
    oh, ow = out_hw
    n, c = xc.shape[:2]
    out = np.empty((n, c, oh, ow, kh, kw), xc.dtype)
    for i in range(kh):
        for j in range(kw):
            out[..., i, j] = xc[:, :, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                                j * dw: j * dw + (ow - 1) * sw + 1: sw]
    return out


def pad(xc: np.ndarray, padding: tuple[int, int, int, int], value: int) -> np.ndarray:
    top, left, bottom, right = padding
    return np.pad(xc, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)
