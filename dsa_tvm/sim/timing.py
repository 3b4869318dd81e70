"""Timing model: fetch, three engines with instruction queues, dependency tokens, DRAM.

Event-driven and deterministic. The fetch unit dispatches instructions in
program order into the queue of their engine (stalling while that queue is
full). Each engine runs its queue in order; an instruction starts when the
engine is free and the tokens it pops have been pushed. Tokens are pushed when
the producing instruction completes.

DMA transfers share one DRAM channel in start order: a transfer occupies it for
``ceil(bytes / bandwidth)`` cycles (starting when both the engine and the
channel are free) and completes ``latency`` cycles after it leaves the channel.
The load and store engines are DMA engines with outstanding requests: each is
free for its next instruction as soon as its transfer has left the channel
(bus end), so back-to-back transfers on one engine pay the latency once, not
once each (two loads: bus1 + bus2 + latency). The instruction completes, pushes
its tokens and ends its trace slice at bus end + latency. Instructions retire in
program order on every engine: one completes no earlier than the one before it
on its engine, so a token still means "everything before me on my engine is
done" (a SYNC issued behind transfers in flight takes its one cycle, frees the
engine, and completes, pushing its tokens, when they do). ACC/ACC8/ACC16 loads run
on the compute engine, whose next instructions may read the rows being loaded and
have no token to wait with: they hold the compute engine until they complete,
as any compute instruction; with ``prefetch`` set they run on the load engine
like INP/WGT loads, overlapped with compute and ordered by tokens.

Costs, all from the config:

* LOAD/STORE: bus wait + ceil(bytes / bandwidth) + latency
* GEMM: by the array's dataflow, ``dsa_tvm.hw.dataflow.gemm_cycles`` (matrix-vector,
  the default: one cycle per loop point + fill/drain of the array, block_in + block_out)
* ALU: loop points x ceil(block_out / lanes) + ALU pipeline latency (a unit wider than
  a row: ceil(loop points x block_out / lanes))
* ALU MAC8: as ALU, with the reduction levels (destination stride 0) taking
  ``ceil(points / dot_ways)`` steps per destination row (``[vector] mac8_ways``, capped
  at the array's rate)
* ALU LUT: loop points x ceil(block_out / table lookups per cycle) + ALU pipeline latency
* NORM: ``dsa_tvm.isa.norm_unit.norm_cycles`` (rows over the units, passes per row at
  ``norm_elements_per_cycle``, plus ``norm_row_latency_cycles`` per row); it holds the
  compute engine (with a pipelined output stage, it waits until the stage is empty)
* SYNC, FINISH: one cycle

Output stage (``[output] stage``). "shared": ALU instructions hold the compute engine
for their whole cost (above). "pipelined": the compute engine spends one cycle issuing an
ALU instruction (its ``release``) and the output stage runs it, in program order with
the other ALU instructions, from when both the issue and the stage are free; the
instruction completes (pushes its tokens, e.g. to the STORE that writes its rows out)
when the stage finishes it, and, as every instruction, no earlier than the one before it
on the compute engine. A later compute-engine instruction that may touch the rows the
stage is still working on waits for the stage to finish them: a GEMM whose accumulator
rows overlap the rows (destination or sources) of an unfinished ALU instruction, and any
other compute-engine instruction (ACC loads, SYNC) until the stage is empty. Tokens keep
their meaning ("everything before me on my engine is done"), so the store of a
requantized tile never starts before its requantize has left the stage.

Per instruction the schedule records ``start``, ``end`` (completion) and
``release`` (when its engine could start the next instruction: ``end``, except
bus end for pipelined DMA and start + 1 for a SYNC waiting to retire behind
them). An engine's ``busy`` cycles are the sum of
``release - start`` over its instructions: the cycles it was occupied and could
not start anything else (for DMA engines: waiting for the channel and
transferring; the latency tail overlaps later work and is not counted).
``active`` cycles are the cycles with at least one of its instructions between
start and completion (latency included).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..hw.dataflow import gemm_cycles
from ..isa.instructions import Alu, AluOp, Engine, Gemm, Instruction, Load, Norm, Store
from ..isa.norm_unit import norm_cycles
from .errors import DeadlockError

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

ENGINES = (Engine.LOAD, Engine.COMPUTE, Engine.STORE)
# token FIFO an engine pops with pop_prev / pop_next, pushes with push_prev / push_next
_POP_PREV = {Engine.COMPUTE: "l2c", Engine.STORE: "c2s"}
_POP_NEXT = {Engine.LOAD: "c2l", Engine.COMPUTE: "s2c"}
_PUSH_PREV = {Engine.COMPUTE: "c2l", Engine.STORE: "s2c"}
_PUSH_NEXT = {Engine.LOAD: "l2c", Engine.COMPUTE: "c2s"}


def dma_bytes(ins: Load | Store, cfg: "HardwareConfig") -> int:
    """DRAM bytes a transfer moves (padding is generated on chip and costs none)."""
    return ins.y_size * ins.x_size * cfg.element_bytes(ins.buffer)


def compute_cycles(ins: Instruction, cfg: "HardwareConfig") -> int:
    """Cycles a non-DMA instruction keeps its engine busy."""
    if isinstance(ins, Gemm):
        return gemm_cycles(cfg, [(lp.extent, lp.acc, lp.inp, lp.wgt) for lp in ins.loops],
                           ins.sparse)
    if isinstance(ins, Alu):
        if ins.op == AluOp.LUT:  # the table unit's read ports set the rate
            return ins.steps * cfg.lut_cycles_per_row + cfg.alu_latency_cycles
        if ins.op == AluOp.MAC8:  # a dot-product lane takes dot_ways taps a step
            steps = cfg.mac8_steps([(lp.extent, lp.dst) for lp in ins.loops])
            return cfg.alu_step_cycles(steps) + cfg.alu_latency_cycles
        return cfg.alu_step_cycles(ins.steps) + cfg.alu_latency_cycles
    if isinstance(ins, Norm):  # the [norm] units' cost, defined once (isa.norm_unit)
        return norm_cycles(cfg, ins.op, ins.length, ins.rows)
    return 1


@dataclass
class Schedule:
    """When every instruction ran, and what each engine spent its cycles on."""

    start: np.ndarray
    end: np.ndarray        # completion: tokens pushed, trace slice ends
    engine: np.ndarray
    dispatch: np.ndarray
    cycles: int
    release: np.ndarray | None = None  # engine free for its next instruction
    busy: dict[str, int] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    token_wait: dict[str, int] = field(default_factory=dict)
    dram_wait: dict[str, int] = field(default_factory=dict)
    fetch_stall: int = 0
    dram_busy: int = 0
    bus: list[tuple[int, int, int]] = field(default_factory=list)  # (index, start, end) on DRAM
    stage_busy: int = 0    # cycles the pipelined output stage spent on ALU instructions


_FIFOS = ("l2c", "c2l", "c2s", "s2c")
_FIFO_ID = {k: j for j, k in enumerate(_FIFOS)}


def _token_plan(ins: Instruction) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """FIFO ids an instruction pops before it starts and pushes when it completes."""
    d, e = ins.deps, ins.engine
    pops = tuple(_FIFO_ID[m[e]] for flag, m in ((d.pop_prev, _POP_PREV), (d.pop_next, _POP_NEXT))
                 if flag)
    pushes = tuple(_FIFO_ID[m[e]] for flag, m in ((d.push_prev, _PUSH_PREV),
                                                  (d.push_next, _PUSH_NEXT)) if flag)
    return pops, pushes


def _span(base: int, loops, attr: str) -> tuple[int, int]:
    """Lowest and highest row a loop nest touches through one operand."""
    lo = hi = base
    for lp in loops:
        d = (lp.extent - 1) * getattr(lp, attr)
        if d > 0:
            hi += d
        else:
            lo += d
    return lo, hi


def _acc_rows(ins: Instruction) -> tuple[tuple[int, int], ...] | None:
    """Accumulator row ranges of a GEMM or ALU instruction (None: any other instruction)."""
    if isinstance(ins, Gemm):
        return (_span(ins.acc_base, ins.loops, "acc"),)
    if isinstance(ins, Alu):
        rows = [_span(ins.dst_base, ins.loops, "dst"), _span(ins.a_base, ins.loops, "a")]
        if not ins.use_imm:
            rows.append(_span(ins.b_base, ins.loops, "b"))
        return tuple(rows)
    return None


def schedule(instrs: list[Instruction], cfg: "HardwareConfig",
             on_start: Callable[[int, Instruction, int, int], None] | None = None,
             costs: dict[int, int] | None = None) -> Schedule:
    """Simulate the timing; ``on_start(i, ins, start, end)`` runs in start-time order.
    ``costs`` replaces the cost of some instructions (index -> a DMA's bus cycles, or any
    instruction's duration negated): what a CIM part's crossbars do instead
    (``dsa_tvm.sim.cim_mapping.cost_overrides``)."""
    n = len(instrs)
    pipelined = (True, False, True)  # DMA engines keep transfers outstanding; compute blocks
    bw = cfg.bandwidth_bytes_per_cycle
    plans: dict[int, tuple] = {}  # id -> (engine, tokens, cost): a shared object plans once
    eng, toks, cost = [], [], []
    for ins in instrs:
        p = plans.get(id(ins))
        if p is None:
            # DMA: bus cycles (>= 0, completes `lat` after the bus); others: -duration
            c = (math.ceil(dma_bytes(ins, cfg) / bw) if isinstance(ins, (Load, Store))
                 else -compute_cycles(ins, cfg))
            p = plans[id(ins)] = (int(ins.engine), _token_plan(ins), c)
        eng.append(p[0])
        toks.append(p[1])
        cost.append(p[2])
    for i, c in (costs or {}).items():
        cost[i] = c
    staged = cfg.stage == "pipelined"
    is_alu = [isinstance(ins, Alu) for ins in instrs] if staged else []
    rows_of: dict[int, tuple | None] = {}
    in_stage: list[tuple[int, tuple]] = []  # (stage end, rows) of ALU work not yet retired
    stage_free = stage_busy = 0

    def stage_ready(i: int, t: int) -> int:
        """Earliest start >= t of compute instruction i given the output stage's work."""
        if is_alu[i]:
            return t
        rows = rows_of.get(i, 0)
        if rows == 0:
            rows = rows_of[i] = _acc_rows(instrs[i])
        for t_end, busy_rows in in_stage:
            if t_end <= t:
                continue
            if rows is None or any(lo <= bh and blo <= hi for lo, hi in rows
                                   for blo, bh in busy_rows):
                t = t_end
        return t

    depth = (cfg.load_depth, cfg.compute_depth, cfg.store_depth)
    lat, disp_cycles = cfg.latency_cycles, cfg.dispatch_cycles
    start = [0] * n
    end = [0] * n
    release = [0] * n
    dispatch = [0] * n
    queues: tuple[deque, ...] = (deque(), deque(), deque())
    free_at = [0, 0, 0]
    tokens: tuple[deque, ...] = (deque(), deque(), deque(), deque())
    busy = [0, 0, 0]
    active = [0, 0, 0]
    active_to = [0, 0, 0]  # end of the union of [start, end) intervals counted so far
    last_end = [0, 0, 0]   # completion of the engine's latest instruction
    token_wait = [0, 0, 0]
    dram_wait = [0, 0, 0]
    bus_free = dram_busy = 0
    bus: list[tuple[int, int, int]] = []
    fetch_idx = fetch_time = fetch_stall = 0
    started: tuple[list[int], ...] = ([], [], [])  # start times per engine, in order
    ndisp = [0, 0, 0]
    done = 0
    while done < n:
        best_t = -1
        best_e = -1  # 3: dispatch
        if fetch_idx < n:
            e = eng[fetch_idx]
            k = ndisp[e] - depth[e]
            if k < 0:
                best_t, best_e = fetch_time, 3
            elif len(started[e]) > k:  # the slot frees when that one starts
                t = started[e][k]
                best_t, best_e = (t if t > fetch_time else fetch_time), 3
        for e in (0, 1, 2):
            q = queues[e]
            if not q:
                continue
            i = q[0]
            t = free_at[e] if free_at[e] > dispatch[i] else dispatch[i]
            if staged and e == 1 and in_stage:
                t = stage_ready(i, t)
            ok = True
            for f in toks[i][0]:
                if not tokens[f]:
                    ok = False
                    break
                if tokens[f][0] > t:
                    t = tokens[f][0]
            if ok and (best_e < 0 or t < best_t):
                best_t, best_e = t, e
        if best_e < 0:
            raise _deadlock(instrs, queues, tokens, fetch_idx, eng, depth, toks)
        if best_e == 3:
            e = eng[fetch_idx]
            dispatch[fetch_idx] = best_t
            fetch_stall += best_t - fetch_time
            queues[e].append(fetch_idx)
            ndisp[e] += 1
            fetch_idx += 1
            fetch_time = best_t + disp_cycles
            continue
        e = best_e
        i = queues[e].popleft()
        t0 = best_t
        ready = free_at[e] if free_at[e] > dispatch[i] else dispatch[i]
        if staged and e == 1 and in_stage:
            ready = stage_ready(i, ready)
        token_wait[e] += t0 - ready
        pops, pushes = toks[i]
        for f in pops:
            tokens[f].popleft()
        c = cost[i]
        if c >= 0:
            bus_start = t0 if t0 > bus_free else bus_free
            dram_wait[e] += bus_start - t0
            bus_free = bus_start + c
            dram_busy += c
            bus.append((i, bus_start, bus_free))
            t1 = bus_free + lat
            rel = bus_free if pipelined[e] else t1
        elif staged and is_alu[i]:
            s0 = t0 if t0 > stage_free else stage_free
            t1 = stage_free = s0 - c
            stage_busy -= c
            rel = t0 + 1
            in_stage = [w for w in in_stage if w[0] > t0]
            in_stage.append((t1, _acc_rows(instrs[i])))
        else:
            t1 = rel = t0 - c
        if t1 < last_end[e]:  # retire in program order (a SYNC behind transfers in flight)
            t1 = last_end[e]
        last_end[e] = t1
        start[i], end[i], release[i] = t0, t1, rel
        busy[e] += rel - t0
        if t1 > active_to[e]:
            active[e] += t1 - (t0 if t0 > active_to[e] else active_to[e])
            active_to[e] = t1
        free_at[e] = rel
        started[e].append(t0)
        for f in pushes:
            tokens[f].append(t1)
        if on_start is not None:
            on_start(i, instrs[i], t0, t1)
        done += 1
    names = [e.name.lower() for e in ENGINES]
    return Schedule(np.array(start, dtype=np.int64), np.array(end, dtype=np.int64),
                    np.array(eng, dtype=np.int64), np.array(dispatch, dtype=np.int64),
                    max(end) if n else 0, np.array(release, dtype=np.int64),
                    dict(zip(names, busy)), dict(zip(names, active)),
                    dict(zip(names, token_wait)), dict(zip(names, dram_wait)), fetch_stall,
                    dram_busy, bus, stage_busy)


def _deadlock(instrs, queues, tokens, fetch_idx, eng, depth, toks) -> DeadlockError:
    waits = []
    first = None
    for e in ENGINES:
        if queues[e]:
            i = queues[e][0]
            first = i if first is None else min(first, i)
            missing = [_FIFOS[f] for f in toks[i][0] if not tokens[f]]
            waits.append(f"{instrs[i].opcode.name} #{i} on the {e.name.lower()} engine waits "
                         f"for a {'/'.join(missing)} token")
    if fetch_idx < len(instrs):
        e = Engine(eng[fetch_idx])
        if len(queues[e]) >= depth[e]:
            waits.append(f"fetch is stalled at #{fetch_idx}: the {e.name.lower()} queue "
                         f"({depth[e]} deep) is full")
    return DeadlockError(first, "token deadlock: no engine can make progress; "
                         + "; ".join(waits) + " (no instruction will ever push them)")
