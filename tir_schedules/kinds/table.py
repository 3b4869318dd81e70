"""Room: the activation table layer (``Table``): y = table[x + 128] on the vector unit's
table unit (ALU LUT), one pixel in, one pixel out.

The 256 int8 codes arrive once per layer (an ACC8 load of ``256 / block_out`` rows into
the accumulator, widened to int32 lanes); then tiles of (pixels, channel blocks) stream
through: ACC8 load of the int8 input, one LUT pass in place of the int32 lanes, an ACC8
store. Sigmoid, SiLU, hardswish, GELU, ... are all this one layer with another table;
the front end (``relay_passes.kinds.table``) computes the table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache

import numpy as np
import tvm
from tvm import s_tir, tirx
from tvm.script import tirx as T

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.instructions import LUT_ENTRIES, AluOp, lut_rows
from dsa_tvm.layers.checks import inputs_read, with_weights
from dsa_tvm.layers.ir import QTensor, Table
from dsa_tvm.layers.layouts import image_dims, same_bytes

from ..intrinsics import _Script
from ..names import ANN_DOUBLE_BUFFER, CALL_ALU, SCOPE_ACC
from ..tiling import divisors, lowest_estimate
from ..vector_unit import acc_fits, check_fits, no_tiling, stream_cycles
from .base import Kind, Recipe, UnsupportedLayer

#: scalar body of the lookup stage (opaque: TIR never runs it; the walker emits ALU LUT)
SCALAR_LUT = "dsa.lut_scalar"


@dataclass(frozen=True)
class TableShape:
    """y = table[x + 128] over ``p`` pixels of ``cb`` channel blocks of ``block`` lanes."""

    p: int
    cb: int
    block: int


@dataclass(frozen=True)
class TableKnobs:
    tile_p: int          # pixels per tile (divides P)
    tile_cb: int         # channel blocks per tile (divides CB)
    double_buffer: bool


def table(s: TableShape) -> tirx.PrimFunc:
    """``lut`` looks every widened code up in the table (rows of ``block`` codes). Written
    in TVMScript so that the block says it reads the whole table (a data-dependent index
    has no bounded region TVM could infer)."""
    np_, cb_, bo = s.p, s.cb, s.block
    rows = lut_rows(bo)

    @_Script.prim_func(s_tir=True)
    def func(xh: T.handle, th: T.handle, yh: T.handle):
        x = T.match_buffer(xh, (np_, cb_, bo), "int8")
        table = T.match_buffer(th, (rows, bo), "int8")
        y = T.match_buffer(yh, (np_, cb_, bo), "int8")
        lut = T.sblock_alloc_buffer((np_, cb_, bo), "int32")
        for p, cb, c in T.grid(np_, cb_, bo):
            with T.sblock("lut"):
                vp, vcb, vc = T.axis.remap("SSS", [p, cb, c])
                T.reads(x[vp, vcb, vc], table[0:rows, 0:bo])
                T.writes(lut[vp, vcb, vc])
                lut[vp, vcb, vc] = _look(table, x[vp, vcb, vc], bo)
        for p, cb, c in T.grid(np_, cb_, bo):
            with T.sblock("y"):
                vp, vcb, vc = T.axis.remap("SSS", [p, cb, c])
                y[vp, vcb, vc] = T.Cast("int8", lut[vp, vcb, vc])

    return func.with_attr("global_symbol", "main")


@cache
def lut_intrin(block_out: int) -> str:
    """One accumulator row through the table: ``d[o] = table[a[o] + 128]`` (ALU LUT; the
    int8 codes were widened on load, so no clamp is needed in the description)."""
    bo = block_out
    rows = lut_rows(bo)
    name = f"dsa.lut_{bo}"

    @_Script.prim_func(s_tir=True)
    def desc(a: T.handle, t: T.handle, d: T.handle):
        A = T.match_buffer(a, (bo,), "int8", offset_factor=1, scope=SCOPE_ACC)
        Tb = T.match_buffer(t, (rows, bo), "int8", offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(A[0:bo], Tb[0:rows, 0:bo])
            T.writes(D[0:bo])
            for o in T.serial(bo):
                with T.sblock("lut"):
                    vo = T.axis.remap("S", [o])
                    T.reads(A[vo], Tb[0:rows, 0:bo])
                    T.writes(D[vo])
                    D[vo] = _look(Tb, A[vo], bo)

    @_Script.prim_func(s_tir=True)
    def impl(a: T.handle, t: T.handle, d: T.handle):
        A = T.match_buffer(a, (bo,), "int8", offset_factor=1, scope=SCOPE_ACC)
        Tb = T.match_buffer(t, (rows, bo), "int8", offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(A[0:bo], Tb[0:rows, 0:bo])
            T.writes(D[0:bo])
            T.evaluate(T.call_extern("int32", CALL_ALU, int(AluOp.LUT), D.data, D.elem_offset,
                                     A.data, A.elem_offset, Tb.data, Tb.elem_offset, 0, 0))

    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name


def _look(tb, code, bo: int):
    """The scalar body (the same expression in the compute and in the intrinsic)."""
    return T.call_pure_extern("int32", SCALAR_LUT, T.Cast("int32", code), tb[0, 0], bo)


# ----------------------------------------------------------------------------- knobs
def acc_rows(s: TableShape, k: TableKnobs) -> int:
    """Accumulator rows: the input and result tiles (twice when double-buffered), the table."""
    nbuf = 2 if k.double_buffer else 1
    return nbuf * 2 * k.tile_p * k.tile_cb + lut_rows(s.block)


def table_fits(cfg: HardwareConfig, s: TableShape, k: TableKnobs) -> str | None:
    if not cfg.table_present:
        return f"'{cfg.name}' has no activation table unit ([table] table_unit = 0)"
    return acc_fits(cfg, acc_rows(s, k))


def estimate_table_cycles(cfg: HardwareConfig, s: TableShape, k: TableKnobs) -> float:
    b = s.block
    rows = k.tile_p * k.tile_cb
    tiles = (s.p // k.tile_p) * (s.cb // k.tile_cb)
    once = LUT_ENTRIES / cfg.bandwidth_bytes_per_cycle + cfg.latency_cycles
    # stream_cycles prices ALU rows at alu_cycles_per_row; a LUT row takes lut_cycles_per_row
    alu_rows = rows * cfg.lut_cycles_per_row / cfg.alu_cycles_per_row
    return stream_cycles(cfg, tiles, [(rows * b, 1)], alu_rows, 1, rows * b,
                         k.double_buffer, once)


def candidate_table_knobs(cfg: HardwareConfig, s: TableShape) -> list[TableKnobs]:
    """Every knob setting that fits (tile sizes divide their loops)."""
    return [k for db in (True, False) for tc in divisors(s.cb)
            for k in [TableKnobs(t, tc, db) for t in divisors(s.p)]
            if table_fits(cfg, s, k) is None]


def default_table_knobs(cfg: HardwareConfig, s: TableShape) -> TableKnobs:
    """The candidate with the lowest estimate (larger tiles on ties: fewer instructions)."""
    cands = candidate_table_knobs(cfg, s)
    if not cands:
        raise no_tiling(cfg, s, table_fits(cfg, s, TableKnobs(1, 1, False)))
    return lowest_estimate(cands, lambda k: estimate_table_cycles(cfg, s, k))


def table_instructions(cfg: HardwareConfig, s: TableShape, k: TableKnobs) -> int:
    tiles = (s.p // k.tile_p) * (s.cb // k.tile_cb)
    return tiles * 3 + 2


# ----------------------------------------------------------------------------- schedule
def schedule_table(func: tirx.PrimFunc, cfg: HardwareConfig, s: TableShape,
                   k: TableKnobs) -> s_tir.Schedule:
    """The table loaded once at the top, tiles of (pixels, channel blocks) under it."""
    check_fits(cfg, table_fits(cfg, s, k), k)
    sch = s_tir.Schedule(func)
    lut = sch.get_sblock("lut")
    xin = sch.cache_read(lut, 0, SCOPE_ACC)
    sch.cache_read(lut, 1, SCOPE_ACC)  # stays at the root: one load for the whole layer
    p, cb, c = sch.get_loops(lut)
    p_o, p_i = sch.split(p, [None, k.tile_p])
    cb_o, cb_i = sch.split(cb, [None, k.tile_cb])
    sch.reorder(cb_o, p_o, p_i, cb_i, c)
    sch.compute_at(xin, p_o)
    sch.set_scope(lut, 0, SCOPE_ACC)
    sch.reverse_compute_at(sch.get_sblock("y"), p_o)
    sch.tensorize(c, lut_intrin(s.block))
    if k.double_buffer:
        sch.annotate(p_o, ANN_DOUBLE_BUFFER, 1)
    return sch


def table_tiles(s: TableShape) -> dict[str, tuple[str, int]]:
    return {"tile_p": ("lut", 0), "tile_cb": ("lut", 1)}


# ----------------------------------------------------------------------------- layers
def packed_table(layer: Table, block: int) -> np.ndarray:
    """The 256 codes as ``lut_rows(block)`` rows of ``block`` (entry i: row i // block)."""
    t = np.asarray(layer.table, dtype=np.int8).reshape(-1)
    if t.size != LUT_ENTRIES:
        raise UnsupportedLayer(f"{layer.name}: a table has {LUT_ENTRIES} entries, got {t.size}")
    rows = lut_rows(block)
    out = np.zeros(rows * block, dtype=np.int8)
    out[:LUT_ENTRIES] = t
    return out.reshape(rows, block)


def _pixels(t: QTensor) -> tuple[int, int]:
    n, c, h, w = image_dims(t.shape)
    return n * h * w, c


def table_recipe(layer: Table, cfg: HardwareConfig, consts: bool) -> Recipe:
    if not same_bytes(tuple(layer.input.shape), tuple(layer.output.shape)):
        raise UnsupportedLayer(f"{layer.name}: input {layer.input.shape} and output "
                               f"{layer.output.shape} differ")
    if not cfg.table_present:
        raise UnsupportedLayer(f"{layer.name}: '{cfg.name}' has no activation table unit "
                               f"([table] table_unit = 0)")
    p, c = _pixels(layer.input)
    block = cfg.block_out
    r = Recipe(KIND, TableShape(p, ceil_div(c, block), block), {"x": layer.input})
    if consts:
        r.consts["table"] = packed_table(layer, block)
    return r


def run_table(ly: Table, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer reference: each code looked up (the DSA's LUT semantics on int8 codes)."""
    x = np.asarray(env[ly.input.name]).astype(np.int64)
    return np.asarray(ly.table, dtype=np.int8).reshape(-1)[x + 128].reshape(ly.output.shape)


def table_bounds(ly: Table) -> tuple[int, int]:
    read, written = with_weights(ly, inputs_read(ly))
    return read + LUT_ENTRIES, written


def describe_table(ly: Table) -> str:
    what = f" {ly.what}" if ly.what else ""
    return f"Table {ly.name}: {tuple(ly.input.shape)}{what} -> {tuple(ly.output.shape)}"


KIND = Kind(
    name="table", layers=(Table,), recipe=table_recipe, reference=run_table,
    bounds=table_bounds, describe=describe_table,
    shape=TableShape, knobs=TableKnobs, build=table, schedule=schedule_table,
    fits=table_fits, candidates=candidate_table_knobs, default=default_table_knobs,
    estimate=estimate_table_cycles, instructions=table_instructions, tiles=table_tiles,
    extents=lambda s: {"tile_p": s.p, "tile_cb": s.cb},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    perf_shape=dataclasses.replace)
