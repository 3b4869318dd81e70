"""Constraints on the constant weights and bias of the kinds that have them (conv2d, dense)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dsa_tvm.hw.config import HardwareConfig

from .common import Constraint, Test
from .match import Match, Operand
from .scales import accumulator_bias


def _weights(channel_axis: Callable[[Match], int]) -> Test:
    def test(m: Match, cfg: HardwareConfig) -> str | None:
        w: Operand = m.weight
        if w.value is None:
            return "weights are not a constant"
        if w.qp.dtype != "int8":
            return f"weights are {w.qp.dtype}, the array takes {cfg.weight_dtype}"
        if np.any(w.qp.zero_point != 0):
            zps = sorted(set(w.qp.zero_point.tolist()))[:4]
            return f"weight zero point must be 0 (symmetric weights), got {zps}"
        if not np.all(w.qp.scale > 0):
            return "weight scales must be positive"
        if not w.qp.per_tensor:
            ax = channel_axis(m)
            if w.qp.axis % len(w.shape) != ax or w.qp.scale.size != w.shape[ax]:
                return (f"weight scales must be per tensor or per output channel (axis {ax}), "
                        f"got {w.qp.scale.size} scales on axis {w.qp.axis}")
        return None

    return test


def _bias(channels: Callable[[Match], int], rows: Callable[[Match, np.ndarray], np.ndarray]) -> Test:
    def test(m: Match, cfg: HardwareConfig) -> str | None:
        b = m.bias
        if b is None:
            return None
        if b.value is None or b.qp.dtype != "int32":
            return f"bias must be an int32 constant, got {b.qp.dtype}"
        if np.any(b.qp.zero_point != 0):
            return "bias zero point must be 0"
        n = channels(m)
        if b.value.size != n or not np.all(b.qp.scale > 0):
            return f"bias must have one int32 value per output channel ({n}), got shape {b.value.shape}"
        return _bias_range(m, n, rows)

    return test


def _bias_range(m: Match, channels: int, rows: Callable[[Match, np.ndarray], np.ndarray]) -> str | None:
    """bias + the largest int8 x int8 sum must fit the int32 accumulator, which wraps."""
    if m.weight is None or m.weight.value is None:
        return None
    b = accumulator_bias(m, channels)
    w = rows(m, np.abs(m.weight.value.astype(np.int64)))
    x_max = max(abs(-128 - int(m.inputs[0].qp.zero_point[0])), 127 - int(m.inputs[0].qp.zero_point[0]))
    peak = np.abs(b) + x_max * w.sum(1)
    c = int(np.argmax(peak))
    if peak[c] <= 2 ** 31 - 1:
        return None
    ratio = float(m.bias.qp.scale.reshape(-1)[c % m.bias.qp.scale.size]) / (
        float(m.inputs[0].qp.scale[0]) * float(m.weight.qp.scale.reshape(-1)[c % m.weight.qp.scale.size]))
    return (f"bias of channel {c} is {b[c]:.4g} in accumulator units (bias scale = {ratio:.4g} x "
            f"input scale x weight scale); with the largest int8 sum it reaches {peak[c]:.4g}, "
            "past the int32 accumulator (it would wrap)")


def weight_constraints(channel_axis: Callable[[Match], int], channels: Callable[[Match], int],
                       rows: Callable[[Match, np.ndarray], np.ndarray]) -> list[Constraint]:
    """The weight and bias constraints of a kind whose weights' output channels lie on
    ``channel_axis`` and whose output has ``channels`` of them; ``rows`` views the
    weights as one row per output channel."""
    return [
        Constraint("weights", "int8 constant weights, zero point 0, per-tensor or "
                   "per-output-channel scales", _weights(channel_axis)),
        Constraint("bias", "optional int32 constant bias, zero point 0, one per output channel; "
                   "in accumulator units plus the largest int8 sum within int32",
                   _bias(channels, rows)),
    ]
