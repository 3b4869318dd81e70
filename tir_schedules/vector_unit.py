"""What the vector-unit rooms (window, global pool, element-wise) share: the
accumulator fit and the cost model of a tile stream.

Every operand of those layers lives in the accumulator: int8 tiles arrive through
ACC8 loads (which run on the compute engine and hold it until they land, so fewer,
larger tiles pay the DRAM latency less often), the reduction or combination is one
ALU op per tile (tensorized at the lane loop; the loops around it become the ALU's
loop levels, reduction loops with destination stride 0; the walker runs the first
reduction step as a plain write, so the init costs no pass of its own), and the
fused REQUANT produces the int8 result that the store engine writes back. Double
buffering gives each tile buffer two slots so that the store of one tile overlaps
the next tile's work.
"""

from __future__ import annotations

import math

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.formats import DRAM_SIZE_BITS, EXTENT_BITS
from dsa_tvm.isa.sync import insert_dependencies
from dsa_tvm.sim.timing import schedule

from .tiling import lowest_estimate

#: the largest count a 16-bit DMA size or stride field holds
MAX_DMA = (1 << DRAM_SIZE_BITS) - 1
#: the most accumulator rows one tile of a staged room spans: one DMA transfer's size
#: field and one ALU loop's extent field
MAX_TILE_ROWS = min(MAX_DMA, (1 << EXTENT_BITS) - 1)


def acc_fits(cfg: HardwareConfig, need: int) -> str | None:
    """None if ``need`` accumulator rows fit the scratchpad, else why not."""
    if need > cfg.acc_depth:
        return f"ACC tiles need {need} rows, the scratchpad has {cfg.acc_depth}"
    return None


def check_fits(cfg: HardwareConfig, problem: str | None, k) -> None:
    """Raise when a schedule is asked for knobs ``k`` that do not fit (``problem``)."""
    if problem:
        raise ValueError(f"tiling {k} does not fit '{cfg.name}': {problem}")


def staged_rows_knobs(make, fits):
    """(candidates, default) of a DMA-only room whose one knob is its staged row count:
    as many accumulator rows as the part has and one DMA field counts. ``default`` raises
    ValueError with ``fits``'s reason when even that does not fit."""
    def candidates(cfg: HardwareConfig, s) -> list:
        k = make(min(cfg.acc_depth, MAX_DMA))
        return [k] if fits(cfg, s, k) is None else []

    def default(cfg: HardwareConfig, s):
        k = make(min(cfg.acc_depth, MAX_DMA))
        why = fits(cfg, s, k)
        if why is not None:
            raise ValueError(why)
        return k

    return candidates, default


def tiled_knobs(make, fits, estimate, most):
    """(candidates, default) of a room whose knobs are a tile size and double buffering:
    ``make(tile, double_buffer)``, tiles of :func:`tile_sizes` up to ``most(shape)``;
    ``default`` is the candidate of the lowest ``estimate`` and raises ValueError with
    ``fits``'s reason for a one-unit tile when none fits."""
    def candidates(cfg: HardwareConfig, s) -> list:
        return [k for db in (True, False) for t in tile_sizes(most(s))
                for k in [make(t, db)] if fits(cfg, s, k) is None]

    def default(cfg: HardwareConfig, s):
        cands = candidates(cfg, s)
        if not cands:
            raise ValueError(fits(cfg, s, make(1, False)) or "no tile fits")
        return lowest_estimate(cands, lambda k: estimate(cfg, s, k))

    return candidates, default


def staged_tile_problem(cfg: HardwareConfig, tile: int, rows: int, span: int, need: int,
                        what: str) -> str | None:
    """None if a tile of ``tile`` of ``rows`` rows, ``span`` accumulator rows each, fits a
    room that stages whole rows (one DMA and one ALU loop a tile, ``need`` accumulator
    rows in all, ``what`` they hold for the message); else why not."""
    if not 1 <= tile <= rows:
        return f"tile of {tile} rows for {rows} rows"
    if tile * span > MAX_TILE_ROWS:
        return f"a tile of {tile * span} accumulator rows exceeds the DMA fields"
    if need > cfg.acc_depth:
        return f"{need} accumulator rows ({what}) exceed the {cfg.acc_depth}-row accumulator"
    return None


def staged_tile_knobs(cfg: HardwareConfig, rows: int, fixed: int, staged: int, span: int,
                      make, fits) -> list:
    """A staged room's tile candidates: powers of two up to the largest tile of ``rows``
    that fits (``fixed`` accumulator rows besides ``staged`` tiles of ``span`` rows a row,
    twice when double-buffered), and that one, single and double buffered; ``make(tile,
    double_buffer)`` builds the knobs, ``fits`` filters them."""
    out = []
    for db in (True, False):
        most = min(rows, (cfg.acc_depth - fixed) // ((2 if db else 1) * staged * span),
                   MAX_TILE_ROWS // span)
        out += [k for t in tile_sizes(most) for k in [make(t, db)] if fits(cfg, k) is None]
    return out


def no_tiling(cfg: HardwareConfig, s, problem: str | None) -> ValueError:
    """The error of a vector layer that no tiling fits (``problem``: the smallest's)."""
    return ValueError(f"no tiling of this {type(s).__name__} fits the accumulator of "
                      f"'{cfg.name}': {problem}")


def stream_cycles(cfg: HardwareConfig, tiles: int, loads: list[tuple[int, int]], alu_rows: int,
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


def tile_sizes(most: int) -> list[int]:
    """A tile knob's sizes: the powers of two up to ``most``, and ``most`` itself."""
    return sorted({t for t in (1 << i for i in range(17)) if t <= most} | ({most} if most else set()))


def emitted_cycles(cfg: HardwareConfig, emit, shape, knobs,
                   regions: dict[str, tuple[str, tuple[int, ...], str]]) -> float:
    """The estimate of a room that emits its instructions itself: the timing model run on
    exactly what ``emit(builder, cfg, shape, knobs, regions)`` writes, tokens included.
    ``regions``: DRAM region name -> (kind, shape, dtype) for the builder."""
    b = ProgramBuilder(cfg, "estimate")
    emit(b, cfg, shape, knobs, {name: b.region(name, kind, dims, dtype)
                                for name, (kind, dims, dtype) in regions.items()})
    b.finish()
    return float(schedule(insert_dependencies(b.instructions, cfg), cfg).cycles)
