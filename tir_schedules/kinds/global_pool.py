"""Room: global average pooling on the vector unit, a per-channel sum over every pixel.

Per (image, channel tile) the sum stays in the accumulator while input tiles of
``tile_hw`` pixels stream through it: one ALU ADD per tile. The zero point leaves
through the REQUANT bias: ``sum(x - zp) = sum(x) - count * zp``; 1/(H*W) is in
the layer's multiplier.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from tvm import s_tir, te, tirx

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.layers.checks import elements, with_weights
from dsa_tvm.layers.ir import GlobalAvgPool
from dsa_tvm.layers.layouts import image_dims
from dsa_tvm.layers.reference import apply_requant, centered

from ..intrinsics import acc_intrin
from ..names import ANN_DOUBLE_BUFFER, SCOPE_ACC
from ..output_stage import place_output, requant_stage
from ..tiling import divisors, lowest_estimate
from ..vector_unit import acc_fits, check_fits, no_tiling, stream_cycles
from .base import Kind, Recipe, UnsupportedLayer, requant_table


@dataclass(frozen=True)
class GlobalSumShape:
    """Sum over all ``hw`` pixels of ``x[n, hw, cb, c]`` per channel."""

    n: int
    hw: int
    cb: int
    block: int
    output_zp: int
    clip: tuple[int, int]


@dataclass(frozen=True)
class GlobalSumKnobs:
    tile_hw: int         # pixels summed per input tile (divides H*W)
    tile_cb: int         # channel blocks per tile (divides CB)
    double_buffer: bool


def global_sum(s: GlobalSumShape) -> tirx.PrimFunc:
    """``acc[n, cb, c] = sum over hw of x[n, hw, cb, c]``, then the output stage."""
    b = s.block
    x = te.placeholder((s.n, s.hw, s.cb, b), "int8", name="x")
    params = te.placeholder((s.cb, 3, b), "int32", name="params")
    r = te.reduce_axis((0, s.hw), "hw")
    acc = te.compute((s.n, s.cb, b), lambda n, c, i: te.sum(x[n, r, c, i].astype("int32"),
                                                            axis=r), name="acc")
    out = requant_stage(acc, params, s.output_zp, s.clip)
    return te.create_prim_func([x, params, out])


# ----------------------------------------------------------------------------- knobs
def acc_rows(s: GlobalSumShape, k: GlobalSumKnobs) -> int:
    """Accumulator rows: the input tiles (twice when double-buffered), the sum, the
    requantized rows and the table once per channel tile."""
    nbuf = 2 if k.double_buffer else 1
    return nbuf * k.tile_hw * k.tile_cb + 5 * k.tile_cb


def global_sum_fits(cfg: HardwareConfig, s: GlobalSumShape, k: GlobalSumKnobs) -> str | None:
    return acc_fits(cfg, acc_rows(s, k))


def estimate_global_sum_cycles(cfg: HardwareConfig, s: GlobalSumShape,
                               k: GlobalSumKnobs) -> float:
    b = s.block
    tiles = s.n * (s.hw // k.tile_hw) * (s.cb // k.tile_cb)
    outer = s.n * (s.cb // k.tile_cb)
    once = outer * (k.tile_cb * cfg.alu_cycles_per_row + 2 * cfg.latency_cycles
                    + (k.tile_cb * b + 12 * k.tile_cb * b) / cfg.bandwidth_bytes_per_cycle)
    return stream_cycles(cfg, tiles, [(k.tile_hw * k.tile_cb * b, 1)], k.tile_hw * k.tile_cb,
                         1, 0, k.double_buffer, once)


def candidate_global_sum_knobs(cfg: HardwareConfig, s: GlobalSumShape) -> list[GlobalSumKnobs]:
    """Every knob setting that fits (tile sizes divide their loops)."""
    return [k for db in (True, False) for tc in divisors(s.cb)
            for k in [GlobalSumKnobs(t, tc, db) for t in divisors(s.hw)]
            if global_sum_fits(cfg, s, k) is None]


def default_global_sum_knobs(cfg: HardwareConfig, s: GlobalSumShape) -> GlobalSumKnobs:
    """The candidate with the lowest estimate (larger tiles on ties: fewer instructions)."""
    cands = candidate_global_sum_knobs(cfg, s)
    if not cands:
        raise no_tiling(cfg, s, global_sum_fits(cfg, s, GlobalSumKnobs(1, 1, False)))
    return lowest_estimate(cands, lambda k: estimate_global_sum_cycles(cfg, s, k))


def global_sum_instructions(cfg: HardwareConfig, s: GlobalSumShape, k: GlobalSumKnobs) -> int:
    tiles = s.n * (s.hw // k.tile_hw) * (s.cb // k.tile_cb)
    outer = s.n * (s.cb // k.tile_cb)
    # per tile: its load and ADD; per channel tile: the first step's MOV, table, REQUANT, store
    return 2 * tiles + outer * ((k.tile_hw > 1) + 3) + 1


# ----------------------------------------------------------------------------- schedule
def schedule_global_sum(func: tirx.PrimFunc, cfg: HardwareConfig, s: GlobalSumShape,
                        k: GlobalSumKnobs) -> s_tir.Schedule:
    """Per (image, channel tile) the sum stays in the accumulator while input tiles of
    ``tile_hw`` pixels stream through it: one ALU ADD per tile, reducing over pixels."""
    check_fits(cfg, global_sum_fits(cfg, s, k), k)
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
    place_output(sch, s, "int32", cb_o, cb_o)
    if k.double_buffer:
        sch.annotate(hw_o, ANN_DOUBLE_BUFFER, 1)
    return sch


# ----------------------------------------------------------------------------- layers
def global_pool_recipe(layer: GlobalAvgPool, cfg: HardwareConfig, consts: bool) -> Recipe:
    block = cfg.block_out
    if len(layer.input.shape) != 4:
        raise UnsupportedLayer(f"{layer.name}: global average pool needs an NCHW input")
    n, c, h, w = layer.input.shape
    on, oc, oh, ow = image_dims(layer.output.shape)
    if (on * oh * ow, oc) != (n, c):
        raise UnsupportedLayer(f"{layer.name}: output {layer.output.shape} is not (N, C[, 1, 1])")
    rq = layer.requant
    shape = GlobalSumShape(n, h * w, ceil_div(c, block), block, rq.zero_point, rq.clip)
    r = Recipe(KIND, shape, {"x": layer.input})
    if consts:
        r.consts["params"] = requant_table(layer, -h * w * layer.input.zero_point, c, block)
    return r


def run_global_avg_pool(ly: GlobalAvgPool, env: dict[str, np.ndarray]) -> np.ndarray:
    acc = centered(env[ly.input.name], ly.input).sum(axis=(2, 3))
    return apply_requant(acc, ly.requant, axis=1).reshape(ly.output.shape)


KIND = Kind(
    name="global_pool", layers=(GlobalAvgPool,), recipe=global_pool_recipe,
    reference=run_global_avg_pool, bounds=lambda ly: with_weights(ly, elements(ly.input.shape)),
    shape=GlobalSumShape, knobs=GlobalSumKnobs, build=global_sum, schedule=schedule_global_sum,
    fits=global_sum_fits, candidates=candidate_global_sum_knobs, default=default_global_sum_knobs,
    estimate=estimate_global_sum_cycles, instructions=global_sum_instructions,
    tiles=lambda s: {"tile_hw": ("acc", 3), "tile_cb": ("acc", 1)},
    extents=lambda s: {"tile_hw": s.hw, "tile_cb": s.cb},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    perf_shape=lambda s: dataclasses.replace(s, output_zp=0, clip=(-128, 127)))
