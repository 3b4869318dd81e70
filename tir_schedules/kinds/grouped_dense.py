"""Room: a dense whose weights have a scale and an offset per group of input rows
(``layers.ir.GroupedDense``: GGUF Q4_1's grid, what int4 LLM weights ship on).

The array sums each group on its own; the vector unit scales and adds the groups. Per
row tile and output-block tile::

    part[m, g, nb]  = sum over the group's K blocks of x . w     (GEMM)
    xsum[m, g]      = sum over the group's K blocks of x . ones  (GEMM, every lane: S)
    scaled[m, g, nb] = rshift_round(part * scale + xsum * offset, shift)   (MUL, MAC, SHR)
    acc[m, nb]      = sum_g scaled                                (ADD, a reduction level)
    y               = requant(acc + bias)                         (REQUANT)

The factors are int16 rows in DRAM (ACC16 loads): two per group and output block, the
same 5 bits a weight as Q4_1's fp16 step and minimum, and the int4 codes pack two a byte
(``lowering.int4_weights``). ``layers.group_grid`` sizes the factors so nothing wraps.
The device needs whole groups of whole K blocks; other layers stay on the CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from tvm import s_tir, te, tirx

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa import semantics as sem
from dsa_tvm.isa.instructions import ALU_LEVELS, GEMM_LEVELS
from dsa_tvm.layers.checks import elements, with_weights
from dsa_tvm.layers.ir import WIDE_CLIP, GroupedDense
from dsa_tvm.layers.layouts import from_pixel_rows, image_dims, pack_conv_weights, pixel_rows
from dsa_tvm.layers.reference import PLANE_SHIFT, apply_requant

from ..counts import copy_count, nest_count, reduction_count
from ..intrinsics import (
    SCALAR_GROUP_SCALE,
    acc_intrin,
    gemm_intrin,
    group_scale_intrin,
    requant_intrin,
)
from ..names import ANN_DOUBLE_BUFFER, SCALAR_REQUANT, SCOPE_ACC, SCOPE_INP, SCOPE_WGT
from ..tiling import (
    divisors,
    lowest_estimate,
    output_stage_cycles,
    pixels_inner,
    scratchpads_fit,
    tile_gemm_cycles,
)
from .base import Kind, Recipe, UnsupportedLayer, mac_ops, requant_table


@dataclass(frozen=True)
class GroupedShape:
    m: int              # rows
    kb: int             # K in input blocks (groups x gk)
    nb: int             # N in output blocks
    gk: int             # input blocks per group
    block_in: int
    block_out: int
    shift: int          # each group's right shift (the lo plane's: 8 more)
    output_zp: int
    clip: tuple[int, int]
    planes: bool = False  # the input rows are int16 codes' byte planes: hi rows, lo rows

    @property
    def groups(self) -> int:
        return self.kb // self.gk

    @property
    def p(self) -> int:
        """Planes of input rows behind each output row."""
        return 2 if self.planes else 1


@dataclass(frozen=True)
class GroupedKnobs:
    tile_m: int          # rows per tile (divides M)
    tile_nb: int         # output blocks per tile (divides NB)
    double_buffer: bool


def grouped_dense(s: GroupedShape) -> tirx.PrimFunc:
    """Stages ``part``, ``xsum`` (GEMMs), ``scaled`` (the group stage), ``acc`` (the sum
    over groups and planes), ``requant``, ``y``. Each plane's shift is a row of
    ``shifts`` (SHR's tensor form: the lo plane shifts 8 more)."""
    bi, bo, gk, ng, np_ = s.block_in, s.block_out, s.gk, s.groups, s.p
    x = te.placeholder((np_, s.m, s.kb, bi), "int8", name="x")
    w = te.placeholder((s.nb, s.kb, bo, bi), "int8", name="w")
    ones = te.placeholder((bo, bi), "int8", name="ones")
    factors = te.placeholder((s.nb, ng, 2, bo), "int16", name="factors")
    shifts = te.placeholder((np_, bo), "int32", name="shifts")
    params = te.placeholder((s.nb, 3, bo), "int32", name="params")
    r, i = te.reduce_axis((0, gk), "r"), te.reduce_axis((0, bi), "i")
    part = te.compute(
        (np_, s.m, ng, s.nb, bo),
        lambda p, m, g, n, o: te.sum(x[p, m, g * gk + r, i].astype("int32")
                                     * w[n, g * gk + r, o, i].astype("int32"), axis=[r, i]),
        name="part")
    r2, i2 = te.reduce_axis((0, gk), "r2"), te.reduce_axis((0, bi), "i2")
    xsum = te.compute(
        (np_, s.m, ng, bo),
        lambda p, m, g, o: te.sum(x[p, m, g * gk + r2, i2].astype("int32")
                                  * ones[o, i2].astype("int32"), axis=[r2, i2]),
        name="xsum")
    scaled = te.compute(
        (np_, s.m, ng, s.nb, bo),
        lambda p, m, g, n, o: tirx.call_pure_extern(
            "int32", SCALAR_GROUP_SCALE, part[p, m, g, n, o], xsum[p, m, g, o],
            factors[n, g, 0, o].astype("int32"), factors[n, g, 1, o].astype("int32"),
            shifts[p, o]),
        name="scaled")
    rp, rg = te.reduce_axis((0, np_), "p"), te.reduce_axis((0, ng), "g")
    acc = te.compute((s.m, s.nb, bo),
                     lambda m, n, o: te.sum(scaled[rp, m, rg, n, o], axis=[rp, rg]),
                     name="acc")
    lo, hi = s.clip
    rq = te.compute(acc.shape, lambda m, n, o: tirx.call_pure_extern(
        "int32", SCALAR_REQUANT, acc[m, n, o], params[n, 0, o], params[n, 1, o],
        params[n, 2, o], s.output_zp, lo, hi), name="requant")
    y = te.compute(acc.shape, lambda *idx: rq(*idx).astype(_out_dtype(s)), name="y")
    return te.create_prim_func([x, w, ones, factors, shifts, params, y])


def _out_dtype(s: GroupedShape) -> str:
    return "int16" if tuple(s.clip) == WIDE_CLIP else "int8"


# ----------------------------------------------------------------------------- knobs
def grouped_footprint(s: GroupedShape, k: GroupedKnobs) -> dict[str, int]:
    nbuf = 2 if k.double_buffer else 1
    tm, tn, ng = k.tile_m, k.tile_nb, s.groups
    rows = s.p * tm                       # input rows behind the tile's output rows
    return {"inp": nbuf * rows * s.kb,
            "wgt": nbuf * tn * s.kb + 1,
            # part and scaled per group, xsum per group, the sum and its requantize; the
            # factor rows (two a group), the shifts and the output-stage table
            "acc": nbuf * (2 * rows * ng * tn + rows * ng + 2 * tm * tn + 2 * ng * tn
                           + s.p + 3 * tn)}


def grouped_fits(cfg: HardwareConfig, s: GroupedShape, k: GroupedKnobs) -> str | None:
    if s.m % k.tile_m or s.nb % k.tile_nb:
        return f"tiles {k.tile_m} x {k.tile_nb} do not divide {s.m} rows x {s.nb} blocks"
    return scratchpads_fit(cfg, grouped_footprint(s, k))


def _part_levels(cfg: HardwareConfig, s: GroupedShape, k: GroupedKnobs) -> list[tuple]:
    """One tile's ``part`` GEMM loop levels (extent, acc, inp, wgt strides), in the order
    :func:`schedule_grouped_dense` gives them."""
    tm, tn, ng = k.tile_m, k.tile_nb, s.groups
    nb = (tn, 1, 0, s.kb)
    g = (ng, tn, s.gk, s.gk)
    r = (s.gk, 0, 1, 1)
    p = (s.p, tm * ng * tn, tm * s.kb, 0)
    m = (tm, ng * tn, s.kb, 0)
    return [nb, g, r, p, m] if pixels_inner(cfg) else [p, m, g, nb, r]


def _xsum_levels(s: GroupedShape, k: GroupedKnobs) -> list[tuple]:
    tm, ng = k.tile_m, s.groups
    return [(s.p, tm * ng, tm * s.kb, 0), (tm, ng, s.kb, 0), (ng, 1, s.gk, 0), (s.gk, 0, 1, 0)]


def estimate_grouped_cycles(cfg: HardwareConfig, s: GroupedShape, k: GroupedKnobs) -> float:
    """Both GEMMs and four ALU passes per group row (three for the group stage, one for
    the sum) plus the requantize, against the DMA of the tiles."""
    bw, lat = cfg.bandwidth_bytes_per_cycle, cfg.latency_cycles
    tiles_m, tiles_n = s.m // k.tile_m, s.nb // k.tile_nb
    tiles = tiles_m * tiles_n
    rows = k.tile_m * k.tile_nb
    gemm = (tile_gemm_cycles(cfg, _part_levels(cfg, s, k))
            + tile_gemm_cycles(cfg, _xsum_levels(s, k)) + 2 * cfg.gemm_fill_drain_cycles)
    alu = ((4 * s.groups * s.p + 1) * rows * cfg.alu_cycles_per_row
           + 5 * cfg.alu_latency_cycles)
    compute = tiles * output_stage_cycles(cfg, gemm, alu)
    w_bytes = k.tile_nb * (s.kb * cfg.wgt_tile_bytes + s.groups * 4 * s.block_out)
    in_bytes = s.p * k.tile_m * s.kb * s.block_in
    out_bytes = rows * s.block_out * (2 if _out_dtype(s) == "int16" else 1)
    dma = tiles_n * (w_bytes + tiles_m * (in_bytes + out_bytes)) / bw + tiles * lat * 0.1
    return max(compute, dma) if k.double_buffer else compute + dma


def candidate_grouped_knobs(cfg: HardwareConfig, s: GroupedShape) -> list[GroupedKnobs]:
    return [k for db in (True, False) for tn in divisors(s.nb) for tm in divisors(s.m)
            if grouped_fits(cfg, s, k := GroupedKnobs(tm, tn, db)) is None]


def default_grouped_knobs(cfg: HardwareConfig, s: GroupedShape) -> GroupedKnobs:
    cands = candidate_grouped_knobs(cfg, s)
    if not cands:
        raise ValueError(f"no tiling of this grouped dense fits '{cfg.name}': "
                         f"{grouped_fits(cfg, s, GroupedKnobs(1, 1, False))}")
    return lowest_estimate(cands, lambda k: estimate_grouped_cycles(cfg, s, k))


def grouped_instructions(cfg: HardwareConfig, s: GroupedShape, k: GroupedKnobs) -> int:
    """Per output-block tile its five loads (weights, ones, factors, shifts, table); per
    row tile the input load, both GEMMs, the group stage's three ops, the sum over groups
    (its first step apart), REQUANT and the store, each counted with the walker's nest
    geometry (``tir_schedules.counts``)."""
    tm, tn, ng, p, kb = k.tile_m, k.tile_nb, s.groups, s.p, s.kb
    part = (tm * ng * tn, ng * tn, tn, 1)                # p, m, g, n strides of a tile
    xs = (tm * ng, ng, 1, 0)
    gemm = (nest_count(_part_levels(cfg, s, k), GEMM_LEVELS)
            + nest_count(_xsum_levels(s, k), GEMM_LEVELS))
    stage = [[(e, d, a, b) for e, d, a, b in zip((p, tm, ng, tn), part, src, row)]
             for src, row in ((part, (0, 0, 2, 2 * ng)),      # MUL: part x factors
                              (xs, (0, 0, 2, 2 * ng)),        # MAC: xsum x factors
                              (part, (1, 0, 0, 0)))]          # SHR: by the plane's shift
    alu = sum(nest_count(lv, ALU_LEVELS) for lv in stage)
    total = reduction_count([(tm, tn, tn, ng * tn), (tn, 1, 1, 1),
                             (p, 0, 0, part[0]), (ng, 0, 0, tn)])
    out = nest_count([(tm, tn, tn, 0), (tn, 1, 1, 3)], ALU_LEVELS) + copy_count(
        [(tm, tn, s.nb), (tn, 1, 1)])
    rows = copy_count([(p, tm * kb, s.m * kb), (tm, kb, kb), (kb, 1, 1)])
    per_row_tile = rows + gemm + alu + total + out
    return (s.nb // tn) * (5 + (s.m // tm) * per_row_tile) + 1


# ----------------------------------------------------------------------------- schedule
def schedule_grouped_dense(func: tirx.PrimFunc, cfg: HardwareConfig, s: GroupedShape,
                           k: GroupedKnobs) -> s_tir.Schedule:
    """Output-block tiles outermost (their weights, factors and table stay resident), row
    tiles inside; the input rows load once per tile for both GEMMs."""
    problem = grouped_fits(cfg, s, k)
    if problem:
        raise ValueError(f"grouped dense tiling {k} does not fit '{cfg.name}': {problem}")
    sch = s_tir.Schedule(func)
    part, xsum, scaled = (sch.get_sblock(n) for n in ("part", "xsum", "scaled"))
    acc, rq, y = (sch.get_sblock(n) for n in ("acc", "requant", "y"))
    m, nb, _ = sch.get_loops(y)
    m_o, m_i = sch.split(m, [None, k.tile_m])
    nb_o, nb_i = sch.split(nb, [None, k.tile_nb])
    sch.reorder(nb_o, m_o, m_i, nb_i)
    for blk in (part, xsum, scaled, acc, rq):
        sch.set_scope(blk, 0, SCOPE_ACC)
    for blk in (rq, acc, scaled, xsum, part):     # consumers first: each lands under m_o
        sch.compute_at(blk, m_o, preserve_unit_loops=True)
    pp, pm, g, pn, o, r, _ = sch.get_loops(part)[-7:]
    ws = pixels_inner(cfg)
    sch.reorder(*((pn, g, r, pp, pm) if ws else (pp, pm, g, pn, r)), o)
    x_s = sch.cache_read(part, 0, SCOPE_INP, consumer_blocks=[part, xsum])
    sch.compute_at(x_s, m_o)
    for blk, index, scope in ((part, 1, SCOPE_WGT), (xsum, 1, SCOPE_WGT),
                              (scaled, 2, SCOPE_ACC), (scaled, 3, SCOPE_ACC),
                              (rq, 1, SCOPE_ACC)):
        sch.compute_at(sch.cache_read(blk, index, scope), nb_o)
    sch.decompose_reduction(part, pn if ws else pp)
    sch.tensorize(o, gemm_intrin(cfg.block_in, cfg.block_out))
    xp, _, _, xo, xr, _ = sch.get_loops(xsum)[-6:]
    sch.reorder(xr, xo)
    sch.decompose_reduction(xsum, xp)
    sch.tensorize(xo, gemm_intrin(cfg.block_in, cfg.block_out))
    sch.tensorize(sch.get_loops(scaled)[-1], group_scale_intrin(cfg.block_out))
    am, _, ao, ap, ag = sch.get_loops(acc)[-5:]
    sch.reorder(ap, ag, ao)
    sch.decompose_reduction(acc, am)
    sch.tensorize(sch.get_loops(sch.get_sblock("acc_update"))[-1],
                  acc_intrin("add", cfg.block_out))
    sch.tensorize(sch.get_loops(rq)[-1],
                  requant_intrin(cfg.block_out, s.output_zp, s.clip[0], s.clip[1]))
    if k.double_buffer:
        for loop in (m_o, nb_o):
            sch.annotate(loop, ANN_DOUBLE_BUFFER, 1)
    return sch


# ----------------------------------------------------------------------------- layers
def device_problem(layer: GroupedDense, block_in: int) -> str | None:
    """Why the device cannot run this layer's grid (None: it can)."""
    k = int(layer.weight.shape[1])
    if layer.group % block_in or k % layer.group:
        return (f"groups of {layer.group} input rows over K={k}: the device needs whole "
                f"groups of whole {block_in}-row blocks")
    if layer.input.dtype != "int8":
        return f"an {layer.input.dtype} input (the grouped dense reads int8 rows)"
    if not 0 <= layer.shift <= 31 - PLANE_SHIFT * layer.planes:
        return f"group shift {layer.shift} outside 0..{31 - PLANE_SHIFT * layer.planes}"
    if layer.planes:
        shape = tuple(layer.input.shape)
        want = shape[:-2] + (shape[-2] // 2, layer.weight.shape[0])
        if (len(shape) < 2 or shape[-2] % 2 or int(np.prod(shape[:-2], dtype=np.int64)) != 1
                or tuple(layer.output.shape) != want or layer.input.zero_point):
            return (f"byte planes need one matrix of an even number of rows (hi rows, then "
                    f"lo rows), zero point 0 and output {want}; got {shape} (zero point "
                    f"{layer.input.zero_point}) -> {tuple(layer.output.shape)}")
    return None


def grouped_recipe(layer: GroupedDense, cfg: HardwareConfig, consts: bool) -> Recipe:
    bi, bo = cfg.block_in, cfg.block_out
    problem = device_problem(layer, bi)
    if problem:
        raise UnsupportedLayer(f"{layer.name}: {problem}")
    n_out, k = (int(d) for d in layer.weight.shape)
    n, _, h, w = image_dims(layer.output.shape)
    rows = n * h * w                     # a matrix's rows, or an image's pixels (a 1x1 conv)
    rq = layer.requant
    shape = GroupedShape(rows, k // bi, ceil_div(n_out, bo), layer.group // bi, bi, bo,
                         layer.shift, rq.zero_point, rq.clip, layer.planes)
    r = Recipe(KIND, shape, {"x": layer.input})
    if consts:
        nb, ng = shape.nb, shape.groups
        f = np.zeros((nb * bo, ng, 2), np.int16)
        f[:n_out, :, 0], f[:n_out, :, 1] = layer.scales, layer.offsets
        r.consts = {
            "w": pack_conv_weights(layer.weight[:, :, None, None], bi, bo).reshape(
                nb, k // bi, bo, bi),
            "ones": np.ones((bo, bi), np.int8),
            "factors": np.ascontiguousarray(f.reshape(nb, bo, ng, 2).transpose(0, 2, 3, 1)),
            "shifts": np.repeat(layer.shift + PLANE_SHIFT * np.arange(shape.p, dtype=np.int32),
                                bo).reshape(shape.p, bo),
            "params": requant_table(layer, layer.bias, n_out, bo)}
    return r


def run_grouped_dense(ly: GroupedDense, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer reference (``layers.ir.GroupedDense``), in the ALU's own arithmetic."""
    x = env[ly.input.name].astype(np.int64)
    if x.ndim == 4:                      # an NCHW image: a 1x1 conv over its pixels' rows
        n, c, h, w = x.shape
        rows_ly = dataclasses.replace(
            ly, input=dataclasses.replace(ly.input, shape=(n * h * w, c)),
            output=dataclasses.replace(ly.output, shape=(n * h * w, int(ly.weight.shape[0]))))
        y = run_grouped_dense(rows_ly, {ly.input.name: pixel_rows(x)})
        return from_pixel_rows(y, tuple(ly.output.shape))
    w = ly.weight.astype(np.int64)
    lead, m = x.shape[:-2], x.shape[-2] // (2 if ly.planes else 1)
    planes = ([(x[..., :m, :], ly.shift), (x[..., m:, :], ly.shift + PLANE_SHIFT)]
              if ly.planes else [(x, ly.shift)])
    acc = np.zeros((int(np.prod(lead, dtype=np.int64)) * m, w.shape[0]), np.int64)
    wf = w.astype(np.float64)   # products in float64 are exact (far below 2**53) and BLAS's
    for plane, shift in planes:
        rows = plane.reshape(-1, x.shape[-1])
        rf = rows.astype(np.float64)
        for g in range(ly.groups_per_row):
            ks = slice(g * ly.group, (g + 1) * ly.group)
            p = (rf[:, ks] @ wf[:, ks].T).astype(np.int64)
            s = rows[:, ks].sum(axis=1, keepdims=True)
            v = sem.wrap_int32(sem.wrap_int32(p * ly.scales[:, g].astype(np.int64))
                               + s * ly.offsets[:, g].astype(np.int64))
            acc += sem.rshift_round(v, shift)
    out = apply_requant(acc + ly.bias.astype(np.int64), ly.requant, axis=-1)
    return out.reshape(*lead, m, w.shape[0])


def grouped_bounds(ly: GroupedDense) -> tuple[int, int]:
    """Every input row and weight once (the weights as int8, what ``int4_weights`` halves),
    the factors (two int16 a group and channel), the output."""
    read, write = with_weights(ly, elements(ly.input.shape))
    return read + 4 * int(ly.scales.size), write


KIND = Kind(
    name="grouped_dense", layers=(GroupedDense,), recipe=grouped_recipe,
    reference=run_grouped_dense, bounds=grouped_bounds, ops=mac_ops,
    shape=GroupedShape, knobs=GroupedKnobs, build=grouped_dense,
    schedule=schedule_grouped_dense, fits=grouped_fits, candidates=candidate_grouped_knobs,
    default=default_grouped_knobs, estimate=estimate_grouped_cycles,
    instructions=grouped_instructions,
    tiles=lambda s: {"tile_m": ("y", 0), "tile_nb": ("y", 1)},
    extents=lambda s: {"tile_m": s.m, "tile_nb": s.nb},
    fill=lambda cfg, s, k: [grouped_footprint(s, k)["inp"] / cfg.inp_depth,
                            grouped_footprint(s, k)["wgt"] / cfg.wgt_depth,
                            grouped_footprint(s, k)["acc"] / cfg.acc_depth],
    perf_shape=lambda s: dataclasses.replace(s, output_zp=0, clip=(
        s.clip if tuple(s.clip) == WIDE_CLIP else (-128, 127))))
