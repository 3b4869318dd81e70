"""Which parts of a program run on the crossbars, how many crossbars they take, what
each costs in time and energy.

A program compiled for the digital array runs unchanged on a CIM part: the program's
constant weights are programmed into crossbars once, before the first run. One walk over
the instructions in program order follows every weight-scratchpad tile to where it was
loaded from: a GEMM whose tiles all came from constant DRAM (or padding) is an analog
read of the crossbars holding those weights; its weight loads move nothing at run time
(the weights are already in the arrays) unless a digital GEMM reads the same tiles.
GEMMs of two activations (attention over a KV cache) stay on the digital array.

Capacity is real: a program whose weight blocks need more crossbars than the part has is
time-shared: its weight loads stream the weights in from DRAM and reprogram the
crossbars (``program_row_ns`` per row), and the report says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..cim.crossbar import Geometry
from ..isa.instructions import Buffer, Gemm, Load
from .plans import gemm_plan

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

#: weight-scratchpad tile whose origin is not constant DRAM (or never loaded)
_VARIABLE = -2
#: a padding tile (zeros generated on chip): an unprogrammed, empty crossbar row
PAD = -1
#: program meta key: the compiler left this program's weights time-shared (the model's
#: programs together need more crossbars than the part has)
TIME_SHARED = "cim_time_shared"


@dataclass
class CimMap:
    """The crossbar side of one program on one CIM part."""

    analog: dict[int, np.ndarray]       # GEMM index -> (nb, nn, nk) origin tiles (PAD: zeros)
    const_loads: frozenset[int]         # WGT loads from constant DRAM read only by analog GEMMs
    crossbars_needed: int
    crossbars: int
    resident_bytes: int                 # distinct weight bytes programmed into crossbars
    reads: dict[int, int] = field(default_factory=dict)       # GEMM -> reads of each crossbar
    blocks: dict[int, int] = field(default_factory=dict)      # GEMM -> crossbars it reads
    conversions: dict[int, int] = field(default_factory=dict)  # GEMM -> ADC conversions
    cells: dict[int, int] = field(default_factory=dict)       # GEMM -> cells a read drives
    block_of: dict[int, int] = field(default_factory=dict)    # GEMM -> its weight block (the
    #                    crossbars it reads: GEMMs of one layer's pixel tiles share them)
    #: the compiler found the whole model's weights beyond the part's crossbars and left this
    #: program's time-shared (program meta ``cim_time_shared``)
    shared: bool = False
    #: GEMM -> the zero point its DACs subtract (its layer's input zero point, under
    #: input_encoding "zero_point"; 0: raw codes)
    input_zp: dict[int, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return not self.shared and self.crossbars_needed <= self.crossbars

    @property
    def resident_loads(self) -> frozenset[int]:
        """Weight loads that move nothing at run time (the weights stay programmed)."""
        return self.const_loads if self.fits else frozenset()

    def summary(self) -> str:
        state = ("fits" if self.fits else
                 "does NOT fit" + (" beside the model's other programs" if self.shared else "")
                 + ": time-shared, its weights are reprogrammed as they stream in")
        return (f"{len(self.analog)} GEMMs on crossbars, {self.resident_bytes:,} weight bytes "
                f"in {self.crossbars_needed} of {self.crossbars} crossbars ({state})")


def _origins(ins: Load, cfg: "HardwareConfig", const: list[tuple[int, int]]) -> np.ndarray:
    """Origin tile index of every scratchpad tile a WGT load writes (PAD for padding,
    _VARIABLE when the source is not one constant region)."""
    unit = cfg.wgt_tile_bytes
    lo = ins.dram_base * unit
    hi = lo + ((ins.y_size - 1) * ins.x_stride + ins.x_size) * unit
    is_const = any(a <= lo and hi <= b for a, b in const)
    h = ins.pad_top + ins.y_size + ins.pad_bottom
    w = ins.pad_left + ins.x_size + ins.pad_right
    out = np.full((h, w), PAD, dtype=np.int64)
    src = (ins.dram_base + np.arange(ins.y_size)[:, None] * ins.x_stride
           + np.arange(ins.x_size)[None, :])
    out[ins.pad_top:ins.pad_top + ins.y_size, ins.pad_left:ins.pad_left + ins.x_size] = (
        src if is_const else _VARIABLE)
    return out.reshape(-1)


def _digital_ranges(program: "Program", names: str) -> list[tuple[int, int]]:
    """Instruction ranges of the program's layers named in ``names`` (cim.digital_layers)."""
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    return [(ly["first"], ly["last"]) for ly in program.meta.get("layers", [])
            if ly["name"] in wanted]


def map_program(program: "Program", cfg: "HardwareConfig") -> CimMap:
    """Follow every weight tile from its load to the GEMMs that read it (program order:
    the tokens keep a tile from being overwritten while a GEMM that reads it waits)."""
    geom = Geometry.from_config(cfg)
    const = [(r.offset, r.offset + r.nbytes) for r in program.regions if r.data is not None]
    digital = _digital_ranges(program, cfg.digital_layers)
    layers = program.meta.get("layers", [])
    origin = np.full(cfg.wgt_depth, _VARIABLE, dtype=np.int64)
    loader = np.full(cfg.wgt_depth, -1, dtype=np.int64)
    const_loads: set[int] = set()
    needed: set[int] = set()      # constant loads a digital GEMM reads: they must move
    analog: dict[int, np.ndarray] = {}
    block_ids: dict[bytes, int] = {}      # distinct weight blocks, numbered
    shapes: list[tuple[int, int]] = []    # (k, n) of each, packed into crossbars at the end
    out = CimMap(analog, frozenset(), 0, cfg.crossbars, 0)
    tiles_seen: set[int] = set()
    for i, ins in enumerate(program.instructions):
        if isinstance(ins, Load) and ins.buffer == Buffer.WGT:
            o = _origins(ins, cfg, const)
            origin[ins.sram_base:ins.sram_base + len(o)] = o
            loader[ins.sram_base:ins.sram_base + len(o)] = i
            if (o != _VARIABLE).all():
                const_loads.add(i)
        elif isinstance(ins, Gemm):
            plan = gemm_plan(ins.loops, cfg.block_in)
            tiles = ins.wgt_base + plan.wgt
            src = origin[tiles]
            if (src == _VARIABLE).any() or (src == PAD).all() or any(
                    lo <= i <= hi for lo, hi in digital):
                needed.update(int(j) for j in np.unique(loader[tiles]) if j >= 0)
                continue
            analog[i] = src
            if cfg.input_encoding == "zero_point":
                out.input_zp[i] = next((int(ly.get("input_zp", 0)) for ly in layers
                                        if ly["first"] <= i <= ly["last"]), 0)
            k, n = plan.nk * cfg.block_in, plan.nn * cfg.block_out
            per_b = geom.crossbars_for(k, n)
            key = src.tobytes() + bytes(str(src.shape), "ascii")
            if key not in block_ids:
                block_ids[key] = len(block_ids)
                shapes += [(k, n)] * plan.nb
                tiles_seen.update(int(t) for t in np.unique(src) if t >= 0)
            out.block_of[i] = block_ids[key]
            out.blocks[i] = plan.nb * per_b
            out.reads[i] = plan.nb * plan.nm * geom.passes * geom.repeats
            out.cells[i] = k * n * geom.cells       # of one block (nb blocks, nb reads)
            # every column in use of every crossbar of the reduction converts once a read
            out.conversions[i] = out.reads[i] * math.ceil(k / geom.rows) * n * geom.cells
    out.crossbars_needed = geom.pack(shapes)
    out.const_loads = frozenset(const_loads - needed)
    out.shared = bool(program.meta.get(TIME_SHARED))
    out.resident_bytes = len(tiles_seen) * cfg.wgt_tile_bytes
    return out


def read_cycles(cfg: "HardwareConfig", n_cols: int) -> int:
    """Cycles of one read of one crossbar with ``n_cols`` columns in use: the analog
    settling, then every ADC converting its share of the columns in turn (crossbars
    of one GEMM read in parallel)."""
    adcs = max(1, cfg.crossbar_cols // cfg.cols_per_adc)
    ns = cfg.mvm_ns + math.ceil(min(n_cols, cfg.crossbar_cols) / adcs) * cfg.adc_ns
    return max(1, math.ceil(ns * cfg.mhz / 1e3))


def analog_peak_macs_per_cycle(cfg: "HardwareConfig") -> int:
    """MACs per cycle of every crossbar read at once, full and in one DAC pass: the
    compute bound of a layer on the crossbars."""
    geom = Geometry.from_config(cfg)
    weights = cfg.crossbars * geom.rows * (geom.cols // geom.cells)
    return max(1, weights // read_cycles(cfg, geom.cols))


def cost_overrides(cmap: CimMap, program: "Program", cfg: "HardwareConfig") -> dict[int, int]:
    """Timing costs that replace the digital ones (the schedule's convention: a DMA's bus
    cycles >= 0, any other instruction's duration negated)."""
    geom = Geometry.from_config(cfg)
    costs: dict[int, int] = {}
    instrs = program.instructions
    for i in cmap.analog:
        plan = gemm_plan(instrs[i].loops, cfg.block_in)
        n_cols = plan.nn * cfg.block_out * geom.cells
        costs[i] = -(plan.nb * plan.nm * geom.passes * geom.repeats * read_cycles(cfg, n_cols))
    if cmap.fits:
        for i in cmap.const_loads:
            costs[i] = -1     # selects the programmed crossbars: nothing moves
    else:
        bw = cfg.bandwidth_bytes_per_cycle
        for i in cmap.const_loads:
            ins = instrs[i]
            nbytes = ins.y_size * ins.x_size * cfg.wgt_tile_bytes
            rows = math.ceil(nbytes * geom.cells / geom.cols)
            program_cycles = math.ceil(rows * cfg.program_row_ns * cfg.mhz / 1e3)
            costs[i] = max(math.ceil(nbytes / bw), program_cycles)
    return costs


def cim_counters(cmap: CimMap, cfg: "HardwareConfig") -> dict[str, float]:
    """The crossbar counters of a run (energy in pJ under ``cim.energy_pj``). A read's
    array energy (``mvm_pj`` for a whole crossbar) scales with the cells it drives."""
    reads = sum(cmap.reads[i] * cmap.blocks[i] for i in cmap.analog)
    conversions = sum(cmap.conversions.values())
    geom = Geometry.from_config(cfg)
    full_reads = sum(cmap.reads[i] * cmap.cells[i] for i in cmap.analog) / (geom.rows
                                                                            * geom.cols)
    c: dict[str, float] = {
        "cim.gemms": len(cmap.analog),
        "cim.crossbars_needed": cmap.crossbars_needed,
        "cim.crossbars": cmap.crossbars,
        "cim.fits": int(cmap.fits),
        "cim.resident_weight_bytes": cmap.resident_bytes,
        "cim.crossbar_reads": reads,
        "cim.adc_conversions": conversions,
    }
    c["cim.full_crossbar_reads"] = full_reads
    c["cim.energy_pj"] = full_reads * cfg.mvm_pj + conversions * cfg.adc_pj
    return c
