"""How many instructions a knob setting's program has, without lowering it: the
generic nest counters each room's ``instructions`` applies to its stages.

The search uses this to skip settings whose programs are much larger than
another setting's for no estimated gain (``dsa_tvm.tuning.search``): lowering
and simulating a candidate costs time in proportion to its instructions, and a
tall, thin tile can take eight times the instructions of its wide, short twin
for the same cycles.

Each stage of a tile is counted with the walker's own nest geometry
(``tir_schedules.nests``: level merging, peeling into instructions, 2-D DMA
shapes, the first-step split of reductions) applied to the stage's loop
levels as the schedule lays them out; tiles are counted as interior ones
(border tiles differ by a few padded rows).
"""

from __future__ import annotations

import math

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa.instructions import ALU_LEVELS

from .nests import dma_shapes, first_step_split, merge_levels


def nest_count(levels: list[tuple], max_levels: int) -> int:
    """Instructions one stage becomes: its merged levels beyond ``max_levels`` are peeled."""
    merged = merge_levels(levels)
    return math.prod(lv[0] for lv in merged[:max(0, len(merged) - max_levels)])


def reduction_count(levels: list[tuple]) -> int:
    """Instructions of an ALU reduction whose first step writes the initial value."""
    return sum(nest_count(box, ALU_LEVELS) for _, box, _ in first_step_split(levels, (0, 0, 0)))


def reduction_steps(cfg: HardwareConfig, levels: list[tuple], mac8: bool) -> int:
    """ALU steps of that reduction: every point a step, except that a MAC8 (``mac8``) on
    dot-product lanes takes the reduction levels inside each instruction
    ``HardwareConfig.dot_ways`` points a step (``HardwareConfig.mac8_steps``)."""
    total = 0
    for _, box, _ in first_step_split(levels, (0, 0, 0)):
        pairs = [(lv[0], lv[1]) for lv in merge_levels(box)[-ALU_LEVELS:]]
        steps = cfg.mac8_steps(pairs) if mac8 else math.prod(e for e, _ in pairs)
        total += nest_count(box, ALU_LEVELS) * steps
    return total


def copy_count(levels: list[tuple[int, int, int]]) -> int:
    """2-D transfers of a copy without padding: ``(extent, sram stride, dram stride)`` in
    rows, outermost first."""
    return sum(1 for _ in dma_shapes([(e, s, d, 0, 0) for e, s, d in levels], 0, 0, "count"))


def tile_copy(rows: int, cols: int, blocks: int, row_len: int, all_blocks: int) -> int:
    """Transfers of a (rows, cols, blocks) tile of an image ``row_len`` pixels wide with
    ``all_blocks`` channel blocks per pixel."""
    return copy_count([(rows, cols * blocks, row_len * all_blocks),
                       (cols, blocks, all_blocks), (blocks, 1, 1)])
