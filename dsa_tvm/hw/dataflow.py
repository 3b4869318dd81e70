"""Cycles of one GEMM instruction under the array's dataflow (``[array] dataflow``).

The one place the GEMM cost lives: the simulator's timing (``dsa_tvm.sim.timing``) and
the schedules' analytic estimates (``tir_schedules.kinds``) both call
:func:`gemm_cycles`, so the tuner ranks loop orders by the cost the simulator charges.

A GEMM instruction is a loop nest, outermost level first, each level an
``(extent, acc_stride, inp_stride, wgt_stride)``; every loop point multiplies one input
row (block_in int8) by one weight tile (block_out x block_in) into one accumulator row.
The array has R = block_in rows and C = block_out columns.

* matrix-vector: one loop point per cycle, fill + drain (R + C) once per instruction.
  A new weight tile may enter every cycle: the weight read port must deliver R * C
  bytes per switch (``wgt_port``), the input port R bytes per new input row
  (``inp_port``); a narrower port stretches the points it cannot feed.
* weight-stationary: a fold is a run of consecutive loop points that share one weight
  tile (the innermost levels whose weight stride is 0), T points long. Each fold
  preloads the tile (R cycles, C bytes per cycle; longer if the port is narrower),
  streams T points and fills/drains (R + C - 2): ``T + 2R + C - 2`` per fold, as
  SCALE-Sim counts a weight-stationary fold. With ``weight_double_buffer`` a preload
  hides behind the previous fold's stream (``max(0, R - T)`` shows), bar the first.
* output-stationary: R pixels x C output channels stay in the PEs while their whole
  reduction streams (K = reduction points x block_in elements, one per cycle), then
  drain: ``K + R + C - 2`` per fold, ``ceil(pixels / R)`` folds per output-channel block
  (accumulator levels with a weight stride walk channel blocks, the others pixels).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import HardwareConfig

Loop = tuple[int, int, int, int]  # extent, acc stride, inp stride, wgt stride


def _run(loops: Sequence[Loop], operand: int) -> int:
    """Consecutive loop points over which ``operand`` (1 acc, 2 inp, 3 wgt) stays put."""
    n = 1
    for lp in reversed(loops):
        if lp[0] == 1:
            continue
        if lp[operand] != 0:
            break
        n *= lp[0]
    return n


def _steps(loops: Iterable[Loop]) -> int:
    n = 1
    for lp in loops:
        n *= lp[0]
    return n


def _sparse_points(loops: Sequence[Loop], steps: int, n: int, m: int) -> int:
    """Array cycles of ``steps`` loop points whose weight tiles are N:M sparse: the R
    reduction points of each accumulator row (the levels with accumulator stride 0) go
    M / N to a cycle, ceil(R * N / M) per row (the int32 sums are order-free)."""
    reduce = _steps(lp for lp in loops if lp[1] == 0)
    return steps // reduce * math.ceil(reduce * n / m)


def gemm_cycles(cfg: "HardwareConfig", loops: Sequence[Loop], sparse: bool = False) -> int:
    """Cycles the compute engine spends on one GEMM instruction with this loop nest;
    ``sparse``: its weight tiles are ``array.sparsity`` N:M (``Gemm.sparse``), read from
    the scratchpad compressed (``sparse_tile_bytes`` a tile)."""
    loops = [tuple(int(x) for x in lp) for lp in loops]
    steps = _steps(loops)
    r, c = cfg.block_in, cfg.block_out
    inp_row = math.ceil(cfg.inp_row_bytes / cfg.inp_port)  # cycles per input row read
    flow = cfg.dataflow
    n_m = cfg.sparse_n_m if sparse else None
    if flow == "matrix-vector":
        w_switches = steps // _run(loops, 3)
        i_reads = steps // _run(loops, 2)
        tile = cfg.sparse_tile_bytes if n_m else cfg.wgt_tile_bytes
        rows_per_cycle = max(1, cfg.inp_port // cfg.inp_row_bytes)  # a wide port (sparse)
        port = max(math.ceil(w_switches * tile / cfg.wgt_port),
                   math.ceil(i_reads / rows_per_cycle) * inp_row)
        points = _sparse_points(loops, steps, *n_m) if n_m else steps
        return max(points, port) + cfg.gemm_fill_drain_cycles
    if flow == "weight-stationary":  # (no sparsity: the config's rule refuses it)
        t = _run(loops, 3)
        folds = steps // t
        preload = max(r, math.ceil(cfg.wgt_tile_bytes / cfg.wgt_port))
        stream = t * inp_row
        per_fold = stream + r + c - 2
        if cfg.weight_double_buffer:
            return preload + folds * per_fold + (folds - 1) * max(0, preload - stream)
        return folds * (preload + per_fold)
    if flow == "output-stationary":
        # accumulator levels that walk the weights are output-channel blocks (C lanes
        # each); the others are pixels, R of them share a fold (one per array row)
        pixels = _steps(lp for lp in loops if lp[1] != 0 and lp[3] == 0)
        blocks = _steps(lp for lp in loops if lp[1] != 0 and lp[3] != 0)
        k = steps // (pixels * blocks) * r
        if n_m:  # the kept N of each M reduction elements stream, the rest are skipped
            k = math.ceil(k * n_m[0] / n_m[1])
        folds = math.ceil(pixels / r) * blocks
        # each cycle: one element per array row (R bytes in), one weight row (C bytes)
        beat = max(math.ceil(r / cfg.inp_port), math.ceil(c / cfg.wgt_port))
        return folds * (k * beat + r + c - 2)
    raise ValueError(f"unknown dataflow {flow!r}")


def port_demand(cfg: "HardwareConfig") -> dict[str, int]:
    """Peak scratchpad read bytes per cycle the dataflow needs at full rate (for the docs
    and the fidelity bench); :func:`gemm_cycles` charges what a port lacks."""
    r, c = cfg.block_in, cfg.block_out
    return {"matrix-vector": {"wgt": r * c, "inp": r},
            "weight-stationary": {"wgt": c, "inp": r},
            "output-stationary": {"wgt": c, "inp": r}}[cfg.dataflow]
