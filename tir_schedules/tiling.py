"""Tile arithmetic every room shares: the output of a sliding window, the input a tile
of it reads, the tile sizes that split a loop, and the pick among fitting tilings."""

from __future__ import annotations

import math

from dsa_tvm import intmath
from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.hw.dataflow import gemm_cycles
from dsa_tvm.isa.instructions import GEMM_LEVELS

from .nests import merge_levels


def window_out_hw(s) -> tuple[int, int]:
    """Output height and width of a sliding window (conv or pool) over ``s.h x s.w``
    with ``s.kh x s.kw``, ``s.strides``, ``s.padding`` (t, l, b, r) and ``s.dilation``."""
    return intmath.window_out_hw(s.h, s.w, (s.kh, s.kw), s.strides, s.padding, s.dilation)


def input_tile(s, k) -> tuple[int, int]:
    """(rows, columns) of the input an output tile of ``k.tile_oh`` x ``k.tile_ow`` reads
    through a ``s.kh`` x ``s.kw`` window (strides and dilation of ``s``): a conv's or a
    window layer's."""
    (sh, sw), (dh, dw) = s.strides, s.dilation
    return (k.tile_oh - 1) * sh + (s.kh - 1) * dh + 1, (k.tile_ow - 1) * sw + (s.kw - 1) * dw + 1


def divisors(n: int) -> list[int]:
    """Every tile size that splits a loop of ``n`` evenly (the schedules' tile candidates)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """``range(n)`` in pieces of ``size`` (the last may be shorter): (start, length) each."""
    return [(i, min(size, n - i)) for i in range(0, n, size)]


def tile_volume(k) -> int:
    """The product of a knob setting's tile sizes (its boolean knobs left out)."""
    return math.prod(v for v in k.__dict__.values() if not isinstance(v, bool))


def lowest_estimate(cands: list, estimate):
    """The candidate with the lowest ``estimate(knobs)``; larger tiles on ties (fewer
    instructions), the first one listed after that."""
    return min(cands, key=lambda k: (estimate(k), -tile_volume(k)))


def scratchpads_fit(cfg, need: dict[str, int]) -> str | None:
    """None if ``need`` (rows or tiles per scratchpad) fits the three scratchpads, else why not."""
    for sram, depth in (("inp", cfg.inp_depth), ("wgt", cfg.wgt_depth), ("acc", cfg.acc_depth)):
        if need[sram] > depth:
            return f"{sram.upper()} tile needs {need[sram]} rows, the scratchpad has {depth}"
    return None


def pixels_inner(cfg: HardwareConfig) -> bool:
    """Loop order the array's dataflow wants: pixels innermost for weight-stationary (one
    weight tile per fold of streamed pixels), the reduction innermost otherwise."""
    return cfg.dataflow == "weight-stationary"


def tile_gemm_cycles(cfg: HardwareConfig, levels: list[tuple]) -> int:
    """Compute-engine cycles of one tile's GEMM stage: the instructions the walker peels it
    into, each costed by the dataflow's GEMM cost (``dsa_tvm.hw.dataflow``)."""
    merged = merge_levels(levels)
    cut = max(0, len(merged) - GEMM_LEVELS)
    copies = math.prod(lv[0] for lv in merged[:cut])
    inner = merged[cut:] or [(1, 0, 0, 0)]
    return copies * gemm_cycles(cfg, inner)


def output_stage_cycles(cfg: HardwareConfig, gemm: float, alu: float) -> float:
    """Compute-engine cycles of a tile's GEMMs and output-stage ALU work: serialized on a
    shared stage, overlapped (the ALU pays its issue) on a pipelined one."""
    return max(gemm, alu) + 1 if cfg.stage == "pipelined" else gemm + alu
