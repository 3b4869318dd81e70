"""Scales and zero points: activations (asymmetric or symmetric int8, per tensor),
weights (symmetric int8, per output channel), biases (int32 at input x weight scale).

The integer formulas here are the ones the DSA's REQUANT and the QDQ graph agree on:
q = clamp(round_half_even(x / scale) + zp, -128, 127) (ONNX QuantizeLinear).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QMIN, QMAX = -128, 127
#: smallest scale we emit: a constant-zero tensor still gets a positive scale
MIN_SCALE = 1e-8


@dataclass(frozen=True)
class ActQuant:
    """Per-tensor int8 quantization of one activation."""

    scale: float
    zero_point: int

    def quantize(self, x: np.ndarray) -> np.ndarray:
        q = np.round(np.asarray(x, np.float64) / self.scale) + self.zero_point
        return np.clip(q, QMIN, QMAX).astype(np.int8)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return ((q.astype(np.int32) - self.zero_point) * np.float32(self.scale)).astype(np.float32)


def activation_qparams(lo: float, hi: float, symmetric: bool = False) -> ActQuant:
    """int8 qparams covering [lo, hi] (widened to include 0, so zero padding and ReLU
    zeros are exact). Symmetric: zero point 0, range [-127, 127] * scale."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric:
        scale = max(abs(lo), abs(hi)) / 127.0
        return ActQuant(float(np.float32(max(scale, MIN_SCALE))), 0)
    scale = float(np.float32(max((hi - lo) / (QMAX - QMIN), MIN_SCALE)))
    zp = int(np.clip(np.round(QMIN - lo / scale), QMIN, QMAX))
    return ActQuant(scale, zp)


def weight_qparams(w: np.ndarray, axis: int | None) -> np.ndarray:
    """Symmetric int8 weight scales: max|w| / 127 per slice along ``axis`` (or one for
    the whole tensor when ``axis`` is None). float32."""
    a = np.abs(np.asarray(w, np.float64))
    if axis is None:
        m = np.array([a.max() if a.size else 0.0])
    else:
        m = np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1).max(1)
    return np.maximum(m / 127.0, MIN_SCALE).astype(np.float32)


def quantize_weight(w: np.ndarray, scales: np.ndarray, axis: int | None) -> np.ndarray:
    """int8 weights for ``scales`` (per channel along ``axis``), clipped to [-127, 127]."""
    shape = [1] * w.ndim
    if axis is not None and scales.size > 1:
        shape[axis] = scales.size
    q = np.round(w.astype(np.float64) / scales.astype(np.float64).reshape(shape))
    return np.clip(q, -127, 127).astype(np.int8)


def bias_qparams(x_scale: float, w_scales: np.ndarray, channels: int) -> np.ndarray:
    """Bias scales s_x * s_w[c] (float32, one per output channel) so the int32 bias adds
    straight into the int8 x int8 accumulator."""
    s = np.float32(x_scale) * np.broadcast_to(w_scales.astype(np.float32), (channels,))
    return np.maximum(s, np.float32(MIN_SCALE)).astype(np.float32)


def quantize_bias(b: np.ndarray, scales: np.ndarray) -> np.ndarray:
    q = np.round(b.astype(np.float64) / scales.astype(np.float64))
    return np.clip(q, -(2 ** 31), 2 ** 31 - 1).astype(np.int32)
