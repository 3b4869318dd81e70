"""The quantized tensor and the requantize every integer layer ends in (``layers.ir``).

Kept apart from the layer classes so that their modules (``ir``, ``ir_units``,
``ir_grouped``) share them without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa.semantics import INT16_MAX, INT16_MIN


@dataclass(frozen=True)
class QTensor:
    name: str
    shape: tuple[int, ...]
    scale: float
    zero_point: int
    dtype: str = "int8"     # "int16": a wide tensor (see the module docstring)


#: the clip of REQUANT's wide mode: an int16 output
WIDE_CLIP = (INT16_MIN, INT16_MAX)


@dataclass(frozen=True)
class Requant:
    """Accumulator -> int8: ``clamp(rshift_round(acc * multiplier, shift) + zero_point, lo, hi)``;
    with ``clip == WIDE_CLIP``, int16 (REQUANT's wide mode)."""

    multiplier: np.ndarray  # int32 [C] or [1]
    shift: np.ndarray       # int32 [C] or [1], in semantics.REQUANT_SHIFT_RANGE
    zero_point: int
    clip: tuple[int, int] = (-128, 127)

    @property
    def wide(self) -> bool:
        """An int16 output (REQUANT's wide mode)."""
        return tuple(self.clip) == WIDE_CLIP

    def per_channel(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        """Multiplier and shift broadcast to ``channels`` entries."""
        m = np.broadcast_to(np.asarray(self.multiplier, np.int32), (channels,))
        s = np.broadcast_to(np.asarray(self.shift, np.int32), (channels,))
        return m, s
