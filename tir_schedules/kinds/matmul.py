"""Room: batched matmul of two activations (attention's Q @ K^T and P @ V) on the MAC array.

The array multiplies an input row by a weight tile, so the second operand must
arrive as weight tiles. Both operands are produced on the CPU in the graphs
this serves (reshape/transpose/softmax stay there), so the host packs them at
the region boundary (``dsa_tvm.layers.host_pack``): ``b`` into per-batch
tiles ``w[bt, nb, kb, o, i]`` with the zero-point terms that depend on ``b``
in the output-stage table, and ``a`` into ordinary activation rows plus one
correction row per input row. The DSA then computes

    acc  = sum_k a * b                       (GEMM on raw int8)
    acc2 = acc + r[row]                      (r = -zp_b * sum_k a, every lane)
    y    = requant(acc2 + bias[bt, n])       (bias = -zp_a * sum_k b + K * zp_a * zp_b)

which is ``sum_k (a - zp_a) * (b - zp_b)`` exactly (int32 wrap-around arithmetic).

``planes`` (attention's P @ V with int16 probabilities, made by a softmax with
``planes``): ``a`` holds int16 codes as int8 byte planes, rows interleaved; the GEMM runs
over both rows of each pair against the same weight tiles (``b`` is read once) and a
join stage adds them exactly before the requantize, ``acc = 256 acc[2m] + acc[2m + 1]``
(one MUL and one MAC, ``join_rows_intrin``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from tvm import s_tir, te, tirx

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.layers.checks import elements
from dsa_tvm.layers.host_pack import COLSUM, PARAMS, ROWSUM, batch_dims
from dsa_tvm.layers.ir import WIDE_CLIP, BatchMatmul
from dsa_tvm.layers.layouts import pack_output_stage
from dsa_tvm.layers.reference import PLANE_SHIFT, apply_requant, centered, join_planes

from ..intrinsics import (
    SCALAR_AXPBY,
    alu_intrin,
    gemm_intrin,
    join_rows_intrin,
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
class MatmulShape:
    batch: int          # product of the leading dimensions
    m: int              # rows of a and of the output, per batch
    kb: int             # K in input blocks
    nb: int             # N in output blocks
    block_in: int
    block_out: int
    output_zp: int
    clip: tuple[int, int]
    corrected: bool = True  # host-packed operands: + the row corrections r (else none)
    columns: bool = False   # on the device with zp_a != 0: + a column correction c[t, nb]
    planes: bool = False    # a: interleaved byte planes (2m rows), joined before the requant
    uniform: bool = False   # one requant for every column and batch (on the device, per
    #                         tensor): one block of the table serves them all


def _rows(s: "MatmulShape", m: int) -> int:
    """Rows of ``a`` behind ``m`` output rows: two a row with byte planes."""
    return 2 * m if s.planes else m


@dataclass(frozen=True)
class MatmulKnobs:
    tile_m: int          # rows per tile (divides M)
    tile_nb: int         # output blocks per tile (divides NB)
    double_buffer: bool
    #: row tiles outside the output-block tiles: each row tile read once and the weight
    #: tiles once a row tile (a decode step's P @ V: a few rows against a long cache),
    #: instead of the weight tiles once and each row tile once an output-block tile
    rows_outer: bool = False


def batch_matmul(s: MatmulShape) -> tirx.PrimFunc:
    """Stages ``matmul`` (int32 GEMM), ``correct`` (+ r; host-packed operands only),
    ``requant``, ``y``."""
    bi, bo = s.block_in, s.block_out
    x = te.placeholder((s.batch, _rows(s, s.m), s.kb, bi), "int8", name="x")
    w = te.placeholder((s.batch, s.nb, s.kb, bo, bi), "int8", name="w")
    params = te.placeholder((1, 1, 3, bo) if s.uniform else (s.batch, s.nb, 3, bo), "int32",
                            name="params")
    rk = te.reduce_axis((0, s.kb), "kb")
    ri = te.reduce_axis((0, bi), "i")
    acc = te.compute(
        (s.batch, _rows(s, s.m), s.nb, bo),
        lambda t, m, nb, o: te.sum(x[t, m, rk, ri].astype("int32")
                                   * w[t, nb, rk, o, ri].astype("int32"), axis=[rk, ri]),
        name="matmul")
    if s.corrected:
        r = te.placeholder((s.batch, s.m, bo), "int32", name="r")
        acc2 = te.compute(acc.shape, lambda t, m, nb, o: acc[t, m, nb, o] + r[t, m, o],
                          name="correct")
    elif s.columns:
        r = te.placeholder((s.batch, s.nb, bo), "int32", name="c")
        acc2 = te.compute(acc.shape, lambda t, m, nb, o: acc[t, m, nb, o] + r[t, nb, o],
                          name="correct")
    elif s.planes:
        acc2 = te.compute((s.batch, s.m, s.nb, bo), lambda t, m, nb, o: tirx.call_pure_extern(
            "int32", SCALAR_AXPBY, acc[t, 2 * m, nb, o], acc[t, 2 * m + 1, nb, o],
            1 << PLANE_SHIFT, 1), name="join")
    else:
        acc2 = acc
    lo, hi = s.clip

    def table(t, nb, j, o):
        return params[0, 0, j, o] if s.uniform else params[t, nb, j, o]

    rq = te.compute(acc2.shape, lambda t, m, nb, o: tirx.call_pure_extern(
        "int32", SCALAR_REQUANT, acc2[t, m, nb, o], table(t, nb, 0, o), table(t, nb, 1, o),
        table(t, nb, 2, o), s.output_zp, lo, hi), name="requant")
    out = te.compute(acc2.shape, lambda *i: rq(*i).astype(_out_dtype(s)), name="y")
    return te.create_prim_func([x, w, r, params, out] if s.corrected or s.columns
                               else [x, w, params, out])


def _out_dtype(s: MatmulShape) -> str:
    """int16 with REQUANT's wide clip (e.g. a byte plane's partial sums), else int8."""
    return "int16" if tuple(s.clip) == WIDE_CLIP else "int8"


def _fixes(s: MatmulShape) -> int:
    """1 when a correction stage runs (host rows or device columns), else 0."""
    return int(s.corrected or s.columns)


def _stages(s: MatmulShape) -> int:
    """Stages between the GEMM and the requantize: a correction, or a join (planes)."""
    return int(s.corrected or s.columns or s.planes)


# ----------------------------------------------------------------------------- knobs
def matmul_footprint(s: MatmulShape, k: MatmulKnobs) -> dict[str, int]:
    nbuf = 2 if k.double_buffer else 1
    tile = k.tile_m * k.tile_nb
    return {"inp": nbuf * _rows(s, k.tile_m) * s.kb,
            "wgt": nbuf * k.tile_nb * s.kb,
            # GEMM result, corrected sum, requantized rows, correction rows, table; planes:
            # the GEMM's two rows a row, the joined rows, the requantized rows
            "acc": nbuf * ((3 * tile + k.tile_m) if s.corrected
                           else (3 * tile + k.tile_nb) if s.columns
                           else 4 * tile if s.planes else 2 * tile)
            + nbuf * 3 * (1 if s.uniform else k.tile_nb)}


def matmul_fits(cfg: HardwareConfig, s: MatmulShape, k: MatmulKnobs) -> str | None:
    return scratchpads_fit(cfg, matmul_footprint(s, k))


def matmul_gemm_levels(cfg: HardwareConfig, s: MatmulShape, k: MatmulKnobs) -> list[tuple]:
    """One tile's GEMM loop levels (extent, acc, inp, wgt strides) in schedule order."""
    m = (_rows(s, k.tile_m), k.tile_nb, s.kb, 0)
    nb = (k.tile_nb, 1, 0, s.kb)
    kb = (s.kb, 0, 1, 1)
    return [nb, kb, m] if pixels_inner(cfg) else [m, nb, kb]


def estimate_matmul_cycles(cfg: HardwareConfig, s: MatmulShape, k: MatmulKnobs) -> float:
    """GEMM steps and two ALU passes per output row against the DMA of the tiles."""
    bw, lat = cfg.bandwidth_bytes_per_cycle, cfg.latency_cycles
    tiles_m, tiles_n = s.m // k.tile_m, s.nb // k.tile_nb
    tiles = s.batch * tiles_m * tiles_n
    rows = k.tile_m * k.tile_nb
    compute = tiles * output_stage_cycles(
        cfg, tile_gemm_cycles(cfg, matmul_gemm_levels(cfg, s, k)) + cfg.gemm_fill_drain_cycles,
        (1 + _fixes(s) + 2 * s.planes) * rows * cfg.alu_cycles_per_row
        + (2 + _fixes(s) + 2 * s.planes) * cfg.alu_latency_cycles)
    w_bytes = k.tile_nb * s.kb * cfg.wgt_tile_bytes
    in_bytes = k.tile_m * (_rows(s, 1) * s.kb * cfg.block_in + 4 * cfg.block_out * s.corrected)
    out_bytes = rows * cfg.block_out * (2 if _out_dtype(s) == "int16" else 1)
    moved = (tiles_m * (in_bytes + tiles_n * (w_bytes + out_bytes)) if k.rows_outer
             else tiles_n * (w_bytes + tiles_m * (in_bytes + out_bytes)))
    dma = s.batch * moved / bw + tiles * lat * 0.1
    return max(compute, dma) if k.double_buffer else compute + dma


def candidate_matmul_knobs(cfg: HardwareConfig, s: MatmulShape) -> list[MatmulKnobs]:
    return [k for db in (True, False) for tn in divisors(s.nb) for tm in divisors(s.m)
            for ro in (False, True)
            if matmul_fits(cfg, s, k := MatmulKnobs(tm, tn, db, ro)) is None]


def default_matmul_knobs(cfg: HardwareConfig, s: MatmulShape) -> MatmulKnobs:
    cands = candidate_matmul_knobs(cfg, s)
    if not cands:
        raise ValueError(f"no tiling of this batch matmul fits '{cfg.name}': "
                         f"{matmul_fits(cfg, s, MatmulKnobs(1, 1, False))}")
    return lowest_estimate(cands, lambda k: estimate_matmul_cycles(cfg, s, k))


def matmul_instructions(cfg: HardwareConfig, s: MatmulShape, k: MatmulKnobs) -> int:
    tiles_m, tiles_n = s.m // k.tile_m, s.nb // k.tile_nb
    # per output-block tile: weights, table (column corrections); per row tile: rows
    # (row corrections); per tile: GEMM, correction add, REQUANT, store (planes: + the
    # join's MUL and MAC)
    per_tile = 3 + _fixes(s) + 2 * s.planes
    per_n, per_m = 2 + s.columns, 1 + s.corrected
    if k.rows_outer:
        return s.batch * tiles_m * (per_m + tiles_n * (per_n + per_tile)) + 1
    return s.batch * tiles_n * (per_n + tiles_m * (per_m + per_tile)) + 1


# ----------------------------------------------------------------------------- schedule
def schedule_batch_matmul(func: tirx.PrimFunc, cfg: HardwareConfig, s: MatmulShape,
                          k: MatmulKnobs) -> s_tir.Schedule:
    """Per batch: output-block tiles outermost (weight tiles and table stay resident),
    row tiles inside, or the other way round (``rows_outer``: each row tile stays
    resident); GEMM, correction add and requant tensorized."""
    problem = matmul_fits(cfg, s, k)
    if problem:
        raise ValueError(f"batch matmul tiling {k} does not fit '{cfg.name}': {problem}")
    sch = s_tir.Schedule(func)
    mm = sch.get_sblock("matmul")
    corr = (sch.get_sblock("correct") if _fixes(s)
            else sch.get_sblock("join") if s.planes else None)
    rq, y = sch.get_sblock("requant"), sch.get_sblock("y")
    tails = (corr, rq) if _stages(s) else (rq,)
    t, m, nb, o, kb, i = sch.get_loops(mm)
    m_o, m_i = sch.split(m, [None, _rows(s, k.tile_m)])
    nb_o, nb_i = sch.split(nb, [None, k.tile_nb])
    ws = pixels_inner(cfg)  # weight-stationary: the rows stream past one weight tile
    outer, inner = (m_o, nb_o) if k.rows_outer else (nb_o, m_o)
    sch.reorder(t, outer, inner, *((nb_i, kb, m_i) if ws else (m_i, nb_i, kb)), o, i)
    for blk in (mm, *tails):
        sch.set_scope(blk, 0, SCOPE_ACC)
    x_s = sch.cache_read(mm, 0, SCOPE_INP)
    w_s = sch.cache_read(mm, 1, SCOPE_WGT)
    sch.compute_at(x_s, m_o)
    sch.compute_at(w_s, nb_o)
    for blk in (*tails, y):
        sch.reverse_compute_at(blk, inner)
    if _fixes(s):  # row corrections per row tile, column corrections per column tile
        r_s = sch.cache_read(corr, 1, SCOPE_ACC)
        sch.compute_at(r_s, m_o if s.corrected else nb_o)
    p_s = sch.cache_read(rq, 1, SCOPE_ACC)
    sch.compute_at(p_s, nb_o)
    sch.decompose_reduction(mm, nb_i if ws else m_i)
    sch.tensorize(o, gemm_intrin(cfg.block_in, cfg.block_out))
    if _fixes(s):
        sch.tensorize(sch.get_loops(corr)[-1], alu_intrin("add", s.block_out))
    elif s.planes:
        sch.tensorize(sch.get_loops(corr)[-1], join_rows_intrin(s.block_out, 1 << PLANE_SHIFT))
    sch.tensorize(sch.get_loops(rq)[-1],
                  requant_intrin(s.block_out, s.output_zp, s.clip[0], s.clip[1]))
    if k.double_buffer:
        for loop in (m_o, nb_o):
            sch.annotate(loop, ANN_DOUBLE_BUFFER, 1)
    return sch


# ----------------------------------------------------------------------------- layers
def matmul_recipe(layer: BatchMatmul, cfg: HardwareConfig, consts: bool) -> Recipe:
    """Both operands arrive host-packed (``host_pack``): ``a`` as rows plus correction
    rows, ``b`` as weight tiles plus the output-stage table (nothing is constant)."""
    a, b = tuple(layer.a.shape), tuple(layer.b.shape)
    if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[-1] != b[-2]:
        raise UnsupportedLayer(f"{layer.name}: batch matmul needs (B, M, K) x (B, K, N) "
                               f"operands (leading dimensions flattened), got {a} x {b}")
    planes = layer.planes
    if planes and (a[1] % 2 or not layer.on_device or layer.a.zero_point):
        raise UnsupportedLayer(f"{layer.name}: byte planes need an even number of rows made "
                               f"on the device with zero point 0, got {a} (zero point "
                               f"{layer.a.zero_point})")
    want = (a[0], a[1] // 2 if planes else a[1], b[-1])
    if tuple(layer.output.shape) != want:
        raise UnsupportedLayer(f"{layer.name}: output {layer.output.shape} is not {want}")
    bt, m, k = batch_dims(a)
    m = m // 2 if planes else m
    rq = layer.requant
    nb = ceil_div(b[-1], cfg.block_out)
    columns = layer.on_device and layer.a.zero_point != 0
    mult, shift = rq.per_channel(b[-1])
    uniform = layer.on_device and bool((mult == mult[0]).all() and (shift == shift[0]).all())
    shape = MatmulShape(bt, m, ceil_div(k, cfg.block_in), nb, cfg.block_in, cfg.block_out,
                        rq.zero_point, rq.clip, corrected=not layer.on_device, columns=columns,
                        planes=planes, uniform=uniform)
    if not layer.on_device:
        return Recipe(KIND, shape, {"x": layer.a},
                      host={"w": layer.b.name, "params": layer.b.name + PARAMS,
                            "r": layer.a.name + ROWSUM})
    if layer.b.zero_point:
        raise UnsupportedLayer(f"{layer.name}: an on-device second operand needs zero point "
                               f"0, got {layer.b.zero_point}")
    # b arrives as weight tiles made in the region (a weight_tiles Permute, which also
    # writes -zp_a * sum_k b when zp_a != 0); zp_b = 0 leaves no other data-dependent term:
    # the table is the requant with bias 0; per tensor, one block of it for every column
    # block (a padded column's sum is 0 whatever its multiplier: its output is the zero
    # point either way), read once a column tile instead of a block a column block
    if uniform:   # (a per-column requant whose columns agree is uniform too)
        bo = cfg.block_out
        params = pack_output_stage(np.zeros(bo, np.int64), np.full(bo, mult[0], np.int32),
                                   np.full(bo, shift[0], np.int32), bo)[None]
    else:
        params = np.broadcast_to(requant_table(layer, 0, b[-1], cfg.block_out),
                                 (bt, nb, 3, cfg.block_out))
    return Recipe(KIND, shape, {"x": layer.a, "w": layer.b},
                  consts={"params": np.ascontiguousarray(params)} if consts else {},
                  host={"c": layer.b.name + COLSUM} if columns else {})


def run_batch_matmul(ly: BatchMatmul, env: dict[str, np.ndarray]) -> np.ndarray:
    acc = np.matmul(centered(env[ly.a.name], ly.a), centered(env[ly.b.name], ly.b))
    return apply_requant(join_planes(acc) if ly.planes else acc, ly.requant, axis=-1)


def matmul_fill(cfg: HardwareConfig, s: MatmulShape, k: MatmulKnobs) -> list[float]:
    need = matmul_footprint(s, k)
    return [need["inp"] / cfg.inp_depth, need["wgt"] / cfg.wgt_depth,
            need["acc"] / cfg.acc_depth]


KIND = Kind(
    name="matmul", layers=(BatchMatmul,), recipe=matmul_recipe, reference=run_batch_matmul,
    bounds=lambda ly: (elements(ly.a.shape) + elements(ly.b.shape), elements(ly.output.shape)),
    ops=mac_ops,
    shape=MatmulShape, knobs=MatmulKnobs, build=batch_matmul, schedule=schedule_batch_matmul,
    fits=matmul_fits, candidates=candidate_matmul_knobs, default=default_matmul_knobs,
    estimate=estimate_matmul_cycles, instructions=matmul_instructions,
    # tile_m counts output rows: with planes the GEMM has two a row, the requantize one
    tiles=lambda s: {"tile_m": ("requant" if s.planes else "matmul", 1),
                     "tile_nb": ("matmul", 2)},
    extents=lambda s: {"tile_m": s.m, "tile_nb": s.nb}, fill=matmul_fill,
    perf_shape=lambda s: dataclasses.replace(s, output_zp=0, clip=(-128, 127)))
