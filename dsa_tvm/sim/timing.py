"""Timing model: fetch, three engines with instruction queues, dependency tokens, DRAM.

Event-driven and deterministic. The fetch unit dispatches instructions in
program order into the queue of their engine (stalling while that queue is
full). Each engine runs its queue in order; an instruction starts when the
engine is free and the tokens it pops have been pushed. Tokens are pushed when
the producing instruction completes. DMA transfers share one DRAM channel in
start order: a transfer occupies it for ``ceil(bytes / bandwidth)`` cycles and
completes ``latency`` cycles after that (the latency overlaps other transfers).

Costs, all from the config:

* LOAD/STORE: bus wait + ceil(bytes / bandwidth) + latency
* GEMM: one cycle per loop point + fill/drain of the array (block_in + block_out)
* ALU: loop points x ceil(block_out / lanes) + ALU pipeline latency
* SYNC, FINISH: one cycle
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..isa.instructions import Alu, Engine, Gemm, Instruction, Load, Store
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
        return ins.steps + cfg.gemm_fill_drain_cycles
    if isinstance(ins, Alu):
        return ins.steps * cfg.alu_cycles_per_row + cfg.alu_latency_cycles
    return 1


@dataclass
class Schedule:
    """When every instruction ran, and what each engine spent its cycles on."""

    start: np.ndarray
    end: np.ndarray
    engine: np.ndarray
    dispatch: np.ndarray
    cycles: int
    busy: dict[str, int] = field(default_factory=dict)
    token_wait: dict[str, int] = field(default_factory=dict)
    dram_wait: dict[str, int] = field(default_factory=dict)
    fetch_stall: int = 0
    dram_busy: int = 0
    bus: list[tuple[int, int, int]] = field(default_factory=list)  # (index, start, end) on DRAM


def schedule(instrs: list[Instruction], cfg: "HardwareConfig",
             on_start: Callable[[int, Instruction, int, int], None] | None = None) -> Schedule:
    """Simulate the timing; ``on_start(i, ins, start, end)`` runs in start-time order."""
    n = len(instrs)
    eng_of = np.array([int(ins.engine) for ins in instrs], dtype=np.int64)
    depth = {Engine.LOAD: cfg.load_depth, Engine.COMPUTE: cfg.compute_depth,
             Engine.STORE: cfg.store_depth}
    bw, lat, disp_cycles = cfg.bandwidth_bytes_per_cycle, cfg.latency_cycles, cfg.dispatch_cycles
    start = np.zeros(n, dtype=np.int64)
    end = np.zeros(n, dtype=np.int64)
    dispatch = np.zeros(n, dtype=np.int64)
    queues: dict[Engine, deque] = {e: deque() for e in ENGINES}
    free_at = {e: 0 for e in ENGINES}
    tokens: dict[str, deque] = {k: deque() for k in ("l2c", "c2l", "c2s", "s2c")}
    names = {e: e.name.lower() for e in ENGINES}
    busy = {names[e]: 0 for e in ENGINES}
    token_wait = dict.fromkeys(busy, 0)
    dram_wait = dict.fromkeys(busy, 0)
    bus_free = 0
    dram_busy = 0
    bus: list[tuple[int, int, int]] = []
    fetch_idx, fetch_time, fetch_stall = 0, 0, 0
    started: dict[Engine, list[int]] = {e: [] for e in ENGINES}  # start times, in order
    ndisp = {e: 0 for e in ENGINES}
    done = 0

    def needs(ins: Instruction) -> list[str]:
        d, e = ins.deps, ins.engine
        out = []
        if d.pop_prev:
            out.append(_POP_PREV[e])
        if d.pop_next:
            out.append(_POP_NEXT[e])
        return out

    while done < n:
        best_t, best = None, None
        # candidate: dispatch the next instruction once its queue has a free slot
        if fetch_idx < n:
            e = Engine(eng_of[fetch_idx])
            k = ndisp[e]
            if k < depth[e]:
                best_t, best = fetch_time, ("dispatch", e)
            elif len(started[e]) > k - depth[e]:  # the slot frees when that one starts
                best_t, best = max(fetch_time, started[e][k - depth[e]]), ("dispatch", e)
        # candidates: an engine starts its queue head
        for e in ENGINES:
            if not queues[e]:
                continue
            i = queues[e][0]
            req = needs(instrs[i])
            if any(not tokens[k] for k in req):
                continue
            ready = max(free_at[e], dispatch[i])
            t = max([ready] + [tokens[k][0] for k in req])
            if best_t is None or t < best_t:
                best_t, best = t, ("start", e)
        if best is None:
            raise _deadlock(instrs, queues, tokens, fetch_idx, eng_of, depth, needs)
        kind, e = best
        if kind == "dispatch":
            i = fetch_idx
            dispatch[i] = best_t
            fetch_stall += best_t - fetch_time
            queues[e].append(i)
            ndisp[e] += 1
            fetch_idx += 1
            fetch_time = best_t + disp_cycles
            continue
        i = queues[e].popleft()
        ins = instrs[i]
        t0 = best_t
        ready = max(free_at[e], dispatch[i])
        token_wait[names[e]] += t0 - ready
        for k in needs(ins):
            tokens[k].popleft()
        if isinstance(ins, (Load, Store)):
            nbytes = dma_bytes(ins, cfg)
            xfer = math.ceil(nbytes / bw)
            bus_start = max(t0, bus_free)
            dram_wait[names[e]] += bus_start - t0
            bus_free = bus_start + xfer
            dram_busy += xfer
            bus.append((i, bus_start, bus_free))
            t1 = bus_free + lat
        else:
            t1 = t0 + compute_cycles(ins, cfg)
        start[i], end[i] = t0, t1
        busy[names[e]] += t1 - t0
        free_at[e] = t1
        started[e].append(t0)
        d = ins.deps
        if d.push_prev:
            tokens[_PUSH_PREV[e]].append(t1)
        if d.push_next:
            tokens[_PUSH_NEXT[e]].append(t1)
        if on_start is not None:
            on_start(i, ins, int(t0), int(t1))
        done += 1
    cycles = int(end.max()) if n else 0
    return Schedule(start, end, eng_of, dispatch, cycles, busy, token_wait, dram_wait,
                    fetch_stall, dram_busy, bus)


def _deadlock(instrs, queues, tokens, fetch_idx, eng_of, depth, needs) -> DeadlockError:
    waits = []
    first = None
    for e in ENGINES:
        if queues[e]:
            i = queues[e][0]
            first = i if first is None else min(first, i)
            missing = [k for k in needs(instrs[i]) if not tokens[k]]
            waits.append(f"{instrs[i].opcode.name} #{i} on the {e.name.lower()} engine waits "
                         f"for a {'/'.join(missing)} token")
    if fetch_idx < len(instrs):
        e = Engine(eng_of[fetch_idx])
        if len(queues[e]) >= depth[e]:
            waits.append(f"fetch is stalled at #{fetch_idx}: the {e.name.lower()} queue "
                         f"({depth[e]} deep) is full")
    return DeadlockError(first, "token deadlock: no engine can make progress; "
                         + "; ".join(waits) + " (no instruction will ever push them)")
