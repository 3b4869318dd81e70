"""The per-channel output-stage table of the hand-written matmul program (``matmul``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..intmath import ceil_div

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

#: rows of one output block's REQUANT parameter group: bias, mult, shift
QPARAM_ROWS = 3


def pack_qparams(mult: np.ndarray, shift: np.ndarray, cfg: "HardwareConfig",
                 bias: np.ndarray | None = None) -> np.ndarray:
    """Per-channel output-stage parameters [C] -> [CB, 3, block_out] int32: rows bias,
    mult, shift of each block of ``block_out`` channels, the three rows ALU REQUANT reads
    from row b on. ``bias`` defaults to zeros; padding channels get (0, 0, 0)."""
    mult, shift = np.asarray(mult).reshape(-1), np.asarray(shift).reshape(-1)
    if mult.shape != shift.shape:
        raise ValueError(f"mult {mult.shape} and shift {shift.shape} must have one entry per "
                         f"channel")
    c = len(mult)
    bo = cfg.block_out
    q = np.zeros((ceil_div(c, bo) * bo, QPARAM_ROWS), dtype=np.int32)
    if bias is not None:
        bias = np.asarray(bias).reshape(-1)
        if bias.shape != mult.shape:
            raise ValueError(f"bias {bias.shape} must have one entry per channel ({c})")
        q[:c, 0] = bias
    q[:c, 1] = mult
    q[:c, 2] = shift
    return np.ascontiguousarray(q.reshape(-1, bo, QPARAM_ROWS).transpose(0, 2, 1))


def unpack_qparams(qparams: np.ndarray, channels: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bias, mult, shift) per channel of a [CB, 3, block_out] table (first ``channels``)."""
    q = np.asarray(qparams)
    if q.ndim != 3 or q.shape[1] != QPARAM_ROWS:
        raise ValueError(f"qparams must be [blocks, {QPARAM_ROWS}, block_out] (bias, mult, "
                         f"shift rows), got shape {q.shape}")
    rows = [q[:, k, :].reshape(-1)[:channels] for k in range(QPARAM_ROWS)]
    return rows[0], rows[1], rows[2]
