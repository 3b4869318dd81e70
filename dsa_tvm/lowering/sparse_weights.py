"""Store N:M-sparse constant weights compressed, load them with WGTS, run their GEMMs sparse.

A part with ``array.sparsity = "N:M"`` multiplies only the kept N of every aligned group
of M reduction elements of a weight tile whose rows all follow the pattern, so M / N such
tiles feeding the same accumulator rows share a cycle. The values decide, not a flag: a
weight region whose every tile is N:M (a pruned model's; a depthwise conv's diagonal
tiles too) is stored compressed (``isa.sparse_tiles``: the kept values and their indices,
160 bytes for a 16x16 2:4 tile), its loads switch to WGTS, and every GEMM whose weight
tiles all come from WGTS loads is marked sparse. Other weights stay dense, unchanged:
dense hardware, or dense layers, run the same program as before. The layer table
follows: a sparse layer's weight bytes shrink and it is marked ``sparsity`` (the report's
compute bound then counts the kept MACs at the array's rate).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..intmath import ceil_div
from ..isa.instructions import Buffer, Gemm, Load
from ..isa.program import Program, Region, sparse_dtype
from ..isa.sparse_tiles import is_n_m, pack_n_m
from ..sim.sparse_check import weight_tiles
from .weight_layout import Packing, layers_holding, pack_weights, shrink_layer_weights

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig


def _tiles(r: Region, cfg: "HardwareConfig") -> np.ndarray | None:
    """A constant int8 region's codes as (tiles, block_out, block_in), if they are tiles."""
    if r.data is None or r.dtype != "int8" or not r.nbytes or r.nbytes % cfg.wgt_tile_bytes:
        return None
    if tuple(r.shape[-2:]) != (cfg.block_out, cfg.block_in):
        return None
    return np.frombuffer(r.data, np.int8).reshape(-1, cfg.block_out, cfg.block_in)


def _packing(cfg: "HardwareConfig") -> Packing:
    n, m = cfg.sparse_n_m
    tile, packed = cfg.wgt_tile_bytes, cfg.sparse_tile_bytes

    def encode(r: Region) -> tuple[bytes, str]:
        return pack_n_m(_tiles(r, cfg), n, m).tobytes(), sparse_dtype(n, m)

    return Packing(Buffer.WGTS, encode, lambda rel: rel // tile * packed)


def mark_sparse_gemms(prog: Program, cfg: "HardwareConfig") -> list[int]:
    """Set ``sparse`` on every GEMM whose weight tiles WGTS loads wrote (program order:
    what the tokens make visible); returns their indices."""
    tagged = np.zeros(cfg.wgt_depth, bool)
    out = []
    instructions = prog.instructions
    for i, ins in enumerate(instructions):
        if isinstance(ins, Load) and ins.buffer in (Buffer.WGT, Buffer.WGT4, Buffer.WGTS):
            tagged[ins.sram_base:ins.sram_base + ins.rows_written] = ins.buffer == Buffer.WGTS
        elif isinstance(ins, Gemm) and tagged[weight_tiles(ins)].all():
            instructions[i] = replace(ins, sparse=True)
            out.append(i)
    return out


def pack_sparse_weights(prog: Program, cfg: "HardwareConfig") -> Program:
    """``prog`` with its N:M weight regions compressed and their GEMMs sparse (in place;
    returned). Runs before the int4 packer, which then leaves these regions alone."""
    if not cfg.packs_sparse_weights:
        return prog
    n, m = cfg.sparse_n_m
    gemms: list[int] = []

    def fits(r: Region) -> bool:
        tiles = _tiles(r, cfg)
        return tiles is not None and is_n_m(tiles, n, m)

    readers = pack_weights(prog, cfg, fits, _packing(cfg),
                           then=lambda p: gemms.extend(mark_sparse_gemms(p, cfg)))
    if not readers:
        return prog
    tile, small = cfg.wgt_tile_bytes, cfg.sparse_tile_bytes
    shrink_layer_weights(prog, readers, lambda wb: ceil_div(wb * small, tile), {})
    for ly in layers_holding(prog, gemms):  # its MACs run at M / N times the array's rate
        ly["sparsity"] = f"{n}:{m}"
    return prog
