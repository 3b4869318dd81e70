"""Room: max and average pooling, and the vector unit's depthwise conv (``dw``): a
per-channel window reduction over a padded input tile, one channel per lane.

The compute's stages: ``pad`` (the input with its border, the ACC8 LOAD), ``acc``
(the int32 reduction), ``requant`` and ``y`` (``tir_schedules.output_stage``). Zero
points never appear in the arithmetic; the REQUANT bias removes them, once per layer:

* depthwise: ``sum((x - zp) * w) = sum(x * w) - zp * sum(w)``;
* average pool: ``sum(x - zp) = sum(x) - count * zp``;
* max pool: ``max(x - zp) = max(x) - zp`` (pads are -128 and never win).

A depthwise conv's taps are MAC8s (int8 codes): with ``taps_inside`` each instruction
holds one kernel row (loops kh, cb_i | oh_i, ow_i, kw), which dot-product lanes take
``dot_ways`` taps a step; without it the taps are outermost and each instruction one
tap over the tile's pixels and channels. (A depthwise conv can also run on the array:
``conv2d.depthwise_recipe``; the depthwise room picks the engine.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from tvm import s_tir, te, tirx

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.checks import window_input, with_weights
from dsa_tvm.layers.ir import Conv2d, Pool2d
from dsa_tvm.layers.reference import apply_requant, centered, pad, windows

from ..counts import reduction_count, reduction_steps, tile_copy
from ..intrinsics import acc_intrin, alu_intrin
from ..names import ANN_DOUBLE_BUFFER, SCOPE_ACC
from ..output_stage import place_output, requant_stage
from ..tiling import divisors, input_tile, lowest_estimate, window_out_hw
from ..vector_unit import acc_fits, check_fits, no_tiling, stream_cycles
from .base import Kind, Recipe, UnsupportedLayer, check_out_hw, requant_table

WINDOW_KINDS = ("dw", "max", "avg")


@dataclass(frozen=True)
class WindowShape:
    """A per-channel window reduction over an image ``x[n, h, w, cb, c]``."""

    kind: str                           # "dw" | "max" | "avg"
    n: int
    h: int
    w: int
    cb: int                             # channel blocks
    kh: int
    kw: int
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    block: int
    pad_value: int                      # int8 border value: input zero point, -128 for max
    output_zp: int
    clip: tuple[int, int]

    @property
    def out_hw(self) -> tuple[int, int]:
        return window_out_hw(self)


@dataclass(frozen=True)
class WindowKnobs:
    tile_oh: int         # output rows per tile (divides OH)
    tile_ow: int         # output columns per tile (divides OW)
    tile_cb: int         # channel blocks per tile (divides CB)
    double_buffer: bool
    taps_inside: bool = False  # depthwise: one kernel row of taps inside each instruction
    #                            (MAC8 on dot-product lanes takes dot_ways taps a step)


def window(s: WindowShape) -> tirx.PrimFunc:
    """Depthwise conv (``acc = sum x * w[c]``), max pool (``acc = max x``) or average pool
    (``acc = sum x``) over every window of the padded input, then the output stage."""
    if s.kind not in WINDOW_KINDS:
        raise ValueError(f"window kind must be one of {WINDOW_KINDS}, got {s.kind!r}")
    b = s.block
    pt, pl, pb, pr = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    oh, ow = s.out_hw
    x = te.placeholder((s.n, s.h, s.w, s.cb, b), "int8", name="x")
    params = te.placeholder((s.cb, 3, b), "int32", name="params")
    border = tirx.const(s.pad_value, "int8")

    def pad_value(n, h, w_, c, i):
        inside = tirx.all(h >= pt, h < s.h + pt, w_ >= pl, w_ < s.w + pl)
        return tirx.if_then_else(inside, x[n, h - pt, w_ - pl, c, i], border)

    xp = te.compute((s.n, s.h + pt + pb, s.w + pl + pr, s.cb, b), pad_value, name="pad")
    rkh = te.reduce_axis((0, s.kh), "kh")
    rkw = te.reduce_axis((0, s.kw), "kw")

    def tap(n, y, x_, c, i):
        return xp[n, y * sh + rkh * dh, x_ * sw + rkw * dw, c, i].astype("int32")

    args = [x]
    if s.kind == "dw":
        wgt = te.placeholder((s.cb, s.kh, s.kw, b), "int8", name="w")
        args.append(wgt)
        acc = te.compute((s.n, oh, ow, s.cb, b), lambda n, y, x_, c, i: te.sum(
            tap(n, y, x_, c, i) * wgt[c, rkh, rkw, i].astype("int32"), axis=[rkh, rkw]),
            name="acc")
    else:
        reducer = te.max if s.kind == "max" else te.sum
        acc = te.compute((s.n, oh, ow, s.cb, b), lambda n, y, x_, c, i: reducer(
            tap(n, y, x_, c, i), axis=[rkh, rkw]), name="acc")
    out = requant_stage(acc, params, s.output_zp, s.clip)
    return te.create_prim_func(args + [params, out])


# ----------------------------------------------------------------------------- knobs
def acc_rows(s: WindowShape, k: WindowKnobs) -> int:
    """Accumulator rows one set of tiles needs (tile buffers twice when double-buffered;
    the output-stage table, and a depthwise conv's weights, once per channel tile: twice
    for a double-buffered depthwise conv, whose next channel tile's weights load while
    this one computes)."""
    nbuf = 2 if k.double_buffer else 1
    in_rows, in_cols = input_tile(s, k)
    out = k.tile_oh * k.tile_ow * k.tile_cb
    resident = 3 * k.tile_cb + (k.tile_cb * s.kh * s.kw if s.kind == "dw" else 0)
    return nbuf * (in_rows * in_cols * k.tile_cb + 2 * out) + resident * _resident_bufs(s, k)


def _resident_bufs(s: WindowShape, k: WindowKnobs) -> int:
    """Slots of the per-channel-tile operands: two when a depthwise conv double-buffers."""
    return 2 if k.double_buffer and s.kind == "dw" else 1


def window_fits(cfg: HardwareConfig, s: WindowShape, k: WindowKnobs) -> str | None:
    if k.taps_inside and s.kind != "dw":
        return f"taps_inside is a depthwise conv's loop order, not a {s.kind} pool's"
    return acc_fits(cfg, acc_rows(s, k))


def estimate_window_cycles(cfg: HardwareConfig, s: WindowShape, k: WindowKnobs) -> float:
    b = s.block
    oh, ow = s.out_hw
    in_rows, in_cols = input_tile(s, k)
    out = k.tile_oh * k.tile_ow * k.tile_cb
    tiles = s.n * (oh // k.tile_oh) * (ow // k.tile_ow) * (s.cb // k.tile_cb)
    # a tile narrower than the image in channels is one LOAD per input row
    n_loads = 1 if k.tile_cb == s.cb else in_rows
    resident = (s.kh * s.kw if s.kind == "dw" else 0) * k.tile_cb * b + 12 * k.tile_cb * b
    # per channel tile, unless double-buffered (then only the first one is exposed)
    exposed = 1 if _resident_bufs(s, k) == 2 else s.cb // k.tile_cb
    once = exposed * (resident / cfg.bandwidth_bytes_per_cycle + 2 * cfg.latency_cycles)
    # taps (the first one writes the init) and the requant pass
    levels = tap_levels(s, k)
    return stream_cycles(cfg, tiles, [(in_rows * in_cols * k.tile_cb * b, n_loads)],
                         reduction_steps(cfg, levels, s.kind == "dw") + out,
                         reduction_count(levels) + 1, out * b, k.double_buffer, once)


def tap_levels(s: WindowShape, k: WindowKnobs) -> list[tuple[int, int, int, int]]:
    """(extent, dst, a, b strides) of one tile's taps, outermost first: kh, kw, oh_i,
    ow_i, cb_i (taps outermost: the pixels and channels form each instruction), or with
    ``taps_inside`` kh, cb_i, oh_i, ow_i, kw (a kernel row inside each instruction).
    A depthwise conv's MAC reads the input tile (a) and the resident weights (b); a pool
    accumulates in place (a is the destination, b the input tile)."""
    th, tw, tc = k.tile_oh, k.tile_ow, k.tile_cb
    (sh, sw), (dh, dw) = s.strides, s.dilation
    _, in_cols = input_tile(s, k)
    inp = [dh * in_cols * tc, dw * tc, sh * in_cols * tc, sw * tc, 1]
    dst = [0, 0, tw * tc, tc, 1]
    ext = [s.kh, s.kw, th, tw, tc]
    if s.kind == "dw":
        levels = list(zip(ext, dst, inp, [s.kw * tc, tc, 0, 0, 1]))
    else:
        levels = list(zip(ext, dst, dst, inp))
    return [levels[i] for i in (0, 4, 2, 3, 1)] if k.taps_inside else levels


def candidate_window_knobs(cfg: HardwareConfig, s: WindowShape) -> list[WindowKnobs]:
    """Every knob setting that fits (tile sizes divide their loops)."""
    oh, ow = s.out_hw
    orders = (False, True) if s.kind == "dw" else (False,)
    return [k for db in (True, False) for tc in divisors(s.cb) for inside in orders
            for k in [WindowKnobs(th, tw, tc, db, inside) for th in divisors(oh)
                      for tw in divisors(ow)]
            if window_fits(cfg, s, k) is None]


def default_window_knobs(cfg: HardwareConfig, s: WindowShape) -> WindowKnobs:
    """The candidate with the lowest estimate (larger tiles on ties: fewer instructions)."""
    cands = candidate_window_knobs(cfg, s)
    if not cands:
        raise no_tiling(cfg, s, window_fits(cfg, s, WindowKnobs(1, 1, 1, False)))
    return lowest_estimate(cands, lambda k: estimate_window_cycles(cfg, s, k))


# ----------------------------------------------------------------------------- schedule
def schedule_window(func: tirx.PrimFunc, cfg: HardwareConfig, s: WindowShape,
                    k: WindowKnobs) -> s_tir.Schedule:
    """Tiles of (output rows, columns, channel blocks); weights and the output-stage
    table stay resident per channel tile; the reduction runs with the taps outermost so
    that output pixels and channels form the ALU's vector levels."""
    check_fits(cfg, window_fits(cfg, s, k), k)
    sch = s_tir.Schedule(func)
    pad_, acc = sch.get_sblock("pad"), sch.get_sblock("acc")
    n, oh, ow, cb, c, kh, kw = sch.get_loops(acc)
    oh_o, oh_i = sch.split(oh, [None, k.tile_oh])
    ow_o, ow_i = sch.split(ow, [None, k.tile_ow])
    cb_o, cb_i = sch.split(cb, [None, k.tile_cb])
    if k.taps_inside:  # a kernel row of taps inside each instruction: MAC8 ways
        sch.reorder(n, cb_o, oh_o, ow_o, kh, cb_i, oh_i, ow_i, kw, c)
    else:
        sch.reorder(n, cb_o, oh_o, ow_o, kh, kw, oh_i, ow_i, cb_i, c)
    sch.set_scope(pad_, 0, SCOPE_ACC)
    sch.set_scope(acc, 0, SCOPE_ACC)
    if s.kind == "dw":
        w = sch.cache_read(acc, 1, SCOPE_ACC)
        sch.compute_at(w, cb_o)
    sch.compute_at(pad_, ow_o)
    sch.decompose_reduction(acc, kh)
    if s.kind == "dw":
        intrin = alu_intrin("mac8", s.block, "int8", "int8")
    else:
        intrin = acc_intrin("max" if s.kind == "max" else "add", s.block, "int8")
    sch.tensorize(c, intrin)
    place_output(sch, s, "int32", cb_o, ow_o)
    if k.double_buffer:
        sch.annotate(ow_o, ANN_DOUBLE_BUFFER, 1)
    if _resident_bufs(s, k) == 2:  # the next channel tile's weights and table too
        sch.annotate(cb_o, ANN_DOUBLE_BUFFER, 1)
    return sch


def window_instructions(cfg: HardwareConfig, s: WindowShape, k: WindowKnobs) -> int:
    oh, ow = s.out_hw
    th, tw, tc = k.tile_oh, k.tile_ow, k.tile_cb
    in_rows, in_cols = input_tile(s, k)
    loads = tile_copy(in_rows, in_cols, tc, s.w, s.cb)
    taps = reduction_count(tap_levels(s, k))
    stores = tile_copy(th, tw, tc, ow, s.cb)
    tiles = s.n * (oh // th) * (ow // tw) * (s.cb // tc)
    resident = 2 if s.kind == "dw" else 1
    return tiles * (loads + taps + 1 + stores) + s.n * (s.cb // tc) * resident + 1



def window_perf_shape(s: WindowShape) -> WindowShape:
    return dataclasses.replace(s, pad_value=-128 if s.kind == "max" else 0, output_zp=0,
                               clip=(-128, 127))


# ----------------------------------------------------------------------------- layers
def _recipe(layer: Conv2d | Pool2d, cfg: HardwareConfig, consts: bool, kind: str,
            kernel: tuple[int, int], dilation: tuple[int, int]) -> Recipe:
    block = cfg.block_out
    n, c, h, w = layer.input.shape
    zp = layer.input.zero_point
    kh, kw = kernel
    rq = layer.requant
    shape = WindowShape(kind, n, h, w, ceil_div(c, block), int(kh), int(kw),
                        tuple(layer.strides), tuple(layer.padding), dilation, block,
                        sem.INT8_MIN if kind == "max" else zp, rq.zero_point, rq.clip)
    check_out_hw(layer, shape.out_hw)
    r = Recipe(KIND, shape, {"x": layer.input})
    if consts:
        if kind == "dw":
            wt = np.zeros((shape.cb * block, kh, kw), np.int8)
            wt[:c] = layer.weight[:, 0]
            r.consts["w"] = np.ascontiguousarray(
                wt.reshape(shape.cb, block, kh, kw).transpose(0, 2, 3, 1))
            bias = np.asarray(layer.bias, np.int64) - zp * layer.weight.astype(np.int64).sum(
                axis=(1, 2, 3))
        else:
            bias = np.full(c, -zp * (kh * kw if kind == "avg" else 1), np.int64)
        r.consts["params"] = requant_table(layer, bias, c, block)
    return r


def _check_nchw(layer: Conv2d | Pool2d) -> None:
    if len(layer.input.shape) != 4 or len(layer.output.shape) != 4:
        raise UnsupportedLayer(f"{layer.name}: window layers need NCHW tensors")


def depthwise_recipe(layer: Conv2d, cfg: HardwareConfig, consts: bool) -> Recipe:
    """A depthwise conv on the vector unit: an ALU MAC per tap over accumulator rows."""
    _check_nchw(layer)
    return _recipe(layer, cfg, consts, "dw", layer.weight.shape[2:], tuple(layer.dilation))


def pool_recipe(layer: Pool2d, cfg: HardwareConfig, consts: bool) -> Recipe:
    _check_nchw(layer)
    if layer.kind not in ("max", "avg"):
        raise UnsupportedLayer(f"{layer.name}: unknown pool kind '{layer.kind}'")
    (kh, kw), (pt, pl, pb, pr) = layer.kernel, layer.padding
    if layer.kind == "max" and (max(pt, pb) >= kh or max(pl, pr) >= kw):
        raise UnsupportedLayer(f"{layer.name}: padding {layer.padding} >= the {kh}x{kw} "
                               f"window (a window of padding only has no maximum)")
    return _recipe(layer, cfg, consts, layer.kind, layer.kernel, (1, 1))


def run_pool2d(ly: Pool2d, env: dict[str, np.ndarray]) -> np.ndarray:
    xc = centered(env[ly.input.name], ly.input)
    oh, ow = ly.output.shape[2:]
    if ly.kind == "max":
        lowest = np.iinfo(np.int64).min  # pads never win
        win = windows(pad(xc, ly.padding, lowest), ly.kernel, ly.strides, (1, 1), (oh, ow))
        acc = win.max(axis=(4, 5))
    elif ly.kind == "avg":
        win = windows(pad(xc, ly.padding, 0), ly.kernel, ly.strides, (1, 1), (oh, ow))
        acc = win.sum(axis=(4, 5))
    else:
        raise ValueError(f"{ly.name}: unknown pool kind '{ly.kind}'")
    return apply_requant(acc, ly.requant, axis=1)


def pool_ops(ly: Pool2d) -> int:
    """One operation per window tap of every output element."""
    return int(np.prod(ly.output.shape)) * ly.kernel[0] * ly.kernel[1]


KIND = Kind(
    name="window", layers=(Pool2d,), recipe=pool_recipe, reference=run_pool2d,
    bounds=lambda ly: with_weights(ly, window_input(ly, ly.kernel, (1, 1))), ops=pool_ops,
    shape=WindowShape, knobs=WindowKnobs, build=window, schedule=schedule_window,
    fits=window_fits, candidates=candidate_window_knobs, default=default_window_knobs,
    estimate=estimate_window_cycles, instructions=window_instructions,
    tiles=lambda s: {"tile_oh": ("acc", 1), "tile_ow": ("acc", 2), "tile_cb": ("acc", 3)},
    extents=lambda s: {"tile_oh": s.out_hw[0], "tile_ow": s.out_hw[1], "tile_cb": s.cb},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    perf_shape=window_perf_shape)
