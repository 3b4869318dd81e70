"""The grouped dense: weights on one grid per group of input rows (int4 LLM weights).

Part of the layer contract of ``dsa_tvm.layers.ir`` (which re-exports it); its codegen and
CPU reference are ``tir_schedules.kinds`` like every layer's, its grids ``layers.group_grid``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .qtensor import QTensor, Requant


@dataclass(frozen=True)
class GroupedDense:
    """A dense whose weights carry one scale and one offset per group of ``group``
    consecutive input rows of each output channel (GGUF Q4_1's ``d * q + min``, the form
    int4 LLM weights ship in): one scale per output channel cannot hold that grid.

    Per row ``m``, channel ``n`` and group ``g`` (raw codes, zero points in ``bias``)::

        P = sum_{k in g} x[m, k] * w[n, k]          S = sum_{k in g} x[m, k]
        V = rshift_round(wrap32(wrap32(P * scales[n, g]) + S * offsets[n, g]), shift)
        acc[m, n] = wrap32(sum_g V + bias[n]);   y = requant(acc)

    ``scales`` and ``offsets`` are int16 fixed-point factors (``layers.group_grid`` makes
    them from real weights); a partial last group is allowed here, not on the device.

    ``planes``: the input holds int16 codes as two int8 byte planes (``BytePlanes``:
    (..., 2M, K), hi rows then lo rows); each plane's ``V`` as above, the lo plane's
    shifted by ``shift + 8``, all of them summed (``x = 256 hi + lo``)."""

    name: str
    input: QTensor           # (..., K) or an NCHW image (a 1x1 conv); planes: (..., 2M, K)
    output: QTensor          # (..., N) or an NCHW image; planes: (..., M, N)
    weight: np.ndarray       # int8 [N, K] (int4 codes for Q4_1)
    group: int               # input rows per group
    scales: np.ndarray       # int16 [N, ceil(K / group)]
    offsets: np.ndarray      # int16 [N, ceil(K / group)]
    shift: int               # the right shift of each group's V (0..31)
    bias: np.ndarray         # int32 [N]
    requant: Requant
    planes: bool = False

    @property
    def groups_per_row(self) -> int:
        return -(-int(self.weight.shape[1]) // self.group)

    @property
    def macs(self) -> int:
        # every input element meets each output channel once (an NCHW image's pixels are
        # its rows; planes: both planes' rows)
        return int(np.prod(self.input.shape, dtype=np.int64)) * int(self.weight.shape[0])
