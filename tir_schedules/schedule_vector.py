"""Schedules of the vector-unit layers (``compute_vector``): tile to the accumulator
scratchpad, tensorize with ALU intrinsics, double-buffer.

Every operand lives in the accumulator: int8 tiles arrive through ACC8 loads
(which run on the compute engine and hold it until they land, so fewer, larger
tiles pay the DRAM latency less often), the reduction or combination is one ALU
op per tile (tensorized at the lane loop; the loops around it become the ALU's
loop levels, reduction loops with destination stride 0; the walker runs the
first reduction step as a plain write, so the init costs no pass of its own),
and the fused REQUANT produces the int8 result that the store engine writes
back. Double buffering gives each tile buffer two slots so that the store of
one tile overlaps the next tile's work.

As for conv2d, a schedule is fully described by its knobs; ``default_*_knobs``
picks them with an analytic estimate, and each ``*_fits`` says why a setting
does not fit the scratchpad.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir, tirx

from dsa_tvm.hw.config import HardwareConfig

from .compute_vector import EltwiseShape, GlobalSumShape, WindowShape
from .intrinsics import acc_intrin, alu_intrin, axpby_intrin, requant_intrin
from .names import ANN_DOUBLE_BUFFER, SCOPE_ACC
from .schedule import divisors, input_tile


@dataclass(frozen=True)
class WindowKnobs:
    tile_oh: int         # output rows per tile (divides OH)
    tile_ow: int         # output columns per tile (divides OW)
    tile_cb: int         # channel blocks per tile (divides CB)
    double_buffer: bool


@dataclass(frozen=True)
class GlobalSumKnobs:
    tile_hw: int         # pixels summed per input tile (divides H*W)
    tile_cb: int         # channel blocks per tile (divides CB)
    double_buffer: bool


@dataclass(frozen=True)
class EltwiseKnobs:
    tile_p: int          # pixels per tile (divides P)
    tile_cb: int         # channel blocks per tile (divides CB)
    double_buffer: bool


VectorShape = WindowShape | GlobalSumShape | EltwiseShape
VectorKnobs = WindowKnobs | GlobalSumKnobs | EltwiseKnobs


# ----------------------------------------------------------------------------- footprints
def acc_rows(s: VectorShape, k: VectorKnobs) -> int:
    """Accumulator rows one set of tiles needs (tile buffers twice when double-buffered;
    weights and the output-stage table once per channel tile)."""
    nbuf = 2 if k.double_buffer else 1
    if isinstance(s, WindowShape):
        in_rows, in_cols = input_tile(s, k)
        out = k.tile_oh * k.tile_ow * k.tile_cb
        resident = 3 * k.tile_cb + (k.tile_cb * s.kh * s.kw if s.kind == "dw" else 0)
        return nbuf * (in_rows * in_cols * k.tile_cb + 2 * out) + resident
    if isinstance(s, GlobalSumShape):
        return nbuf * k.tile_hw * k.tile_cb + 5 * k.tile_cb
    tiles = 2 if s.kind == "rescale" else 4  # x, requant | a, b, acc, requant
    return nbuf * tiles * k.tile_p * k.tile_cb + 3 * k.tile_cb


def vector_fits(cfg: HardwareConfig, s: VectorShape, k: VectorKnobs) -> str | None:
    """None if the tiles fit the accumulator scratchpad, else why not."""
    need = acc_rows(s, k)
    if need > cfg.acc_depth:
        return f"ACC tiles need {need} rows, the scratchpad has {cfg.acc_depth}"
    return None


# ----------------------------------------------------------------------------- cost model
def _cycles(cfg: HardwareConfig, tiles: int, loads: list[tuple[int, int]], alu_rows: int,
            alu_instrs: int, store_bytes: int, db: bool, once: float = 0.0) -> float:
    """Rough cycles: the tile's loads (load engine, prefetched, pipelined: one latency per
    tile), its ALU rows (``alu_cycles_per_row``) and its store overlap across tiles when
    double-buffered and follow one another when not; one DRAM channel carries all."""
    bw, lat = cfg.bandwidth_bytes_per_cycle, cfg.latency_cycles
    load = sum(math.ceil(b / bw) for b, _ in loads) + lat
    alu = alu_rows * cfg.alu_cycles_per_row + alu_instrs * cfg.alu_latency_cycles
    store = math.ceil(store_bytes / bw) + lat
    if db:
        total = tiles * max(load, alu, store) + min(load, alu) + store + once
    else:
        total = tiles * (load + alu + store) + once
    bus = tiles * (sum(b for b, _ in loads) + store_bytes) / bw
    return max(total, bus)


def estimate_vector_cycles(cfg: HardwareConfig, s: VectorShape, k: VectorKnobs) -> float:
    b = s.block
    if isinstance(s, WindowShape):
        oh, ow = s.out_hw
        in_rows, in_cols = input_tile(s, k)
        out = k.tile_oh * k.tile_ow * k.tile_cb
        tiles = s.n * (oh // k.tile_oh) * (ow // k.tile_ow) * (s.cb // k.tile_cb)
        # a tile narrower than the image in channels is one LOAD per input row
        n_loads = 1 if k.tile_cb == s.cb else in_rows
        resident = (s.kh * s.kw if s.kind == "dw" else 0) * k.tile_cb * b + 12 * k.tile_cb * b
        once = (s.cb // k.tile_cb) * (resident / cfg.bandwidth_bytes_per_cycle
                                      + 2 * cfg.latency_cycles)
        # taps (the first one writes the init) and the requant pass
        return _cycles(cfg, tiles, [(in_rows * in_cols * k.tile_cb * b, n_loads)],
                       out * (s.kh * s.kw + 1), s.kh * s.kw + 2, out * b, k.double_buffer, once)
    if isinstance(s, GlobalSumShape):
        tiles = s.n * (s.hw // k.tile_hw) * (s.cb // k.tile_cb)
        outer = s.n * (s.cb // k.tile_cb)
        once = outer * (k.tile_cb * cfg.alu_cycles_per_row + 2 * cfg.latency_cycles
                        + (k.tile_cb * b + 12 * k.tile_cb * b) / cfg.bandwidth_bytes_per_cycle)
        return _cycles(cfg, tiles, [(k.tile_hw * k.tile_cb * b, 1)], k.tile_hw * k.tile_cb, 1,
                       0, k.double_buffer, once)
    rows = k.tile_p * k.tile_cb
    tiles = (s.p // k.tile_p) * (s.cb // k.tile_cb)
    n_in, passes = {"rescale": (1, 1), "scale": (1, 2), "add": (2, 3)}[s.kind]
    once = (s.cb // k.tile_cb) * (12 * k.tile_cb * b / cfg.bandwidth_bytes_per_cycle
                                  + cfg.latency_cycles)
    return _cycles(cfg, tiles, [(rows * b, 1)] * n_in, passes * rows, passes, rows * b,
                   k.double_buffer, once)


# ----------------------------------------------------------------------------- knobs
def candidate_vector_knobs(cfg: HardwareConfig, s: VectorShape) -> list[VectorKnobs]:
    """Every knob setting that fits (tile sizes divide their loops)."""
    out: list[VectorKnobs] = []
    for db in (True, False):
        for tc in divisors(s.cb):
            if isinstance(s, WindowShape):
                oh, ow = s.out_hw
                cands = [WindowKnobs(th, tw, tc, db) for th in divisors(oh) for tw in divisors(ow)]
            elif isinstance(s, GlobalSumShape):
                cands = [GlobalSumKnobs(t, tc, db) for t in divisors(s.hw)]
            else:
                cands = [EltwiseKnobs(t, tc, db) for t in divisors(s.p)]
            out += [k for k in cands if vector_fits(cfg, s, k) is None]
    return out


def _smallest(s: VectorShape) -> VectorKnobs:
    if isinstance(s, WindowShape):
        return WindowKnobs(1, 1, 1, False)
    if isinstance(s, GlobalSumShape):
        return GlobalSumKnobs(1, 1, False)
    return EltwiseKnobs(1, 1, False)


def default_vector_knobs(cfg: HardwareConfig, s: VectorShape) -> VectorKnobs:
    """The candidate with the lowest estimate (larger tiles on ties: fewer instructions)."""
    cands = candidate_vector_knobs(cfg, s)
    if not cands:
        raise ValueError(f"no tiling of this {type(s).__name__} fits the accumulator of "
                         f"'{cfg.name}': {vector_fits(cfg, s, _smallest(s))}")

    def size(k: VectorKnobs) -> int:
        return math.prod(v for v in k.__dict__.values() if not isinstance(v, bool))

    return min(cands, key=lambda k: (estimate_vector_cycles(cfg, s, k), -size(k)))


# ----------------------------------------------------------------------------- schedules
def _check(cfg: HardwareConfig, s: VectorShape, k: VectorKnobs) -> None:
    problem = vector_fits(cfg, s, k)
    if problem:
        raise ValueError(f"tiling {k} does not fit '{cfg.name}': {problem}")


def _output(sch: s_tir.Schedule, s: VectorShape, src_dtype: str, params_at, out_at,
            placed: bool = False) -> None:
    """Place the output-stage table at ``params_at``, the requant (unless ``placed``
    already) and the store at ``out_at``, and tensorize the requant."""
    rq, y = sch.get_sblock("requant"), sch.get_sblock("y")
    sch.set_scope(rq, 0, SCOPE_ACC)
    if not placed:
        sch.reverse_compute_at(rq, out_at)
    sch.reverse_compute_at(y, out_at)
    prm = sch.cache_read(rq, 1, SCOPE_ACC)
    sch.compute_at(prm, params_at)
    sch.tensorize(sch.get_loops(rq)[-1],
                  requant_intrin(s.block, s.output_zp, s.clip[0], s.clip[1], src_dtype))


def schedule_window(func: tirx.PrimFunc, cfg: HardwareConfig, s: WindowShape,
                    k: WindowKnobs) -> s_tir.Schedule:
    """Tiles of (output rows, columns, channel blocks); weights and the output-stage
    table stay resident per channel tile; the reduction runs with the taps outermost so
    that output pixels and channels form the ALU's vector levels."""
    _check(cfg, s, k)
    sch = s_tir.Schedule(func)
    pad, acc = sch.get_sblock("pad"), sch.get_sblock("acc")
    n, oh, ow, cb, c, kh, kw = sch.get_loops(acc)
    oh_o, oh_i = sch.split(oh, [None, k.tile_oh])
    ow_o, ow_i = sch.split(ow, [None, k.tile_ow])
    cb_o, cb_i = sch.split(cb, [None, k.tile_cb])
    sch.reorder(n, cb_o, oh_o, ow_o, kh, kw, oh_i, ow_i, cb_i, c)
    sch.set_scope(pad, 0, SCOPE_ACC)
    sch.set_scope(acc, 0, SCOPE_ACC)
    if s.kind == "dw":
        w = sch.cache_read(acc, 1, SCOPE_ACC)
        sch.compute_at(w, cb_o)
    sch.compute_at(pad, ow_o)
    sch.decompose_reduction(acc, kh)
    if s.kind == "dw":
        intrin = alu_intrin("mac", s.block, "int8", "int8")
    else:
        intrin = acc_intrin("max" if s.kind == "max" else "add", s.block, "int8")
    sch.tensorize(c, intrin)
    _output(sch, s, "int32", cb_o, ow_o)
    if k.double_buffer:
        sch.annotate(ow_o, ANN_DOUBLE_BUFFER, 1)
    return sch


def schedule_global_sum(func: tirx.PrimFunc, cfg: HardwareConfig, s: GlobalSumShape,
                        k: GlobalSumKnobs) -> s_tir.Schedule:
    """Per (image, channel tile) the sum stays in the accumulator while input tiles of
    ``tile_hw`` pixels stream through it: one ALU ADD per tile, reducing over pixels."""
    _check(cfg, s, k)
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("acc")
    x = sch.cache_read(acc, 0, SCOPE_ACC)
    n, cb, c, hw = sch.get_loops(acc)
    cb_o, cb_i = sch.split(cb, [None, k.tile_cb])
    hw_o, hw_i = sch.split(hw, [None, k.tile_hw])
    sch.reorder(n, cb_o, hw_o, hw_i, cb_i, c)
    sch.set_scope(acc, 0, SCOPE_ACC)
    sch.compute_at(x, hw_o)
    sch.decompose_reduction(acc, hw_o)
    sch.tensorize(c, acc_intrin("add", s.block, "int8"))
    _output(sch, s, "int32", cb_o, cb_o)
    if k.double_buffer:
        sch.annotate(hw_o, ANN_DOUBLE_BUFFER, 1)
    return sch


def schedule_eltwise(func: tirx.PrimFunc, cfg: HardwareConfig, s: EltwiseShape,
                     k: EltwiseKnobs) -> s_tir.Schedule:
    """Tiles of (pixels, channel blocks), channel tiles outermost so the output-stage
    table is loaded once per channel tile."""
    _check(cfg, s, k)
    sch = s_tir.Schedule(func)
    first = sch.get_sblock("requant" if s.kind == "rescale" else "acc")
    inputs = [sch.cache_read(first, i, SCOPE_ACC) for i in range(2 if s.kind == "add" else 1)]
    p, cb, c = sch.get_loops(first)
    p_o, p_i = sch.split(p, [None, k.tile_p])
    cb_o, cb_i = sch.split(cb, [None, k.tile_cb])
    sch.reorder(cb_o, p_o, p_i, cb_i, c)
    for blk in inputs:
        sch.compute_at(blk, p_o)
    if s.kind in ("add", "scale"):
        sch.set_scope(first, 0, SCOPE_ACC)
        sch.tensorize(c, axpby_intrin(s.block, s.a_mult, s.b_mult) if s.kind == "add"
                      else alu_intrin("mul", s.block, "int8", imm=s.a_mult))
        _output(sch, s, "int32", cb_o, p_o)
    else:
        _output(sch, s, "int8", cb_o, p_o, placed=True)
    if k.double_buffer:
        sch.annotate(p_o, ANN_DOUBLE_BUFFER, 1)
    return sch
