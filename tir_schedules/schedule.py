"""Schedules that map the TIR layers onto the DSA: tile to the scratchpads, tensorize,
double-buffer.

A schedule is fully described by its knobs (tile sizes, loop order, double
buffering). :func:`schedule_conv2d` applies given knobs; :func:`default_conv_knobs`
picks them from the hardware description with an analytic cost estimate; the
tuner samples them with MetaSchedule instead (``tir_schedules.space``). The
vector-unit layers have their own schedules in :mod:`.schedule_vector`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx

from dsa_tvm.hw.config import HardwareConfig

from .compute import ConvShape
from .intrinsics import gemm_intrin, requant_intrin
from .names import ANN_DOUBLE_BUFFER, SCOPE_ACC, SCOPE_INP, SCOPE_WGT


@dataclass(frozen=True)
class ConvKnobs:
    tile_oh: int         # output rows per tile (divides OH)
    tile_ow: int         # output columns per tile (divides OW)
    tile_ocb: int        # output channel blocks per tile (divides OCB)
    weights_outer: bool  # True: output-channel tiles outermost, weights stay resident
                         # across the spatial tiles; False: input tile stays resident
    double_buffer: bool


def input_tile(s, k) -> tuple[int, int]:
    """(rows, columns) of the input an output tile of ``k.tile_oh`` x ``k.tile_ow`` reads
    through a ``s.kh`` x ``s.kw`` window (strides and dilation of ``s``): a conv's or a
    window layer's."""
    (sh, sw), (dh, dw) = s.strides, s.dilation
    return (k.tile_oh - 1) * sh + (s.kh - 1) * dh + 1, (k.tile_ow - 1) * sw + (s.kw - 1) * dw + 1


def tile_footprint(s: ConvShape, k: ConvKnobs) -> dict[str, int]:
    """Scratchpad rows (inp) / tiles (wgt) / rows (acc) one set of tiles needs."""
    in_rows, in_cols = input_tile(s, k)
    nbuf = 2 if k.double_buffer else 1
    acc_tile = k.tile_oh * k.tile_ow * k.tile_ocb
    return {"inp": nbuf * in_rows * in_cols * _input_blocks(s, k),
            "wgt": nbuf * k.tile_ocb * s.kh * s.kw * s.icb,
            "acc": nbuf * (2 * acc_tile + 3 * k.tile_ocb)}


def _input_blocks(s: ConvShape, k: ConvKnobs) -> int:
    """Channel blocks of one input tile: all of them, or (depthwise) the tile's own."""
    return k.tile_ocb if s.depthwise else s.icb


def fits(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> str | None:
    """None if the tiles fit the scratchpads and instruction fields, else why not."""
    need = tile_footprint(s, k)
    for sram, depth in (("inp", cfg.inp_depth), ("wgt", cfg.wgt_depth), ("acc", cfg.acc_depth)):
        if need[sram] > depth:
            return f"{sram.upper()} tile needs {need[sram]} rows, the scratchpad has {depth}"
    if s.depthwise and not k.weights_outer:
        return "a depthwise input tile belongs to one channel tile: channel tiles go outermost"
    pt, pl, pb, pr = s.padding
    blocks = _input_blocks(s, k)
    if s.depthwise and (blocks < s.ocb or max(pl, pr) * blocks > 255):
        # one LOAD per input row; border rows join the pad fields of the first/last one
        in_cols = input_tile(s, k)[1]
        if max(pt * in_cols + pl, pb * in_cols + pr) > 255:
            return "the tile's border exceeds the 8-bit LOAD pad fields"
    elif max(pl, pr) * blocks > 255 or max(pt, pb) > 255:
        return "padding exceeds the 8-bit LOAD pad fields"
    return None


def divisors(n: int) -> list[int]:
    """Every tile size that splits a loop of ``n`` evenly (the schedules' tile candidates)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def estimate_cycles(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> float:
    """Rough cycles of a schedule: compute and DMA overlap when double-buffered."""
    oh, ow = s.out_hw
    tiles_sp = (oh // k.tile_oh) * (ow // k.tile_ow)
    tiles_oc = s.ocb // k.tile_ocb
    in_rows, in_cols = input_tile(s, k)
    in_bytes = in_rows * in_cols * _input_blocks(s, k) * cfg.block_in
    w_bytes = k.tile_ocb * s.kh * s.kw * s.icb * cfg.wgt_tile_bytes
    out_bytes = k.tile_oh * k.tile_ow * k.tile_ocb * cfg.block_out
    if k.weights_outer:
        dma = s.n * tiles_oc * (w_bytes + tiles_sp * (in_bytes + out_bytes))
    else:
        dma = s.n * tiles_sp * (in_bytes + tiles_oc * (w_bytes + out_bytes))
    steps = s.n * oh * ow * s.ocb * s.kh * s.kw * s.icb
    tiles = s.n * tiles_sp * tiles_oc
    compute = steps + tiles * (cfg.gemm_fill_drain_cycles * 2 + cfg.alu_latency_cycles
                               + k.tile_oh * k.tile_ow * k.tile_ocb * cfg.alu_cycles_per_row)
    dma_cycles = dma / cfg.bandwidth_bytes_per_cycle + tiles * cfg.latency_cycles * 0.1
    return max(compute, dma_cycles) if k.double_buffer else compute + dma_cycles


def candidate_knobs(cfg: HardwareConfig, s: ConvShape) -> list[ConvKnobs]:
    """Every knob setting that fits (tile sizes divide their loops)."""
    oh, ow = s.out_hw
    out = []
    for db in (True, False):
        for wo in (True, False):
            for toc in divisors(s.ocb):
                for th in divisors(oh):
                    for tw in divisors(ow):
                        k = ConvKnobs(th, tw, toc, wo, db)
                        if fits(cfg, s, k) is None:
                            out.append(k)
    return out


def default_conv_knobs(cfg: HardwareConfig, s: ConvShape) -> ConvKnobs:
    cands = candidate_knobs(cfg, s)
    if not cands:
        raise ValueError(f"no tiling of this conv fits the scratchpads of '{cfg.name}': "
                         f"{fits(cfg, s, ConvKnobs(1, 1, 1, True, False))}")

    def key(k: ConvKnobs):
        tiles = k.tile_oh * k.tile_ow * k.tile_ocb
        return (estimate_cycles(cfg, s, k), -tiles)

    return min(cands, key=key)


def schedule_conv2d(func: tirx.PrimFunc, cfg: HardwareConfig, s: ConvShape,
                    k: ConvKnobs) -> s_tir.Schedule:
    """Tile, place in the scratchpads, tensorize; the walker lowers the result."""
    problem = fits(cfg, s, k)
    if problem:
        raise ValueError(f"conv tiling {k} does not fit '{cfg.name}': {problem}")
    sch = s_tir.Schedule(func)
    pad, conv = sch.get_sblock("pad"), sch.get_sblock("conv")
    rq, y = sch.get_sblock("requant"), sch.get_sblock("y")
    n, oh, ow, ob, o, kh, kw, icb, i = sch.get_loops(conv)
    oh_o, oh_i = sch.split(oh, [None, k.tile_oh])
    ow_o, ow_i = sch.split(ow, [None, k.tile_ow])
    ob_o, ob_i = sch.split(ob, [None, k.tile_ocb])
    inner = [ob_i, oh_i, ow_i, kh, kw, icb, o, i]
    if k.weights_outer:
        sch.reorder(n, ob_o, oh_o, ow_o, *inner)
        tile_loop, w_at = ow_o, ob_o
    else:
        sch.reorder(n, oh_o, ow_o, ob_o, *inner)
        tile_loop, w_at = ob_o, ob_o
    sch.set_scope(pad, 0, SCOPE_INP)
    sch.set_scope(conv, 0, SCOPE_ACC)
    sch.set_scope(rq, 0, SCOPE_ACC)
    w_sram = sch.cache_read(conv, 1, SCOPE_WGT)
    sch.compute_at(pad, ow_o)
    sch.compute_at(w_sram, w_at)
    sch.reverse_compute_at(rq, tile_loop)
    sch.reverse_compute_at(y, tile_loop)
    p_sram = sch.cache_read(rq, 1, SCOPE_ACC)
    sch.compute_at(p_sram, ob_o)
    sch.decompose_reduction(conv, ob_i)
    sch.tensorize(o, gemm_intrin(cfg.block_in, cfg.block_out))
    sch.tensorize(sch.get_loops(rq)[-1],
                  requant_intrin(cfg.block_out, s.output_zp, s.clip[0], s.clip[1]))
    if k.double_buffer:  # the weight tile too: the next one loads during this one's tiles
        for loop in {tile_loop, w_at}:
            sch.annotate(loop, ANN_DOUBLE_BUFFER, 1)
    return sch


def lower_for_walker(sch: s_tir.Schedule):
    """Compact every scratchpad buffer to its tile and place it under its tile loop."""
    import tvm

    mod = sch.mod
    for p in (tvm.s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              tvm.s_tir.transform.ConvertBlocksToOpaque(),
              tvm.s_tir.transform.CompactBufferAllocation(),
              tvm.s_tir.transform.LowerMatchBuffer()):
        mod = p(mod)
    return mod["main"]
