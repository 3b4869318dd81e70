"""Room: rotary position embedding (``Rope`` layers) on the vector unit.

A row of ``d`` codes spans ``DB = d / block`` accumulator rows; its position ``p`` (the
row's index mod ``P``) picks a row of each table. Per tile of whole position groups
(batch x head), on the compute engine's ALU:

1. ``ADD`` the negated zero point: ``xc``;
2. ``MUL`` ``y = xc * cos[p]``, the table's rows strided with the position (stride 0 over
   the groups);
3. two ``MAC`` s, ``y[first half] += xc[second half] * sin[p][first half]`` and the other
   way round: the half swap is an operand offset of ``DB / 2`` rows, so ``d / 2`` must be
   a whole number of blocks;
4. ``REQUANT`` with per-lane parameters, then an ACC8 store.

int16 codes (an LLM's Q or K on an int16 grid) load with ACC16 and an int16 result is
REQUANT's wide mode and an ACC16 store. An int16 input needs zero point 0: then each
product stays within 2^29 (|x| <= 2^15, |table| < 2^14) and their sum within int32.

The tables and parameters load once; tiles alternate two halves of the accumulator when
double-buffered (the next tile's codes load during this one's ALU work). The integer
semantics are :class:`dsa_tvm.layers.ir.Rope`'s; :func:`run_rope` is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa import semantics as sem
from dsa_tvm.isa.instructions import AluOp, Buffer
from dsa_tvm.layers.checks import elements, with_weights
from dsa_tvm.layers.ir import Rope
from dsa_tvm.layers.layouts import pack_output_stage
from dsa_tvm.layers.reference import apply_requant, centered
from dsa_tvm.layers.rope_tables import layer_tables

from ..tiling import chunks
from ..vector_unit import MAX_TILE_ROWS, emitted_cycles, tiled_knobs
from .base import Kind, Recipe, UnsupportedLayer


@dataclass(frozen=True)
class RopeShape:
    groups: int          # batch x heads: rows / positions
    positions: int       # P
    blocks: int          # DB: accumulator rows per code row
    block: int
    zero_point: int      # the input's
    out_zp: int
    clip: tuple[int, int]
    in_wide: bool = False      # int16 codes in (ACC16 loads)
    out_wide: bool = False     # int16 codes out (REQUANT wide, ACC16 stores)


@dataclass(frozen=True)
class RopeKnobs:
    tile_groups: int     # position groups per tile
    double_buffer: bool


def _table_rows(s: RopeShape) -> int:
    return s.positions * s.blocks


def acc_rows(s: RopeShape, k: RopeKnobs) -> int:
    """Parameters, the two tables, and one or two (codes, result) tile pairs."""
    tile = k.tile_groups * _table_rows(s)
    return 3 * s.blocks + 2 * _table_rows(s) + (2 if k.double_buffer else 1) * 2 * tile


def rope_fits(cfg: HardwareConfig, s: RopeShape, k: RopeKnobs) -> str | None:
    if not 1 <= k.tile_groups <= s.groups:
        return f"tile of {k.tile_groups} groups for {s.groups}"
    if k.tile_groups * _table_rows(s) > MAX_TILE_ROWS:
        return "a tile exceeds the DMA and loop fields"
    need = acc_rows(s, k)
    if need > cfg.acc_depth:
        return (f"{need} accumulator rows (tables of {s.positions} positions and "
                f"{k.tile_groups}-group tiles) exceed the {cfg.acc_depth}-row accumulator")
    return None


def _tiles(s: RopeShape, k: RopeKnobs) -> list[tuple[int, int]]:
    return chunks(s.groups, k.tile_groups)


def rope_instructions(cfg: HardwareConfig, s: RopeShape, k: RopeKnobs) -> int:
    return 3 + 7 * len(_tiles(s, k))


def emit_rope(b, cfg: HardwareConfig, s: RopeShape, k: RopeKnobs, regions: dict) -> None:
    """Parameters, cos and sin rows first, then per tile: load, ADD, MUL, two MACs,
    REQUANT, store (see the module docstring)."""
    db, tr = s.blocks, _table_rows(s)
    half = db // 2
    par, cos, sin = 0, 3 * db, 3 * db + tr
    b.load(Buffer.ACC, par, b.addr(regions["params"], Buffer.ACC), 1, 3 * db)
    b.load(Buffer.ACC, cos, b.addr(regions["cos"], Buffer.ACC), 1, tr)
    b.load(Buffer.ACC, sin, b.addr(regions["sin"], Buffer.ACC), 1, tr)
    tile = k.tile_groups * tr
    xbuf = Buffer.ACC16 if s.in_wide else Buffer.ACC8
    ybuf = Buffer.ACC16 if s.out_wide else Buffer.ACC8
    x, y = b.addr(regions["x"], xbuf), b.addr(regions["y"], ybuf)
    imm = (sem.pack_requant_imm(s.out_zp, wide=True) if s.out_wide
           else sem.pack_requant_imm(s.out_zp, *s.clip))
    for t, (g0, g) in enumerate(_tiles(s, k)):
        xs = 3 * db + 2 * tr + (t % 2 if k.double_buffer else 0) * 2 * tile
        ys = xs + tile
        rows = g * tr
        b.load(xbuf, xs, x + g0 * tr, 1, rows, prefetch=k.double_buffer)
        b.alu(AluOp.ADD, xs, xs, 0, [(rows, 1, 1, 0)], imm=-s.zero_point, use_imm=True)
        groups = (g, tr, tr, 0)
        b.alu(AluOp.MUL, ys, xs, cos, [groups, (tr, 1, 1, 1)])
        per_half = [groups, (s.positions, db, db, db), (half, 1, 1, 1)]
        b.alu(AluOp.MAC, ys, xs + half, sin, per_half)
        b.alu(AluOp.MAC, ys + half, xs, sin + half, per_half)
        b.alu(AluOp.REQUANT, ys, ys, par, [(g * s.positions, db, db, 0), (db, 1, 1, 3)],
              imm=imm)
        b.store(ybuf, ys, y + g0 * tr, 1, rows)


@lru_cache(maxsize=256)
def estimate_rope_cycles(cfg: HardwareConfig, s: RopeShape, k: RopeKnobs) -> float:
    """The timing model on the instructions :func:`emit_rope` emits (and their tokens)."""
    table, rows = (_table_rows(s), s.block), (s.groups * _table_rows(s), s.block)
    return emitted_cycles(cfg, emit_rope, s, k, {
        "params": ("const", (3 * s.blocks, s.block), "int32"),
        "cos": ("const", table, "int32"), "sin": ("const", table, "int32"),
        "x": ("input", rows, "int16" if s.in_wide else "int8"),
        "y": ("output", rows, "int16" if s.out_wide else "int8")})


candidate_rope_knobs, default_rope_knobs = tiled_knobs(
    RopeKnobs, rope_fits, estimate_rope_cycles, lambda s: s.groups)


# ----------------------------------------------------------------------------- layers
def _blocked_table(t: np.ndarray, block: int) -> np.ndarray:
    """[P, d] int32 -> [P * DB, block] rows (d a whole number of blocks)."""
    p, d = t.shape
    return np.ascontiguousarray(np.asarray(t, np.int32).reshape(p * (d // block), block))


def rope_recipe(layer: Rope, cfg: HardwareConfig, consts: bool) -> Recipe:
    shape = tuple(layer.input.shape)
    p, d = layer.table_shape
    block = cfg.block_out
    shapes = [tuple(t.shape) for t in (layer.cos, layer.sin) if t is not None]
    if any(s != (p, d) for s in shapes) or len(shape) < 2 or shape[-2:] != (p, d):
        raise UnsupportedLayer(f"{layer.name}: tables {shapes} do not match the rows "
                               f"{shape} (positions x row length)")
    if layer.tables and any(int(np.prod(t.shape)) != p * d for t in layer.tables):
        raise UnsupportedLayer(f"{layer.name}: runtime tables {[t.shape for t in layer.tables]}"
                               f" are not {p} positions x {d} codes")
    if tuple(layer.output.shape) != shape:
        raise UnsupportedLayer(f"{layer.name}: output {layer.output.shape} is not {shape}")
    if len(shape) == 4:
        raise UnsupportedLayer(f"{layer.name}: a 4-D tensor {shape} is an NCHW image on the "
                               f"DSA; rotary embedding runs on rows (give it a (B*H, P, d) "
                               f"view)")
    if d % (2 * block):
        raise UnsupportedLayer(f"{layer.name}: half a row ({d // 2} codes) is not a whole "
                               f"number of {block}-lane blocks (the half swap moves blocks)")
    in_wide, out_wide = layer.input.dtype == "int16", layer.output.dtype == "int16"
    if not -128 <= layer.input.zero_point <= 127 or (in_wide and layer.input.zero_point):
        raise UnsupportedLayer(f"{layer.name}: input zero point {layer.input.zero_point} "
                               f"({layer.input.dtype}; int16 codes need 0: their products "
                               f"with the tables must stay within int32)")
    if out_wide != layer.requant.wide:
        raise UnsupportedLayer(f"{layer.name}: an {layer.output.dtype} output needs "
                               f"{'the wide' if out_wide else 'an int8'} requantize clamp")
    s = RopeShape(elements(shape[:-2]), p, d // block, block, int(layer.input.zero_point),
                  int(layer.requant.zero_point), tuple(layer.requant.clip), in_wide, out_wide)
    # runtime tables are region inputs the host packs as these same rows (rope_tables)
    ins = {"x": layer.input} | (dict(zip(("cos", "sin"), layer.tables)) if layer.tables else {})
    r = Recipe(KIND, s, ins)
    if consts:
        mult, shift = layer.requant.per_channel(d)
        r.consts["params"] = pack_output_stage(np.zeros(d, np.int64), mult, shift,
                                               block).reshape(-1, block)
        if not layer.tables:
            r.consts["cos"] = _blocked_table(layer.cos, block)
            r.consts["sin"] = _blocked_table(layer.sin, block)
    return r


def run_rope(layer: Rope, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer reference of :class:`~dsa_tvm.layers.ir.Rope` (int32 wrap per ALU op)."""
    xc = centered(np.asarray(env[layer.input.name]).reshape(layer.input.shape), layer.input)
    cos, sin = layer_tables(layer, env)
    p, d = cos.shape
    xc = xc.reshape(-1, p, d)
    half = d // 2
    swapped = np.concatenate([xc[..., half:], xc[..., :half]], axis=-1)
    acc = sem.wrap_int32(xc * cos.astype(np.int64)[None])
    acc = sem.wrap_int32(acc + sem.wrap_int32(swapped * sin.astype(np.int64)[None]))
    return apply_requant(acc, layer.requant, axis=-1).reshape(layer.output.shape)


def rope_bounds(ly: Rope) -> tuple[int, int]:
    """Every code read and written once (the tables are not counted, constant or not)."""
    return with_weights(ly, elements(ly.input.shape))


def describe_rope(ly: Rope) -> str:
    tables = " (runtime tables)" if ly.tables else ""
    return (f"Rope {ly.name}: {tuple(ly.input.shape)} over {ly.table_shape[0]} positions"
            f"{tables} -> {tuple(ly.output.shape)}")


KIND = Kind(
    name="rope", layers=(Rope,), recipe=rope_recipe, reference=run_rope,
    bounds=rope_bounds, describe=describe_rope,
    shape=RopeShape, knobs=RopeKnobs,
    fits=rope_fits, candidates=candidate_rope_knobs, default=default_rope_knobs,
    estimate=estimate_rope_cycles, instructions=rope_instructions,
    tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    emit=emit_rope)
