"""What later runs of a program can skip or share, found once from its execution order.

A program's instruction stream, its execution order and its constant DRAM do not depend
on the inputs, so two facts about a run can be settled before any data is seen:

* **redundant loads**: a LOAD whose destination rows still hold exactly what an earlier,
  identical LOAD put there (no write to those rows since, no store to its DRAM source
  since) changes nothing. Schedules that re-read an input tile for every output-channel
  block (the DRAM traffic is real and the timing charges it) repeat many such loads.
* **shared-input GEMMs**: GEMMs whose weight tiles all came from constant DRAM and that
  read the same input rows holding the same data (same row versions) multiply one input
  matrix by several weight matrices. Their products are computed together when the first
  of them runs, one product as wide as all their output blocks, and each GEMM adds its
  columns into its accumulator rows at its own turn. The weight matrices are built once
  per program, so a weight load that only such GEMMs read is not copied either.

Both leave every value bit for bit as a step-by-step replay computes it (integer
products are exact; what a GEMM adds and when is unchanged). The timing is not touched:
it is simulated once per program from the whole stream.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..isa.footprint import BUF_SRAM, dram_span, footprint
from ..isa.instructions import Alu, Buffer, Gemm, Load, Norm, Store
from .plans import GemmPlan, gemm_plan

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

#: weight bytes a program's plan may hold as prepared matrices (beyond: GEMMs run as usual)
WEIGHT_BUDGET = 256 << 20


@dataclass
class SharedGemm:
    """GEMMs that multiply one input by their own constant weights: computed together."""

    members: list[int]          # instruction indices, in execution order
    cols: list[slice]           # each member's product columns
    weights: np.ndarray         # every member's weight matrix side by side (N columns)
    sums: np.ndarray | None     # int8 path: their column sums (int8_gemm)


@dataclass
class ReplayPlan:
    """Loads to skip and GEMM groups of one program (for one execution order)."""

    skip: frozenset[int]
    gemms: dict[int, tuple[SharedGemm, int]]  # GEMM index -> (its group, its position)
    load_runs: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    #: ALU index -> its vectorized steps' rows (``Machine.alu``, filled on the first replay)
    alu_steps: dict[int, tuple] = field(default_factory=dict)


#: loads that may run together (a WGT load also keeps the weight-tile bookkeeping)
RUN_BUFFERS = (Buffer.INP, Buffer.ACC, Buffer.ACC8, Buffer.ACC16)


def _load_key(ins: Load) -> tuple:
    return (ins.buffer, ins.sram_base, ins.dram_base, ins.y_size, ins.x_size, ins.x_stride,
            ins.pad_top, ins.pad_bottom, ins.pad_left, ins.pad_right, ins.pad_value)


def _input_key(ins: Gemm, plan: GemmPlan, versions: np.ndarray) -> tuple:
    """Same key, same input matrix: the rows' offsets, shape and the versions they hold."""
    digest = hashlib.blake2b(plan.inp.tobytes(), digest_size=16)
    digest.update(versions.tobytes())
    return (ins.inp_base, plan.nb, plan.nm, plan.nchunk, plan.chunk, plan.inp.shape,
            digest.digest())


class _Stores:
    """DRAM byte ranges stored so far, to ask whether a range was written since a point."""

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []

    def __len__(self) -> int:
        return len(self.lo)

    def add(self, lo: int, hi: int) -> None:
        self.lo.append(lo)
        self.hi.append(hi)

    def touched_since(self, n: int, lo: int, hi: int) -> bool:
        if n == len(self.lo):
            return False
        los, his = np.asarray(self.lo[n:]), np.asarray(self.hi[n:])
        return bool(np.any((los <= hi) & (his >= lo)))


def build_plan(program: "Program", cfg: "HardwareConfig", order: list[int],
               analog: frozenset[int] = frozenset(), int8: bool = False) -> ReplayPlan:
    """The replay plan of ``program`` run in ``order`` (the schedule's start order).
    ``analog``: GEMMs read on crossbars (never shared); ``int8``: prepare the weights for
    the int8 product path (:mod:`int8_gemm`), else as float32."""
    from .functional import Machine  # the weight tiles, loaded as a run loads them

    instrs = program.instructions
    depth = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth}
    version = {k: np.zeros(d, np.int64) for k, d in depth.items()}  # what each row holds
    const_wgt = np.zeros(cfg.wgt_depth, bool)     # rows loaded from constant DRAM
    machine = Machine(cfg, program, 1)            # executes the weight loads only
    machine.int8 = int8
    stores = _Stores()
    seen: dict[tuple, tuple[int, int]] = {}       # load key -> (version written, stores then)
    skip: set[int] = set()
    groups: dict[tuple, list[tuple[int, np.ndarray, np.ndarray | None]]] = {}
    budget = WEIGHT_BUDGET
    fresh = 0
    # which WGT load wrote each weight row, and the loads a GEMM outside the plan reads
    # (the others only feed planned GEMMs, whose matrices are built: they need no copy)
    wgt_writer = np.full(cfg.wgt_depth, -1, np.int64)
    wgt_read: set[int] = set()
    for i in order:
        ins = instrs[i]
        if isinstance(ins, Load):
            space = BUF_SRAM[ins.buffer]
            lo, hi = ins.sram_base, ins.sram_base + ins.rows_written - 1
            first, last = dram_span(ins, cfg)
            key = _load_key(ins)
            prev = seen.get(key)
            if (prev is not None and bool((version[space][lo:hi + 1] == prev[0]).all())
                    and not stores.touched_since(prev[1], first, last)):
                skip.add(i)
                continue
            fresh += 1
            version[space][lo:hi + 1] = fresh
            seen[key] = (fresh, len(stores))
            if space == "wgt":
                const_wgt[lo:hi + 1] = machine.is_const(first, last)
                wgt_writer[lo:hi + 1] = i
                machine.load(ins)
        elif isinstance(ins, Store):
            stores.add(*dram_span(ins, cfg))
        elif isinstance(ins, (Alu, Norm, Gemm)):
            fp = footprint(ins, cfg)
            for _space, lo, hi in fp.writes:
                fresh += 1
                version["acc"][lo:hi + 1] = fresh
            if not isinstance(ins, Gemm):
                continue
            plan = gemm_plan(ins.loops, cfg.block_in)
            tiles = slice(ins.wgt_base + plan.wgt_lo, ins.wgt_base + plan.wgt_hi + 1)
            if i in analog or not const_wgt[tiles].all():
                wgt_read.update(wgt_writer[tiles].tolist())
                continue
            (_s, ilo, ihi), _w = fp.reads
            mat, sums = machine.weight_matrix(ins, plan)
            if mat.nbytes > budget:
                wgt_read.update(wgt_writer[tiles].tolist())
                continue
            budget -= mat.nbytes
            groups.setdefault(_input_key(ins, plan, version["inp"][ilo:ihi + 1]),
                              []).append((i, mat, sums))
    shared: dict[int, tuple[SharedGemm, int]] = {}
    for parts in groups.values():
        members, mats, sums = zip(*parts)
        ends = np.cumsum([m.shape[-1] for m in mats]).tolist()
        group = SharedGemm(list(members),
                           [slice(a, b) for a, b in zip([0] + ends[:-1], ends)],
                           mats[0] if len(mats) == 1 else np.concatenate(mats, axis=-1),
                           None if sums[0] is None else np.concatenate(sums, axis=-1))
        for pos, i in enumerate(group.members):
            shared[i] = (group, pos)
    skip.update(i for i in order if isinstance(instrs[i], Load) and i not in wgt_read
                and BUF_SRAM[instrs[i].buffer] == "wgt")
    runs, joined = load_runs([i for i in order if i not in skip], instrs, cfg,
                             machine.const_region)
    return ReplayPlan(frozenset(skip | joined), shared, runs)



def load_runs(seq: list[int], instrs: list, cfg: "HardwareConfig",
              const_region) -> tuple[dict[int, tuple[int, int, int]], set[int]]:
    """Loads next to each other in ``seq`` (execution order, skipped loads left out)
    with one geometry, each a fixed number of rows further into the scratchpad (past the
    previous one's rows) and of elements further into the same constant region or into
    the inputs' own DRAM (``const_region(lo, hi)``: a constant region's index or None):
    one strided copy does them all. Returns {first: (n, row step, element step)} and the
    indices the first one's copy covers."""
    runs: dict[int, tuple[int, int, int]] = {}
    joined: set[int] = set()
    cur: list[int] = []

    def close() -> None:
        if len(cur) > 1:
            a, b = instrs[cur[0]], instrs[cur[1]]
            runs[cur[0]] = (len(cur), b.sram_base - a.sram_base, b.dram_base - a.dram_base)
            joined.update(cur[1:])

    def source(ins: Load) -> int | None:
        unit = cfg.element_bytes(ins.buffer)
        return const_region(ins.dram_base * unit, ins.dram_base * unit + 1)

    for i in seq:
        ins = instrs[i]
        if not (isinstance(ins, Load) and ins.buffer in RUN_BUFFERS):
            close()
            cur = []
            continue
        if cur:
            prev = instrs[cur[-1]]
            rows, elems = ins.sram_base - prev.sram_base, ins.dram_base - prev.dram_base
            if (_load_key(ins)[3:] == _load_key(prev)[3:] and ins.buffer == prev.buffer
                    and rows >= ins.rows_written and elems >= 0
                    and (len(cur) == 1 or (rows, elems) == (
                        prev.sram_base - instrs[cur[-2]].sram_base,
                        prev.dram_base - instrs[cur[-2]].dram_base))
                    and source(ins) == source(prev)):
                cur.append(i)
                continue
            close()
        cur = [i]
    close()
    return runs, joined
