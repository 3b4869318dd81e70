"""How many instructions a knob setting's program has, without lowering it.

The search uses this to skip settings whose programs are much larger than
another setting's for no estimated gain (``dsa_tvm.tuning.search``): lowering
and simulating a candidate costs time in proportion to its instructions, and a
tall, thin tile can take eight times the instructions of its wide, short twin
for the same cycles.

Each stage of a tile is counted with the walker's own nest geometry
(``tir_schedules.nests``: level merging, peeling into instructions, 2-D DMA
shapes, the first-step split of reductions) applied to the stage's loop
levels as the schedule lays them out; tiles are counted as interior ones
(border tiles differ by a few padded rows).
"""

from __future__ import annotations

import math

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa.instructions import ALU_LEVELS, GEMM_LEVELS

from .compute import ConvShape
from .compute_vector import EltwiseShape, GlobalSumShape, WindowShape
from .matmul import MatmulKnobs, MatmulShape
from .nests import dma_shapes, first_step_split, merge_levels
from .schedule import ConvKnobs, input_tile
from .schedule_vector import EltwiseKnobs, GlobalSumKnobs, WindowKnobs


def nest_count(levels: list[tuple], max_levels: int) -> int:
    """Instructions one stage becomes: its merged levels beyond ``max_levels`` are peeled."""
    merged = merge_levels(levels)
    return math.prod(lv[0] for lv in merged[:max(0, len(merged) - max_levels)])


def reduction_count(levels: list[tuple]) -> int:
    """Instructions of an ALU reduction whose first step writes the initial value."""
    return sum(nest_count(box, ALU_LEVELS) for _, box, _ in first_step_split(levels, (0, 0, 0)))


def copy_count(levels: list[tuple[int, int, int]]) -> int:
    """2-D transfers of a copy without padding: ``(extent, sram stride, dram stride)`` in
    rows, outermost first."""
    return sum(1 for _ in dma_shapes([(e, s, d, 0, 0) for e, s, d in levels], 0, 0, "count"))


def _tile_copy(rows: int, cols: int, blocks: int, row_len: int, all_blocks: int) -> int:
    """Transfers of a (rows, cols, blocks) tile of an image ``row_len`` pixels wide with
    ``all_blocks`` channel blocks per pixel."""
    return copy_count([(rows, cols * blocks, row_len * all_blocks),
                       (cols, blocks, all_blocks), (blocks, 1, 1)])


def conv_instructions(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> int:
    oh, ow = s.out_hw
    (sh, sw), (dh, dw) = s.strides, s.dilation
    th, tw, toc = k.tile_oh, k.tile_ow, k.tile_ocb
    in_rows, in_cols = input_tile(s, k)
    blocks = toc if s.depthwise else s.icb       # channel blocks of the input tile
    image_blocks = s.ocb if s.depthwise else s.icb
    loads = _tile_copy(in_rows, in_cols, blocks, s.w, image_blocks)
    ic = 1 if s.depthwise else s.icb
    # GEMM levels (extent, acc, inp, wgt strides): ob_i, oh_i, ow_i, kh, kw, icb
    gemm = nest_count([(toc, 1, 1 if s.depthwise else 0, s.kh * s.kw * ic),
                       (th, tw * toc, sh * in_cols * blocks, 0),
                       (tw, toc, sw * blocks, 0),
                       (s.kh, 0, dh * in_cols * blocks, s.kw * ic),
                       (s.kw, 0, dw * blocks, ic),
                       (ic, 0, 1, 1)], GEMM_LEVELS)
    stores = _tile_copy(th, tw, toc, ow, s.ocb)
    per_tile = gemm + 1 + stores  # GEMM, REQUANT, stores
    tiles_sp, tiles_oc = s.n * (oh // th) * (ow // tw), s.ocb // toc
    if k.weights_outer:  # weights and table per channel tile, input per spatial tile
        return tiles_oc * 2 + tiles_oc * tiles_sp * (loads + per_tile) + 1
    return tiles_sp * (loads + tiles_oc * (2 + per_tile)) + 1


def window_instructions(cfg: HardwareConfig, s: WindowShape, k: WindowKnobs) -> int:
    oh, ow = s.out_hw
    (sh, sw), (dh, dw) = s.strides, s.dilation
    th, tw, tc = k.tile_oh, k.tile_ow, k.tile_cb
    in_rows, in_cols = input_tile(s, k)
    loads = _tile_copy(in_rows, in_cols, tc, s.w, s.cb)
    # taps: (extent, dst, a, b strides) over kh, kw, oh_i, ow_i, cb_i
    inp = [dh * in_cols * tc, dw * tc, sh * in_cols * tc, sw * tc, 1]
    dst = [0, 0, tw * tc, tc, 1]
    ext = [s.kh, s.kw, th, tw, tc]
    if s.kind == "dw":  # MAC: a is the input tile, b the resident weights
        wgt = [s.kw * tc, tc, 0, 0, 1]
        levels = list(zip(ext, dst, inp, wgt))
    else:               # accumulate in place: a is the destination, b the input tile
        levels = list(zip(ext, dst, dst, inp))
    taps = reduction_count(levels)
    stores = _tile_copy(th, tw, tc, ow, s.cb)
    tiles = s.n * (oh // th) * (ow // tw) * (s.cb // tc)
    resident = 2 if s.kind == "dw" else 1
    return tiles * (loads + taps + 1 + stores) + s.n * (s.cb // tc) * resident + 1


def global_sum_instructions(cfg: HardwareConfig, s: GlobalSumShape, k: GlobalSumKnobs) -> int:
    tiles = s.n * (s.hw // k.tile_hw) * (s.cb // k.tile_cb)
    outer = s.n * (s.cb // k.tile_cb)
    # per tile: its load and ADD; per channel tile: the first step's MOV, table, REQUANT, store
    return 2 * tiles + outer * ((k.tile_hw > 1) + 3) + 1


def eltwise_instructions(cfg: HardwareConfig, s: EltwiseShape, k: EltwiseKnobs) -> int:
    tiles = (s.p // k.tile_p) * (s.cb // k.tile_cb)
    n_in, passes = {"rescale": (1, 1), "scale": (1, 2), "add": (2, 3)}[s.kind]
    return tiles * (n_in + passes + 1) + s.cb // k.tile_cb + 1


def matmul_instructions(cfg: HardwareConfig, s: MatmulShape, k: MatmulKnobs) -> int:
    tiles_m, tiles_n = s.m // k.tile_m, s.nb // k.tile_nb
    # per output-block tile: weights, table; per row tile: rows, corrections, GEMM,
    # correction add, REQUANT, store
    return s.batch * tiles_n * (2 + tiles_m * 6) + 1
