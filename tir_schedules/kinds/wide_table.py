"""Room: an element-wise function of one int16 tensor (``WideTable``) on the vector unit.

The two tables (``base``, ``slope``: 256 int32 entries each) and the output stage's
parameters (bias 0, multiplier 1, shift ``frac``) load once; then per tile of accumulator
rows, on the compute engine's ALU (``dsa_tvm.layers.wide_table`` has the arithmetic):

1. ACC16 load of the int16 codes ``x``;
2. ``SHR`` 8 then ``MIN`` 127: ``hi``; ``MAC`` ``x += hi * -256``: ``lo``;
3. ``LUT`` ``t = base[hi]``, ``LUT`` ``hi = slope[hi]`` (in place);
4. ``MAC`` ``t += slope * lo``, ``REQUANT`` (wide) ``t``, ACC16 store.

Seven ALU passes a row where the int8 table takes one: a wide function costs seven times
the vector unit's time of an int8 one, on twice the bytes. Tiles alternate two halves of
the accumulator when double-buffered (the next tile's codes load during this one's ALU
work).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa import semantics as sem
from dsa_tvm.isa.instructions import LUT_ENTRIES, AluOp, Buffer, lut_rows
from dsa_tvm.layers import wide_table as wt
from dsa_tvm.layers.checks import inputs_read, with_weights
from dsa_tvm.layers.ir import WideTable
from dsa_tvm.layers.layouts import image_dims, pack_output_stage, same_bytes

from ..tiling import chunks
from ..vector_unit import MAX_TILE_ROWS, emitted_cycles, tiled_knobs
from .base import Kind, Recipe, UnsupportedLayer

#: tiles of one accumulator-row buffer each: the codes (then lo), hi (then the slope), t
_TILE_BUFFERS = 3


@dataclass(frozen=True)
class WideTableShape:
    rows: int            # accumulator rows of ``block`` int16 codes
    block: int


@dataclass(frozen=True)
class WideTableKnobs:
    tile_rows: int
    double_buffer: bool


def _fixed_rows(s: WideTableShape) -> int:
    """The output-stage parameters and the two tables."""
    return 3 + 2 * lut_rows(s.block)


def acc_rows(s: WideTableShape, k: WideTableKnobs) -> int:
    return _fixed_rows(s) + (2 if k.double_buffer else 1) * _TILE_BUFFERS * k.tile_rows


def wide_table_fits(cfg: HardwareConfig, s: WideTableShape, k: WideTableKnobs) -> str | None:
    if not cfg.table_present:
        return f"'{cfg.name}' has no activation table unit ([table] table_unit = 0)"
    if not 1 <= k.tile_rows <= min(s.rows, MAX_TILE_ROWS):
        return f"tile of {k.tile_rows} rows for {s.rows}"
    need = acc_rows(s, k)
    if need > cfg.acc_depth:
        return f"{need} accumulator rows exceed the {cfg.acc_depth}-row accumulator"
    return None


def wide_table_instructions(cfg: HardwareConfig, s: WideTableShape, k: WideTableKnobs) -> int:
    return 3 + 9 * len(chunks(s.rows, k.tile_rows))


def emit_wide_table(b, cfg: HardwareConfig, s: WideTableShape, k: WideTableKnobs,
                    regions: dict) -> None:
    """Parameters and tables first, then per tile the nine instructions of the module
    docstring."""
    lr = lut_rows(s.block)
    par, base, slope = 0, 3, 3 + lr
    b.load(Buffer.ACC, par, b.addr(regions["params"], Buffer.ACC), 1, 3)
    b.load(Buffer.ACC, base, b.addr(regions["base"], Buffer.ACC), 1, lr)
    b.load(Buffer.ACC, slope, b.addr(regions["slope"], Buffer.ACC), 1, lr)
    x, y = b.addr(regions["x"], Buffer.ACC16), b.addr(regions["y"], Buffer.ACC16)
    imm = sem.pack_requant_imm(0, wide=True)
    for i, (r0, rows) in enumerate(chunks(s.rows, k.tile_rows)):
        xs = _fixed_rows(s) + (i % 2 if k.double_buffer else 0) * _TILE_BUFFERS * k.tile_rows
        hs, ts = xs + k.tile_rows, xs + 2 * k.tile_rows
        run = [(rows, 1, 1, 0)]
        b.load(Buffer.ACC16, xs, x + r0, 1, rows, prefetch=k.double_buffer)
        b.alu(AluOp.SHR, hs, xs, 0, run, imm=8, use_imm=True)
        b.alu(AluOp.MIN, hs, hs, 0, run, imm=wt.TOP, use_imm=True)
        b.alu(AluOp.MAC, xs, hs, 0, run, imm=-256, use_imm=True)
        b.alu(AluOp.LUT, ts, hs, base, run)
        b.alu(AluOp.LUT, hs, hs, slope, run)
        b.alu(AluOp.MAC, ts, hs, xs, [(rows, 1, 1, 1)])
        b.alu(AluOp.REQUANT, ts, ts, par, run, imm=imm)
        b.store(Buffer.ACC16, ts, y + r0, 1, rows)


@lru_cache(maxsize=256)
def estimate_wide_table_cycles(cfg: HardwareConfig, s: WideTableShape,
                               k: WideTableKnobs) -> float:
    """The timing model on the instructions :func:`emit_wide_table` emits."""
    table = (lut_rows(s.block), s.block)
    return emitted_cycles(cfg, emit_wide_table, s, k, {
        "params": ("const", (3, s.block), "int32"),
        "base": ("const", table, "int32"), "slope": ("const", table, "int32"),
        "x": ("input", (s.rows, s.block), "int16"),
        "y": ("output", (s.rows, s.block), "int16")})


candidate_wide_table_knobs, default_wide_table_knobs = tiled_knobs(
    WideTableKnobs, wide_table_fits, estimate_wide_table_cycles,
    lambda s: min(s.rows, MAX_TILE_ROWS))


# ----------------------------------------------------------------------------- layers
def _packed(entries: np.ndarray, block: int) -> np.ndarray:
    """256 int32 entries as ``lut_rows(block)`` rows of ``block`` (entry i: row i // block)."""
    rows = lut_rows(block)
    out = np.zeros(rows * block, np.int32)
    out[:LUT_ENTRIES] = np.asarray(entries, np.int32).reshape(-1)
    return out.reshape(rows, block)


def wide_table_recipe(layer: WideTable, cfg: HardwareConfig, consts: bool) -> Recipe:
    if not same_bytes(tuple(layer.input.shape), tuple(layer.output.shape)):
        raise UnsupportedLayer(f"{layer.name}: input {layer.input.shape} and output "
                               f"{layer.output.shape} differ")
    if (layer.input.dtype, layer.output.dtype) != ("int16", "int16"):
        raise UnsupportedLayer(f"{layer.name}: a wide table maps int16 codes to int16 codes, "
                               f"got {layer.input.dtype} -> {layer.output.dtype}")
    if not cfg.table_present:
        raise UnsupportedLayer(f"{layer.name}: '{cfg.name}' has no activation table unit "
                               f"([table] table_unit = 0)")
    n, c, h, w = image_dims(tuple(layer.input.shape))
    block = cfg.block_out
    r = Recipe(KIND, WideTableShape(n * h * w * ceil_div(c, block), block), {"x": layer.input})
    if consts:
        params = pack_output_stage(np.zeros(block, np.int64), np.ones(block, np.int64),
                                   np.full(block, layer.frac, np.int64), block)
        r.consts["params"] = params.reshape(-1, block)
        r.consts["base"] = _packed(layer.base, block)
        r.consts["slope"] = _packed(layer.slope, block)
    return r


def run_wide_table(ly: WideTable, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer reference (``layers.wide_table.interpolate``)."""
    x = np.asarray(env[ly.input.name])
    return wt.interpolate(x, ly.base, ly.slope, ly.frac).reshape(ly.output.shape)


def wide_table_bounds(ly: WideTable) -> tuple[int, int]:
    read, written = with_weights(ly, inputs_read(ly))
    return read + 2 * LUT_ENTRIES * 4, written


def describe_wide_table(ly: WideTable) -> str:
    what = f" {ly.what}" if ly.what else ""
    return (f"WideTable {ly.name}: {tuple(ly.input.shape)}{what} int16 (within "
            f"{ly.error} codes of the exact function) -> {tuple(ly.output.shape)}")


KIND = Kind(
    name="wide_table", layers=(WideTable,), recipe=wide_table_recipe,
    reference=run_wide_table, bounds=wide_table_bounds, describe=describe_wide_table,
    shape=WideTableShape, knobs=WideTableKnobs,
    fits=wide_table_fits, candidates=candidate_wide_table_knobs,
    default=default_wide_table_knobs, estimate=estimate_wide_table_cycles,
    instructions=wide_table_instructions, tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    emit=emit_wide_table)
