"""Static checks of structured-sparse GEMMs (``array.sparsity``).

The array runs a ``Gemm(sparse=True)`` from the indices a WGTS load stored beside each
weight tile; a tile that a WGT or WGT4 load wrote has none, so a sparse GEMM that reads
one would multiply the wrong inputs. The weight scratchpad's contents at a GEMM are those
the loads before it in program order wrote (the dependency tokens make it so), so one
pass in program order finds every such GEMM before anything runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..isa.instructions import Buffer, Gemm, Instruction, Load
from .errors import SimulationError

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig


def weight_tiles(ins: Gemm) -> np.ndarray:
    """Every weight-scratchpad tile a GEMM's loop nest reads (sorted, distinct)."""
    tiles = np.array([ins.wgt_base], np.int64)
    for lp in ins.loops:
        if lp.extent > 1 and lp.wgt:
            tiles = (tiles[:, None] + lp.wgt * np.arange(lp.extent)).reshape(-1)
    return np.unique(tiles)


def check_sparse(instrs: list[Instruction], cfg: "HardwareConfig") -> None:
    """Raise SimulationError for a WGTS load or sparse GEMM on a part without
    ``array.sparsity``, or a sparse GEMM reading a tile no WGTS load wrote."""
    uses = [i for i, ins in enumerate(instrs)
            if (isinstance(ins, Gemm) and ins.sparse)
            or (isinstance(ins, Load) and ins.buffer == Buffer.WGTS)]
    if not uses:
        return
    if not cfg.packs_sparse_weights:
        what = "GEMM sparse" if isinstance(instrs[uses[0]], Gemm) else "LOAD WGTS"
        raise SimulationError(uses[0], f"{what} needs a structured-sparse array; hardware "
                                       f"'{cfg.name}' has array.sparsity = "
                                       f"{cfg.values.get('sparsity')!r}: compile for this "
                                       f"description")
    sparse = np.zeros(cfg.wgt_depth, bool)
    for i, ins in enumerate(instrs):
        if isinstance(ins, Load) and ins.buffer in (Buffer.WGT, Buffer.WGT4, Buffer.WGTS):
            sparse[ins.sram_base:ins.sram_base + ins.rows_written] = ins.buffer == Buffer.WGTS
        elif isinstance(ins, Gemm) and ins.sparse:
            tiles = weight_tiles(ins)
            dense = tiles[~sparse[tiles]]
            if dense.size:
                raise SimulationError(i, f"GEMM sparse reads weight tile {int(dense[0])}, "
                                         f"which a dense load (WGT/WGT4) wrote: only tiles a "
                                         f"WGTS load wrote carry the indices the sparse array "
                                         f"needs")
