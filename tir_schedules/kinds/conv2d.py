"""Room: conv2d (groups = 1) and dense on the MAC array, and the array form of a
depthwise conv (diagonal weight tiles, ``ConvShape.depthwise``; the depthwise room
picks it or the vector unit's).

Activations are NHWC with channels padded to the array block and split into
blocks: ``x[n, h, w, cb, c]``; weights are packed ``w[ob, kh, kw, ib, o, i]``
(block_out x block_in tiles); the per-channel output-stage table is
``params[ob, 3, o]`` (bias, multiplier, shift). The compute's stages are named so
the schedule can find them: ``pad`` (the input with its zero-point border),
``conv`` (the int32 reduction), ``requant`` (the output stage) and ``y`` (the int8
result).

A schedule is fully described by its knobs (tile sizes, loop order, double
buffering): :func:`schedule_conv2d` applies given knobs, :func:`default_conv_knobs`
picks them with an analytic cost estimate, the tuner samples them
(``tir_schedules.kinds.space``).

The array multiplies raw int8 inputs, pads included as the input zero point, so
the zero point is folded into the REQUANT bias once per layer:
``sum((x - zp) * w) = sum(x * w) - zp * sum(w)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from tvm import s_tir, te, tirx

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.instructions import GEMM_LEVELS
from dsa_tvm.layers.checks import elements, window_input, with_weights
from dsa_tvm.layers.ir import WIDE_CLIP, Conv2d, Dense, Layer
from dsa_tvm.layers.layouts import image_dims, pack_conv_weights
from dsa_tvm.layers.reference import (
    PLANE_SHIFT,
    apply_requant,
    centered,
    join_planes_shifted,
    pad,
    windows,
)

from ..counts import copy_count, nest_count, tile_copy
from ..intrinsics import SCALAR_JOIN_SHIFTED, gemm_intrin, join_rows_intrin, requant_intrin
from ..names import ANN_DOUBLE_BUFFER, SCALAR_REQUANT, SCOPE_ACC, SCOPE_INP, SCOPE_WGT
from ..tiling import (
    divisors,
    input_tile,
    lowest_estimate,
    output_stage_cycles,
    pixels_inner,
    scratchpads_fit,
    tile_gemm_cycles,
    window_out_hw,
)
from .base import Kind, Recipe, UnsupportedLayer, check_out_hw, mac_ops, requant_table


@dataclass(frozen=True)
class ConvShape:
    """One image-batch conv2d (groups = 1) in blocked form."""

    n: int
    h: int
    w: int
    icb: int            # input channel blocks
    ocb: int            # output channel blocks
    kh: int
    kw: int
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    block_in: int
    block_out: int
    input_zp: int
    output_zp: int
    clip: tuple[int, int]
    #: depthwise on the array: input block ``ob`` only feeds output block ``ob`` through
    #: diagonal weight tiles (``icb`` = 1 block per group, the image has ``ocb`` blocks)
    depthwise: bool = False
    #: a dense on byte planes (``Dense.planes``): the image is (n, 2, M), its two rows the
    #: hi and lo planes; a ``join`` stage adds each pixel's pair before the requantize and
    #: the output image is (n, 1, M)
    planes: bool = False
    lo_shift: int = 0   # planes: the join's ``(hi << (8 - lo_shift)) + (lo >> lo_shift)``

    @property
    def out_hw(self) -> tuple[int, int]:
        return window_out_hw(self)

    @property
    def subsampled(self) -> bool:
        """A strided 1x1 conv without padding: its input tile is only the pixels it reads
        (a strided LOAD), not the rows and columns between them."""
        return ((self.kh, self.kw) == (1, 1) and self.strides != (1, 1) and not self.depthwise
                and not any(self.padding))

    @property
    def tile_strides(self) -> tuple[int, int]:
        """Strides of the window over the input tile in the scratchpad."""
        return (1, 1) if self.subsampled else self.strides


@dataclass(frozen=True)
class ConvKnobs:
    tile_oh: int         # output rows per tile (divides OH)
    tile_ow: int         # output columns per tile (divides OW)
    tile_ocb: int        # output channel blocks per tile (divides OCB)
    tile_icb: int        # input channel blocks per input tile (divides ICB): fewer lets a
                         # tile hold more pixels; the tile's partial sums stay in the
                         # accumulator across its channel chunks
    weights_outer: bool  # True: output-channel tiles outermost, weights stay resident
                         # across the spatial tiles; False: input tile stays resident
    double_buffer: bool


def conv2d(s: ConvShape) -> tirx.PrimFunc:
    """conv2d + output stage; a dense layer is the 1x1 case on an (M, 1) image (byte planes:
    a (2, M) one and a ``join`` stage), a depthwise conv (``s.depthwise``) one whose weight
    tiles are diagonal."""
    bi, bo = s.block_in, s.block_out
    pt, pl, pb, pr = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    oh, ow = s.out_hw
    in_blocks = s.ocb if s.depthwise else s.icb
    x = te.placeholder((s.n, s.h, s.w, in_blocks, bi), "int8", name="x")
    w = te.placeholder((s.ocb, s.kh, s.kw, s.icb, bo, bi), "int8", name="w")
    params = te.placeholder((s.ocb, 3, bo), "int32", name="params")
    zp = tirx.const(s.input_zp, "int8")

    def pad_value(n, h, w_, c, i):
        inside = tirx.all(h >= pt, h < s.h + pt, w_ >= pl, w_ < s.w + pl)
        return tirx.if_then_else(inside, x[n, h - pt, w_ - pl, c, i], zp)

    if s.subsampled:  # only the pixels the 1x1 window reads
        xp = te.compute((s.n, oh, ow, in_blocks, bi),
                        lambda n, h, w_, c, i: x[n, h * sh, w_ * sw, c, i], name="pad")
        sh = sw = 1
    else:
        xp = te.compute((s.n, s.h + pt + pb, s.w + pl + pr, in_blocks, bi), pad_value,
                        name="pad")
    rkh = te.reduce_axis((0, s.kh), "kh")
    rkw = te.reduce_axis((0, s.kw), "kw")
    ric = te.reduce_axis((0, s.icb), "icb")
    ri = te.reduce_axis((0, bi), "i")
    acc = te.compute(
        (s.n, oh, ow, s.ocb, bo),
        lambda n, y, x_, ob, o: te.sum(
            xp[n, y * sh + rkh * dh, x_ * sw + rkw * dw, ob + ric if s.depthwise else ric,
               ri].astype("int32")
            * w[ob, rkh, rkw, ric, o, ri].astype("int32"), axis=[rkh, rkw, ric, ri]),
        name="conv")
    if s.planes:
        acc = te.compute((s.n, 1, ow, s.ocb, bo), lambda n, y, x_, ob, o: tirx.call_pure_extern(
            "int32", SCALAR_JOIN_SHIFTED, acc[n, 2 * y, x_, ob, o], acc[n, 2 * y + 1, x_, ob, o],
            1 << (PLANE_SHIFT - s.lo_shift), s.lo_shift), name="join")
    lo, hi = s.clip
    rq = te.compute(
        acc.shape,
        lambda n, y, x_, ob, o: tirx.call_pure_extern(
            "int32", SCALAR_REQUANT, acc[n, y, x_, ob, o], params[ob, 0, o], params[ob, 1, o],
            params[ob, 2, o], s.output_zp, lo, hi),
        name="requant")
    out_dtype = "int16" if tuple(s.clip) == WIDE_CLIP else "int8"   # REQUANT's wide mode
    out = te.compute(acc.shape, lambda *i: rq(*i).astype(out_dtype), name="y")
    return te.create_prim_func([x, w, params, out])


def out_rows(s: ConvShape, rows: int) -> int:
    """Output rows behind ``rows`` rows of the conv: half with byte planes (joined)."""
    return rows // 2 if s.planes else rows


def conv_input_tile(s: ConvShape, k: ConvKnobs) -> tuple[int, int]:
    """(rows, columns) of pixels one input tile holds."""
    return (k.tile_oh, k.tile_ow) if s.subsampled else input_tile(s, k)


def ic_chunks(s: ConvShape, k: ConvKnobs) -> int:
    """Input tiles per output tile: the reduction's channel chunks (1 for depthwise)."""
    return 1 if s.depthwise else s.icb // k.tile_icb


def tile_footprint(s: ConvShape, k: ConvKnobs) -> dict[str, int]:
    """Scratchpad rows (inp) / tiles (wgt) / rows (acc) one set of tiles needs."""
    in_rows, in_cols = conv_input_tile(s, k)
    nbuf = 2 if k.double_buffer else 1
    acc_tile = k.tile_oh * k.tile_ow * k.tile_ocb
    return {"inp": nbuf * in_rows * in_cols * _input_blocks(s, k),
            "wgt": nbuf * k.tile_ocb * s.kh * s.kw * s.icb,
            "acc": nbuf * (2 * acc_tile + 3 * k.tile_ocb)}


def _input_blocks(s: ConvShape, k: ConvKnobs) -> int:
    """Channel blocks of one input tile: its chunk of them, or (depthwise) the tile's own."""
    return k.tile_ocb if s.depthwise else k.tile_icb


def fits(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> str | None:
    """None if the tiles fit the scratchpads and instruction fields, else why not."""
    if s.planes and k.tile_oh != 2:
        return f"tile_oh={k.tile_oh}: a byte-plane dense's tile holds both planes (2 rows)"
    if s.icb % k.tile_icb:
        return f"tile_icb={k.tile_icb} does not divide the {s.icb} input channel blocks"
    problem = scratchpads_fit(cfg, tile_footprint(s, k))
    if problem:
        return problem
    if s.depthwise and not k.weights_outer:
        return "a depthwise input tile belongs to one channel tile: channel tiles go outermost"
    pt, pl, pb, pr = s.padding
    blocks = _input_blocks(s, k)
    if s.depthwise and (blocks < s.ocb or max(pl, pr) * blocks > 255):
        # one LOAD per input row; border rows join the pad fields of the first/last one
        in_cols = conv_input_tile(s, k)[1]
        if max(pt * in_cols + pl, pb * in_cols + pr) > 255:
            return "the tile's border exceeds the 8-bit LOAD pad fields"
    elif max(pl, pr) * blocks > 255 or max(pt, pb) > 255:
        return "padding exceeds the 8-bit LOAD pad fields"
    return None


def estimate_cycles(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> float:
    """Rough cycles of a schedule: compute and DMA overlap when double-buffered."""
    oh, ow = s.out_hw
    tiles_sp = (oh // k.tile_oh) * (ow // k.tile_ow)
    tiles_oc = s.ocb // k.tile_ocb
    chunks = ic_chunks(s, k)
    in_rows, in_cols = conv_input_tile(s, k)
    in_bytes = in_rows * in_cols * _input_blocks(s, k) * cfg.block_in  # one chunk
    w_bytes = k.tile_ocb * s.kh * s.kw * s.icb * cfg.wgt_tile_bytes
    out_bytes = out_rows(s, k.tile_oh) * k.tile_ow * k.tile_ocb * cfg.block_out
    if k.weights_outer:
        dma = s.n * tiles_oc * (w_bytes + tiles_sp * (chunks * in_bytes + out_bytes))
    elif chunks > 1:  # the input chunks cannot stay resident across the channel tiles
        dma = s.n * tiles_sp * tiles_oc * (chunks * in_bytes + w_bytes + out_bytes)
    else:
        dma = s.n * tiles_sp * (in_bytes + tiles_oc * (w_bytes + out_bytes))
    tiles = s.n * tiles_sp * tiles_oc
    passes = 1 + 2 * s.planes                   # the requantize; planes: the join's two
    alu = passes * (cfg.alu_latency_cycles
                    + out_rows(s, k.tile_oh) * k.tile_ow * k.tile_ocb * cfg.alu_cycles_per_row)
    if cfg.dataflow == "matrix-vector" and chunks == 1:
        # the ranking formula the default picks were tuned with: the tile's points and two
        # fills/drains (a depthwise nest, which has more levels than a GEMM holds, one per
        # peeled copy and one more). Charging every peeled copy instead picks tilings that
        # measure 2-3% slower on MobileNetV2 and EfficientNet-B0 (bench_zoo).
        fills = nest_count(conv_gemm_levels(cfg, s, k), GEMM_LEVELS) + 1 if s.depthwise else 2
        gemm = k.tile_oh * k.tile_ow * k.tile_ocb * s.kh * s.kw * s.icb \
            + fills * cfg.gemm_fill_drain_cycles
    else:  # every GEMM instruction the chunks' nests peel into, as the simulator costs it
        gemm = chunks * tile_gemm_cycles(cfg, conv_gemm_levels(cfg, s, k))
    compute = tiles * output_stage_cycles(cfg, gemm, alu)
    dma_cycles = dma / cfg.bandwidth_bytes_per_cycle + tiles * chunks * cfg.latency_cycles * 0.1
    if not k.double_buffer:
        return compute + dma_cycles
    # the first tile's loads and the last one's store overlap nothing: one weight tile
    # covering every output channel cannot hide its load behind any compute
    edge = (in_bytes + w_bytes + out_bytes) / cfg.bandwidth_bytes_per_cycle
    return max(compute, dma_cycles) + edge + 2 * cfg.latency_cycles


def candidate_knobs(cfg: HardwareConfig, s: ConvShape,
                    fewest_chunks: bool = False) -> list[ConvKnobs]:
    """Every knob setting that fits (tile sizes divide their loops). ``fewest_chunks``:
    per tiling, only the fewest input-channel chunks that fit (more add loads and
    instructions and buy nothing else), the default pick's shortlist."""
    oh, ow = s.out_hw
    splits = sorted(divisors(s.icb), reverse=True)
    out = []
    for db in (True, False):
        for wo in (True, False):
            for toc in divisors(s.ocb):
                for th in divisors(oh):
                    for tw in divisors(ow):
                        for tic in splits:
                            k = ConvKnobs(th, tw, toc, tic, wo, db)
                            if fits(cfg, s, k) is None:
                                out.append(k)
                                if fewest_chunks:
                                    break
    return out


def default_conv_knobs(cfg: HardwareConfig, s: ConvShape) -> ConvKnobs:
    cands = candidate_knobs(cfg, s, fewest_chunks=True)
    if not cands:
        raise ValueError(f"no tiling of this conv fits the scratchpads of '{cfg.name}': "
                         f"{fits(cfg, s, ConvKnobs(1, 1, 1, 1, True, False))}")

    return lowest_estimate(cands, lambda k: estimate_cycles(cfg, s, k))


def schedule_conv2d(func: tirx.PrimFunc, cfg: HardwareConfig, s: ConvShape,
                    k: ConvKnobs) -> s_tir.Schedule:
    """Tile, place in the scratchpads, tensorize; the walker lowers the result."""
    problem = fits(cfg, s, k)
    if problem:
        raise ValueError(f"conv tiling {k} does not fit '{cfg.name}': {problem}")
    sch = s_tir.Schedule(func)
    pad, conv = sch.get_sblock("pad"), sch.get_sblock("conv")
    join = sch.get_sblock("join") if s.planes else None
    rq, y = sch.get_sblock("requant"), sch.get_sblock("y")
    n, oh, ow, ob, o, kh, kw, icb, i = sch.get_loops(conv)
    oh_o, oh_i = sch.split(oh, [None, k.tile_oh])
    ow_o, ow_i = sch.split(ow, [None, k.tile_ow])
    ob_o, ob_i = sch.split(ob, [None, k.tile_ocb])
    chunked = ic_chunks(s, k) > 1
    # input-channel chunks: the innermost tile loop, one input tile each
    ic_o, icb = sch.split(icb, [None, k.tile_icb]) if chunked else (None, icb)
    chunk = [ic_o] if chunked else []
    if pixels_inner(cfg):  # a weight tile stays in the PEs while the tile's pixels stream
        inner = [ob_i, kh, kw, icb, oh_i, ow_i, o, i]
    else:
        inner = [ob_i, oh_i, ow_i, kh, kw, icb, o, i]
    if k.weights_outer:
        sch.reorder(n, ob_o, oh_o, ow_o, *chunk, *inner)
        tile_loop, w_at = ow_o, ob_o
    else:
        sch.reorder(n, oh_o, ow_o, ob_o, *chunk, *inner)
        tile_loop, w_at = ob_o, ob_o
    sch.set_scope(pad, 0, SCOPE_INP)
    sch.set_scope(conv, 0, SCOPE_ACC)
    sch.set_scope(rq, 0, SCOPE_ACC)
    if join is not None:
        sch.set_scope(join, 0, SCOPE_ACC)
    w_sram = sch.cache_read(conv, 1, SCOPE_WGT)
    sch.compute_at(pad, ic_o if chunked else ow_o)
    if chunked:  # each chunk's weight tiles contiguous per tap: its nest merges as unchunked
        t = k.tile_icb
        chunk_major = lambda ob, kh, kw, ib, o, i: (ob, ib // t, kh, kw, ib % t, o, i)  # noqa: E731
        sch.transform_layout(w_sram, ("write", 0), chunk_major)
        sch.transform_block_layout(w_sram, chunk_major)
    sch.compute_at(w_sram, w_at)
    if join is not None:
        sch.reverse_compute_at(join, tile_loop)
    sch.reverse_compute_at(rq, tile_loop)
    sch.reverse_compute_at(y, tile_loop)
    p_sram = sch.cache_read(rq, 1, SCOPE_ACC)
    sch.compute_at(p_sram, ob_o)
    sch.decompose_reduction(conv, ic_o if chunked else ob_i)
    sch.tensorize(o, gemm_intrin(cfg.block_in, cfg.block_out))
    if join is not None:
        sch.tensorize(sch.get_loops(join)[-1],
                      join_rows_intrin(cfg.block_out, 1 << (PLANE_SHIFT - s.lo_shift),
                                       s.lo_shift, units=2))
    sch.tensorize(sch.get_loops(rq)[-1],
                  requant_intrin(cfg.block_out, s.output_zp, s.clip[0], s.clip[1]))
    if k.double_buffer:  # the weight tile too: the next one loads during this one's tiles
        for loop in {tile_loop, w_at}:
            sch.annotate(loop, ANN_DOUBLE_BUFFER, 1)
    return sch


def conv_gemm_levels(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> list[tuple]:
    """One input chunk's GEMM loop levels (extent, acc, inp, wgt strides), outermost first,
    in the order :func:`schedule_conv2d` gives them (the walker emits the same nest)."""
    th, tw, toc = k.tile_oh, k.tile_ow, k.tile_ocb
    (sh, sw), (dh, dw) = s.tile_strides, s.dilation
    in_cols = conv_input_tile(s, k)[1]
    blocks = _input_blocks(s, k)
    ic = 1 if s.depthwise else k.tile_icb       # weight tiles per tap and chunk
    ob = (toc, 1, 1 if s.depthwise else 0, s.kh * s.kw * (1 if s.depthwise else s.icb))
    pix = [(th, tw * toc, sh * in_cols * blocks, 0), (tw, toc, sw * blocks, 0)]
    red = [(s.kh, 0, dh * in_cols * blocks, s.kw * ic), (s.kw, 0, dw * blocks, ic),
           (ic, 0, 1, 1)]
    return [ob, *red, *pix] if pixels_inner(cfg) else [ob, *pix, *red]


def layer_gemm_cycles(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> int:
    """Compute-engine cycles of the layer's GEMM instructions under these knobs."""
    oh, ow = s.out_hw
    tiles = s.n * (oh // k.tile_oh) * (ow // k.tile_ow) * (s.ocb // k.tile_ocb)
    return tiles * ic_chunks(s, k) * tile_gemm_cycles(cfg, conv_gemm_levels(cfg, s, k))


def fewest_folds(cfg: HardwareConfig, s: ConvShape) -> ConvKnobs:
    """The fitting tiling with the fewest GEMM cycles: each weight tile streams every
    output pixel the scratchpads hold, the mapping SCALE-Sim's closed forms assume (the
    default pick may tile pixels finer so the first input tile loads sooner)."""
    return lowest_estimate(candidate_knobs(cfg, s), lambda k: layer_gemm_cycles(cfg, s, k))


def conv_instructions(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> int:
    oh, ow = s.out_hw
    th, tw, toc = k.tile_oh, k.tile_ow, k.tile_ocb
    in_rows, in_cols = conv_input_tile(s, k)
    blocks = _input_blocks(s, k)                 # channel blocks of one input tile
    image_blocks = s.ocb if s.depthwise else s.icb
    if s.subsampled:  # one strided transfer per row
        (sh, sw) = s.strides
        chunk = copy_count([(in_rows, in_cols * blocks, sh * s.w * image_blocks),
                            (in_cols, blocks, sw * image_blocks), (blocks, 1, 1)])
    else:
        chunk = tile_copy(in_rows, in_cols, blocks, s.w, image_blocks)
    gemm = nest_count(conv_gemm_levels(cfg, s, k), GEMM_LEVELS)
    chunks = ic_chunks(s, k)
    stores = tile_copy(out_rows(s, th), tw, toc, ow, s.ocb)
    tiles_sp, tiles_oc = s.n * (oh // th) * (ow // tw), s.ocb // toc
    taps, t = s.kh * s.kw, k.tile_icb
    out_stage = 1 + 2 * s.planes
    weights = 1 if chunks == 1 else copy_count(  # chunk-major in the scratchpad
        [(toc, taps * s.icb, taps * s.icb), (chunks, taps * t, t), (s.kh, s.kw * t, s.kw * s.icb),
         (s.kw, t, s.icb), (t, 1, 1)])
    if k.weights_outer:  # weights and table per channel tile, input per spatial tile
        # loads, GEMMs, REQUANT (planes: after the join's SHR and MAC), stores
        per_tile = chunks * (chunk + gemm) + out_stage + stores
        return tiles_oc * (weights + 1) + tiles_oc * tiles_sp * per_tile + 1
    if chunks > 1:       # the input chunks load again for every channel tile
        return tiles_sp * tiles_oc * (weights + 1 + chunks * (chunk + gemm) + out_stage
                                      + stores) + 1
    return tiles_sp * (chunk + tiles_oc * (weights + 1 + gemm + out_stage + stores)) + 1


def conv_extents(s: ConvShape) -> dict[str, int]:
    oh, ow = s.out_hw
    return {"tile_oh": oh, "tile_ow": ow, "tile_ocb": s.ocb, "tile_icb": s.icb}


def conv_fill(cfg: HardwareConfig, s: ConvShape, k: ConvKnobs) -> list[float]:
    need = tile_footprint(s, k)
    return [need["inp"] / cfg.inp_depth, need["wgt"] / cfg.wgt_depth,
            need["acc"] / cfg.acc_depth]


def conv_perf_shape(s: ConvShape) -> ConvShape:
    clip = s.clip if tuple(s.clip) == WIDE_CLIP else (-128, 127)   # int16 stores cost more
    return dataclasses.replace(s, input_zp=0, output_zp=0, clip=clip, lo_shift=0)


# ----------------------------------------------------------------------------- layers
def is_depthwise(layer: Layer) -> bool:
    """A depthwise conv with channel multiplier 1 (the depthwise room's layers)."""
    return bool(getattr(layer, "depthwise", False)) and layer.weight.shape[1] == 1


def _recipe(layer: Conv2d | Dense, cfg: HardwareConfig, consts: bool) -> Recipe:
    bi, bo = cfg.block_in, cfg.block_out
    rq = layer.requant
    if isinstance(layer, Dense):
        if len(layer.input.shape) == 4 or len(layer.output.shape) == 4:
            raise UnsupportedLayer(f"{layer.name}: dense on 4-D {layer.input.shape}: the DSA "
                                   f"lays 4-D tensors out as NCHW images; give the layer the "
                                   f"(rows, K) view (relay_passes.to_layers does)")
        n, h, wd = _dense_image(layer)
        k = layer.input.shape[-1]
        shape = ConvShape(n, h, wd, ceil_div(k, bi), ceil_div(layer.weight.shape[0], bo), 1, 1,
                          (1, 1), (0, 0, 0, 0), (1, 1), bi, bo, layer.input.zero_point,
                          rq.zero_point, rq.clip, planes=layer.planes, lo_shift=layer.lo_shift)
        w = layer.weight[:, :, None, None]
    elif layer.groups == 1:
        n, c, h, wd = layer.input.shape
        o, _, kh, kw = layer.weight.shape
        shape = ConvShape(n, h, wd, ceil_div(c, bi), ceil_div(o, bo), kh, kw,
                          tuple(layer.strides), tuple(layer.padding), tuple(layer.dilation), bi,
                          bo, layer.input.zero_point, rq.zero_point, rq.clip)
        w = layer.weight
        check_out_hw(layer, shape.out_hw)
    else:
        raise UnsupportedLayer(f"{layer.name}: grouped conv2d (groups={layer.groups}, weight "
                               f"{layer.weight.shape}) is not lowered; only groups=1 and "
                               f"depthwise with channel multiplier 1")
    r = Recipe(KIND, shape, {"x": layer.input})
    if consts:
        r.consts = {"w": pack_conv_weights(w, bi, bo), "params": _table(layer, w, bo)}
    return r


def _dense_image(layer: Dense) -> tuple[int, int, int]:
    """(n, h, w) of the image a dense reads: (1, rows, 1), or with byte planes (the rows'
    leading axes, 2, M), its two rows the planes."""
    if not layer.planes:
        return 1, image_dims(layer.input.shape)[2], 1
    shape, out = tuple(layer.input.shape), tuple(layer.output.shape)
    m = shape[-2] // 2 if len(shape) >= 2 else 0
    want = shape[:-2] + (m, layer.weight.shape[0])
    if len(shape) < 2 or shape[-2] % 2 or out != want or layer.input.zero_point:
        raise UnsupportedLayer(f"{layer.name}: a byte-plane dense needs an even rows axis (hi "
                               f"rows then lo rows), zero point 0 and output {want}; got "
                               f"{shape} (zero point {layer.input.zero_point}) -> {out}")
    if not 0 <= layer.lo_shift <= PLANE_SHIFT:
        raise UnsupportedLayer(f"{layer.name}: a byte-plane join's lo_shift {layer.lo_shift} "
                               f"is not in 0..{PLANE_SHIFT}")
    return int(np.prod(shape[:-2], dtype=np.int64)), 2, m


def depthwise_recipe(layer: Conv2d, cfg: HardwareConfig, consts: bool) -> Recipe:
    """A depthwise conv on the array: diagonal weight tiles, one input block per output
    block."""
    bi, bo = cfg.block_in, cfg.block_out
    rq = layer.requant
    n, c, h, wd = layer.input.shape
    _, _, kh, kw = layer.weight.shape
    shape = ConvShape(n, h, wd, 1, ceil_div(c, bo), kh, kw, tuple(layer.strides),
                      tuple(layer.padding), tuple(layer.dilation), bi, bo,
                      layer.input.zero_point, rq.zero_point, rq.clip, depthwise=True)
    check_out_hw(layer, shape.out_hw)
    r = Recipe(KIND, shape, {"x": layer.input})
    if consts:
        r.consts = {"w": _diagonal_tiles(layer.weight, bo),
                    "params": _table(layer, layer.weight, bo)}
    return r


def _table(layer: Conv2d | Dense, w: np.ndarray, block: int) -> np.ndarray:
    """The output-stage table, the input zero point folded into the bias."""
    bias = np.asarray(layer.bias, np.int64) - layer.input.zero_point * w.astype(
        np.int64).sum(axis=(1, 2, 3))
    return requant_table(layer, bias, w.shape[0], block)


def _diagonal_tiles(w: np.ndarray, block: int) -> np.ndarray:
    """Depthwise int8 [C, 1, KH, KW] -> [CB][KH][KW][1][block][block] weight tiles whose
    diagonal holds each channel's tap: the array then multiplies lane i by lane i only."""
    c, _, kh, kw = w.shape
    cb = ceil_div(c, block)
    taps = np.zeros((cb * block, kh, kw), np.int8)
    taps[:c] = w[:, 0]
    tiles = np.zeros((cb, kh, kw, 1, block, block), np.int8)
    lane = np.arange(block)
    tiles[:, :, :, 0, lane, lane] = taps.reshape(cb, block, kh, kw).transpose(0, 2, 3, 1)
    return tiles


def run_conv2d(ly: Conv2d, x: np.ndarray) -> np.ndarray:
    """The integer reference of any conv2d (grouped and depthwise too)."""
    xc = pad(centered(x, ly.input), ly.padding, 0)  # pads are the zero point: 0 once centred
    n, cin = xc.shape[:2]
    cout, ipg, kh, kw = ly.weight.shape
    g = ly.groups
    if cin != ipg * g or cout % g:
        raise ValueError(f"{ly.name}: {cin} input channels, weight {ly.weight.shape}, groups {g}")
    oh, ow = ly.output.shape[2:]
    win = windows(xc, (kh, kw), ly.strides, ly.dilation, (oh, ow))  # N C OH OW KH KW
    win = win.reshape(n, g, ipg, oh, ow, kh, kw)
    w = ly.weight.astype(np.int64).reshape(g, cout // g, ipg, kh, kw)
    acc = np.einsum("ngihwyx,goiyx->ngohw", win, w, optimize=True).reshape(n, cout, oh, ow)
    acc = acc + ly.bias.astype(np.int64).reshape(1, cout, 1, 1)
    return apply_requant(acc, ly.requant, axis=1)


def _run(ly: Conv2d | Dense, env: dict[str, np.ndarray]) -> np.ndarray:
    x = env[ly.input.name]
    if isinstance(ly, Conv2d):
        return run_conv2d(ly, x)
    acc = centered(x, ly.input) @ ly.weight.astype(np.int64).T
    if ly.planes:
        acc = join_planes_shifted(acc, ly.lo_shift)
    return apply_requant(acc + ly.bias.astype(np.int64), ly.requant, axis=-1)


def conv_bounds(ly: Conv2d | Dense) -> tuple[int, int]:
    """Compulsory DRAM bytes: the input pixels some window reads (all of a dense
    layer's), the weights, the output."""
    if isinstance(ly, Conv2d):
        return with_weights(ly, window_input(ly, ly.weight.shape[2:], ly.dilation))
    return with_weights(ly, elements(ly.input.shape))


KIND = Kind(
    name="conv2d", layers=(Conv2d, Dense), claims=lambda ly: not is_depthwise(ly),
    recipe=_recipe, reference=_run, bounds=conv_bounds, ops=mac_ops,
    shape=ConvShape, knobs=ConvKnobs, build=conv2d, schedule=schedule_conv2d, fits=fits,
    candidates=candidate_knobs, default=default_conv_knobs, estimate=estimate_cycles,
    instructions=conv_instructions,
    tiles=lambda s: {"tile_oh": ("conv", 1), "tile_ow": ("conv", 2), "tile_ocb": ("conv", 3),
                     "tile_icb": ("conv", 7)},
    extents=conv_extents, fill=conv_fill, perf_shape=conv_perf_shape)
