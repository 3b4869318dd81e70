"""Store constant weights that fit int4 two codes a byte, and load them with WGT4.

A part with ``dram.int4_weights`` sign-extends int4 weight tiles on their way into the
weight scratchpad (``Buffer.WGT4``). A W4A8 model's weights are int8 codes in [-8, 7]
after quantization (``quantize(..., weight_bits=4)``), so their tiles can live in DRAM at
half the bytes and every load of them moves half the bytes: what a decode step, which
reads every weight once, is bound by.

The pass runs on a finished region program. It picks the constant int8 regions that only
WGT loads read and whose codes all lie in [-8, 7] (the values decide, not a flag: an int8
model whose weights happen to fit gains too, and nothing changes numerically) and packs
them (``weight_layout.pack_weights`` moves everything else). The layer table follows: a packed
layer's weight bytes and its compulsory DRAM reads halve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..intmath import ceil_div
from ..isa.instructions import Buffer
from ..isa.program import INT4, Program, Region
from ..isa.semantics import INT4_MAX, INT4_MIN, pack_int4
from .weight_layout import Packing, pack_weights, shrink_layer_weights

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig


def _fits_int4(r: Region) -> bool:
    if r.data is None or r.dtype != "int8" or not r.nbytes:
        return False
    codes = np.frombuffer(r.data, dtype=np.int8)
    return bool(codes.min() >= INT4_MIN and codes.max() <= INT4_MAX)


def _encode(r: Region) -> tuple[bytes, str]:
    return pack_int4(np.frombuffer(r.data, dtype=np.int8)).tobytes(), INT4


INT4_PACKING = Packing(Buffer.WGT4, _encode, lambda rel: rel // 2)


def pack_int4_weights(prog: Program, cfg: "HardwareConfig") -> Program:
    """``prog`` with its int4-fitting weight regions packed (in place; returned)."""
    if not cfg.packs_int4_weights:
        return prog
    readers = pack_weights(prog, cfg, _fits_int4, INT4_PACKING)
    if readers:
        shrink_layer_weights(prog, readers, lambda wb: ceil_div(wb, 2), {"int4_weights": True})
    return prog
