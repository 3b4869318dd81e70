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
#: what bias + worst-case int8 x int8 sum may reach in the int32 accumulator (half its
#: range: rounding and the float32 scales never bring it near wrapping)
BIAS_BUDGET = 2 ** 30


@dataclass(frozen=True)
class ActQuant:
    """Per-tensor int8 quantization of one activation (int16 with ``bits=16``: a wide
    tensor, e.g. an LLM's residual stream)."""

    scale: float
    zero_point: int
    bits: int = 8

    @property
    def dtype(self) -> type:
        return np.int16 if self.bits == 16 else np.int8

    def quantize(self, x: np.ndarray) -> np.ndarray:
        info = np.iinfo(self.dtype)
        q = np.round(np.asarray(x, np.float64) / self.scale) + self.zero_point
        return np.clip(q, info.min, info.max).astype(self.dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return ((q.astype(np.int32) - self.zero_point) * np.float32(self.scale)).astype(np.float32)


def activation_qparams(lo: float, hi: float, symmetric: bool = False,
                       min_scale: float = MIN_SCALE, bits: int = 8) -> ActQuant:
    """int8 qparams covering [lo, hi] (widened to include 0, so zero padding and ReLU
    zeros are exact). Symmetric: zero point 0, range [-127, 127] * scale. ``min_scale``:
    a floor above :data:`MIN_SCALE` (see :func:`bias_input_scale_floor`). ``bits=16``:
    symmetric int16, range [-32767, 32767] * scale (a wide tensor)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    floor = max(MIN_SCALE, float(min_scale))
    if bits == 16:
        scale = max(abs(lo), abs(hi)) / 32767.0
        return ActQuant(_f32_at_least(max(scale, floor)), 0, 16)
    if bits != 8:
        raise ValueError(f"activations are int8 or int16 (bits 8 or 16), got bits={bits}")
    if symmetric:
        scale = max(abs(lo), abs(hi)) / 127.0
        return ActQuant(_f32_at_least(max(scale, floor)), 0)
    scale = _f32_at_least(max((hi - lo) / (QMAX - QMIN), floor))
    zp = int(np.clip(np.round(QMIN - lo / scale), QMIN, QMAX))
    return ActQuant(scale, zp)


def _f32_at_least(x: float) -> float:
    """The float32 nearest ``x`` that is not below it (a floor must survive the rounding)."""
    f = np.float32(x)
    return float(f if f >= x else np.nextafter(f, np.float32(np.inf)))


def widen(qp: ActQuant, min_scale: float, symmetric: bool) -> ActQuant:
    """``qp`` with its scale raised to ``min_scale`` (the same real range stays covered)."""
    if qp.scale >= min_scale:
        return qp
    lo, hi = (QMIN - qp.zero_point) * qp.scale, (QMAX - qp.zero_point) * qp.scale
    return activation_qparams(lo, hi, symmetric, min_scale)


#: weight widths the quantizer makes: int8, or int4 codes (stored as int8 in the QDQ
#: model; a part with ``dram.int4_weights`` keeps them two a byte in DRAM)
WEIGHT_BITS = (4, 8)


def weight_qmax(bits: int = 8) -> int:
    """The largest symmetric weight code: 127 for int8, 7 for int4."""
    if bits not in WEIGHT_BITS:
        raise ValueError(f"weight_bits must be one of {WEIGHT_BITS}, got {bits!r}")
    return (1 << (bits - 1)) - 1


def weight_qparams(w: np.ndarray, axis: int | None, bits: int = 8) -> np.ndarray:
    """Symmetric weight scales: max|w| / qmax (127 for int8, 7 for int4) per slice along
    ``axis`` (or one for the whole tensor when ``axis`` is None). float32. (For int4, a
    clipping ratio searched per channel for the least squared rounding error was tried and
    made SmolLM2's perplexity 9x worse: its largest weights matter; docs/llm.md, W4A8.)"""
    a = np.abs(np.asarray(w, np.float64))
    if axis is None:
        m = np.array([a.max() if a.size else 0.0])
    else:
        m = np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1).max(1)
    return np.maximum(m / weight_qmax(bits), MIN_SCALE).astype(np.float32)


#: clipping ratios :func:`clip_ratios` tries, from max|w| down to 30% of it
CLIP_RATIOS = np.linspace(1.0, 0.3, 36)


def clip_ratios(w: np.ndarray, axis: int, bits: int) -> np.ndarray:
    """Per slice along ``axis``, the ratio r (of :data:`CLIP_RATIOS`) whose scale
    ``r * max|w| / qmax`` gives the least squared rounding error, clipping included
    (float64; 1.0 where no smaller ratio beats max|w|). At 4 bits on a CNN this beats
    max|w| (EfficientNet-Lite0's all-4-bit cosine 0.58 -> 0.69); an LLM's largest weights
    matter more (see :func:`weight_qparams`), so PTQ keeps max|w|. QAT's
    ``weight_clip="mse"`` uses it (``dsa-tvm qat``'s default for 4-bit layers)."""
    wc = np.moveaxis(np.asarray(w, np.float64), axis, 0)
    wc = wc.reshape(wc.shape[0], -1)
    base = weight_qparams(w, axis, bits).astype(np.float64)[:, None]
    qmax = weight_qmax(bits)
    best_err = np.full(len(wc), np.inf)
    best = np.ones(len(wc))
    for r in CLIP_RATIOS:
        s = base * r
        err = ((np.clip(np.round(wc / s), -qmax, qmax) * s - wc) ** 2).sum(1)
        better = err < best_err * (1 - 1e-12)  # ties keep the larger ratio
        best_err[better], best[better] = err[better], r
    return best


def quantize_weight(w: np.ndarray, scales: np.ndarray, axis: int | None,
                    bits: int = 8) -> np.ndarray:
    """Weight codes for ``scales`` (per channel along ``axis``), clipped to [-qmax, qmax],
    as int8."""
    shape = [1] * w.ndim
    if axis is not None and scales.size > 1:
        shape[axis] = scales.size
    q = np.round(w.astype(np.float64) / scales.astype(np.float64).reshape(shape))
    qmax = weight_qmax(bits)
    return np.clip(q, -qmax, qmax).astype(np.int8)


def bias_qparams(x_scale: float, w_scales: np.ndarray, channels: int) -> np.ndarray:
    """Bias scales s_x * s_w[c] (float32, one per output channel) so the int32 bias adds
    straight into the int8 x int8 accumulator. Never clamped: any other scale would make
    the compiler rescale the bias into accumulator units (see :func:`bias_input_scale_floor`
    for keeping the bias in range instead)."""
    s = np.float32(x_scale) * np.broadcast_to(w_scales.astype(np.float32), (channels,))
    return s.astype(np.float32)


def worst_case_sum(wq: np.ndarray, channel_axis: int) -> np.ndarray:
    """Per output channel, the largest |sum (x - zp) * w| an int8 input can produce
    (|x - zp| <= 255 for any int8 zero point): the accumulator's share beside the bias."""
    a = np.abs(np.moveaxis(np.asarray(wq, np.int64), channel_axis, 0))
    return 255 * a.reshape(a.shape[0], -1).sum(1)


def bias_input_scale_floor(bias: np.ndarray, w_scales: np.ndarray, wq: np.ndarray,
                           channel_axis: int) -> float:
    """The smallest input scale at which the int32 bias ``round(b / (s_x * s_w))`` fits
    :data:`BIAS_BUDGET` beside the worst-case int8 x int8 sum. A tiny input scale (tiny or
    all-zero calibration activations) would otherwise push the bias past int32."""
    b = np.abs(np.asarray(bias, np.float64).reshape(-1))
    ws = np.broadcast_to(np.asarray(w_scales, np.float64).reshape(-1), b.shape)
    budget = BIAS_BUDGET - np.broadcast_to(worst_case_sum(wq, channel_axis), b.shape)
    ok = budget > 0  # a reduction too long for any bias: the compiler's range check decides
    if not np.any(ok & (b > 0)):
        return 0.0
    return float(np.max(b[ok] / (ws[ok] * budget[ok])))


def bias_weight_scale_floor(bias: np.ndarray, x_scale: float, fan_in: int) -> np.ndarray:
    """Per output channel, the smallest weight scale at which the int32 bias
    ``round(b / (s_x * s_w))`` fits :data:`BIAS_BUDGET` beside the largest int8 x int8 sum
    of ``fan_in`` terms (|x - zp| <= 255, |w| <= 127). Raising one channel's weight scale
    costs only that channel's resolution (nothing for a dead channel whose weights are all
    zero), where raising the input scale would cost every channel reading the tensor."""
    budget = BIAS_BUDGET - 255 * 127 * int(fan_in)
    b = np.abs(np.asarray(bias, np.float64).reshape(-1))
    if budget <= 0:  # a reduction too long for any bias: the compiler's range check decides
        return np.zeros(b.shape, np.float32)
    floor = b / (float(x_scale) * budget)
    f = floor.astype(np.float32)
    return np.where(f < floor, np.nextafter(f, np.float32(np.inf)), f).astype(np.float32)


def quantize_bias(b: np.ndarray, scales: np.ndarray) -> np.ndarray:
    q = np.round(b.astype(np.float64) / scales.astype(np.float64))
    return np.clip(q, -(2 ** 31), 2 ** 31 - 1).astype(np.int32)
