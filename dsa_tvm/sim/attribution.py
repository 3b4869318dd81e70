"""Per-layer cycles that add up: every cycle of a run charged to exactly one layer.

Layers of one program overlap in time (one layer's loads run under the previous
layer's compute), so a layer's span ``max(end) - min(start)`` double counts, and
the spans of a region's layers sum to more than the region takes. The rule here:

* each cycle goes to the layer whose instruction holds the **compute engine** then;
* a cycle in which the compute engine is idle goes to the layer holding the
  **load engine** (the oldest one when several transfers are in flight), else the
  **store engine**;
* a cycle in which no engine works (waiting for DRAM latency, say) goes to the
  layer of the next instruction that starts (the one being waited for); idle
  cycles at the end go to the last layer.

So the ``cycles`` column sums to the program's total exactly, and a compute-bound
layer is charged at least its compute time (never less than its compute bound).
Each layer's cycles split by what claimed them, which says what the layer waited on:
``on_compute`` (the compute engine ran its instruction; ACC loads, which hold the
compute engine, count here), ``dram_wait`` (only its DMA transfers were in flight,
DRAM latency included) and ``token_wait`` (no engine worked: a dependency token or the
pipeline held it up); the three sum to ``cycles``.
The span and each engine's busy cycles (the union of its instructions' intervals
per engine, in-flight transfers counted once) are kept beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa.instructions import Engine
from .timing import Schedule

#: engines in the order that claims a cycle
PRIORITY = (Engine.COMPUTE, Engine.LOAD, Engine.STORE)


@dataclass(frozen=True)
class LayerTime:
    """One layer's share of a run, in cycles."""

    cycles: int        # attributed (the column that sums to the total)
    span: int          # first start to last end of its instructions
    load: int          # busy cycles of each engine on its instructions
    compute: int
    store: int
    on_compute: int = 0   # ``cycles`` split by what claimed them (they sum to ``cycles``)
    dram_wait: int = 0
    token_wait: int = 0


#: what claimed a segment: the index in PRIORITY, or IDLE
IDLE = -1


def _union(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Disjoint intervals covering the given ones (sorted by start)."""
    order = np.argsort(starts, kind="stable")
    out: list[list[int]] = []
    for s, e in zip(starts[order].tolist(), ends[order].tolist()):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


@dataclass(frozen=True)
class Attribution:
    layers: list[LayerTime]
    #: (layer index, first cycle, end cycle) of each stretch charged to one layer, in order
    runs: list[tuple[int, int, int]]


def attribute(sched: Schedule, ranges: list[tuple[int, int]]) -> Attribution:
    """Times of the layers whose instructions are ``ranges`` (first, last inclusive) of
    the program ``sched`` timed; the ``cycles`` of all layers sum to ``sched.cycles``
    when the program has at least one layer."""
    total = int(sched.cycles)
    start = np.asarray(sched.start, np.int64)
    end = np.asarray(sched.end, np.int64)
    engine = np.asarray(sched.engine, np.int64)
    if not ranges:
        return Attribution([], [])
    # per layer and engine: the union of its instructions' busy intervals
    busy: list[dict[int, list[tuple[int, int]]]] = []
    for lo, hi in ranges:
        sl = slice(lo, hi + 1)
        busy.append({int(e): _union(start[sl][engine[sl] == e], end[sl][engine[sl] == e])
                     for e in Engine})
    cuts = {0, total}
    for per_engine in busy:
        for ivs in per_engine.values():
            for s, e in ivs:
                cuts.update((min(s, total), min(e, total)))
    bounds = np.array(sorted(cuts), np.int64)
    seg_len = np.diff(bounds)
    owner = np.full(seg_len.size, -1, np.int64)
    claim = np.full(seg_len.size, IDLE, np.int64)
    # paint the engines from the lowest priority up, each layer from the youngest down, so
    # the owner of a segment is the oldest layer on the highest-priority busy engine
    for eng in reversed(PRIORITY):
        paint = np.full(seg_len.size, -1, np.int64)
        for k in range(len(ranges) - 1, -1, -1):
            for s, e in busy[k][int(eng)]:
                a, b = np.searchsorted(bounds, [min(s, total), min(e, total)])
                paint[a:b] = k
        owner = np.where(paint >= 0, paint, owner)
        claim = np.where(paint >= 0, PRIORITY.index(eng), claim)
    owner = _fill_idle(owner)
    cycles = np.bincount(owner, weights=seg_len, minlength=len(ranges)).astype(np.int64)
    # per layer, the cycles each claimant gave it: 0 compute, 1 load, 2 store, IDLE nothing
    by_claim = {c: np.bincount(owner, weights=np.where(claim == c, seg_len, 0),
                               minlength=len(ranges)).astype(np.int64)
                for c in (*range(len(PRIORITY)), IDLE)}
    out = []
    for k, (lo, hi) in enumerate(ranges):
        span = int(end[lo:hi + 1].max() - start[lo:hi + 1].min()) if hi >= lo else 0
        work = {e: sum(b - a for a, b in busy[k][int(e)]) for e in Engine}
        out.append(LayerTime(int(cycles[k]), span, work[Engine.LOAD], work[Engine.COMPUTE],
                             work[Engine.STORE], int(by_claim[0][k]),
                             int(by_claim[1][k] + by_claim[2][k]), int(by_claim[IDLE][k])))
    change = np.flatnonzero(np.diff(owner)) + 1
    firsts = np.concatenate(([0], change))
    lasts = np.concatenate((change, [owner.size]))
    runs = [(int(owner[a]), int(bounds[a]), int(bounds[b])) for a, b in zip(firsts, lasts)
            if bounds[b] > bounds[a]]
    return Attribution(out, runs)


def _fill_idle(owner: np.ndarray) -> np.ndarray:
    """Give every segment no engine claims to the next claimed segment's layer (the
    work being waited for); trailing ones to the last claimed layer."""
    idle = owner < 0
    if not idle.any():
        return owner
    if idle.all():
        return np.zeros_like(owner)
    idx = np.arange(owner.size)
    nxt = np.where(idle, owner.size, idx)
    nxt = np.minimum.accumulate(nxt[::-1])[::-1]           # next claimed segment
    prev = np.maximum.accumulate(np.where(idle, -1, idx))  # previous claimed segment
    pick = np.where(nxt < owner.size, nxt, prev)
    return owner[pick]
