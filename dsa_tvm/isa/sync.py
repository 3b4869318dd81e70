"""Derive dependency tokens for a program written without them.

Code generators emit instructions in a sensible program order and leave
synchronization to this pass. For every instruction it finds, on each other
engine, the latest earlier instruction whose footprint conflicts with it
(read-after-write, write-after-read, write-after-write on scratchpad rows or
DRAM bytes) and makes the later one wait for it:

* between neighbouring engines (load<->compute, compute<->store) the producer
  pushes a token and the consumer pops it;
* between load and store, which share no token queue, a SYNC on the compute
  engine relays the token.

Tokens are anonymous FIFO counts, so each FIFO's pushes must be popped in the
order they were pushed. The pass pushes a token only for a producer that a
consumer needs and pops it at once, in program order, which keeps every FIFO
paired; a dependency already implied by an earlier one (engines run in order)
is dropped. Every token flows forward in program order, so the result cannot
deadlock, whatever the queue depths.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .footprint import Footprint, footprint
from .instructions import Deps, Engine, Finish, Instruction, Sync

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

_L, _C, _S = Engine.LOAD, Engine.COMPUTE, Engine.STORE


class _NewestAccess:
    """Per engine, the newest instruction that read and that wrote each unit of storage.

    Storage is cut at every range boundary any instruction of the program has, so each
    footprint range is a run of whole segments; the newest earlier instruction of an
    engine that conflicts with a range is then the maximum of these tables over the
    run (exactly what a backward scan for the newest overlapping range would find)."""

    def __init__(self, fps: list[Footprint]) -> None:
        ranges = [(i, k, r) for i, fp in enumerate(fps)
                  for k, part in enumerate((fp.reads, fp.writes)) for r in part]
        by_space: dict[str, list[tuple[int, int, int, int]]] = {}
        for i, k, (space, lo, hi) in ranges:
            by_space.setdefault(space, []).append((i, k, lo, hi + 1))
        #: per instruction, its (space, first segment, end segment) reads and writes
        self.segments: list[tuple[list, list]] = [([], []) for _ in fps]
        self.reads: dict[Engine, dict[str, list[int]]] = {e: {} for e in (_L, _C, _S)}
        self.writes: dict[Engine, dict[str, list[int]]] = {e: {} for e in (_L, _C, _S)}
        for space, rows in by_space.items():
            arr = np.array(rows, dtype=np.int64)
            bounds = np.unique(arr[:, 2:])
            first = np.searchsorted(bounds, arr[:, 2]).tolist()
            end = np.searchsorted(bounds, arr[:, 3]).tolist()
            for (i, k, _, _), a, b in zip(rows, first, end):
                self.segments[i][k].append((space, a, b))
            for e in (_L, _C, _S):
                self.reads[e][space] = [-1] * len(bounds)
                self.writes[e][space] = [-1] * len(bounds)
        self.last = {e: -1 for e in (_L, _C, _S)}

    def newest_conflict(self, engine: Engine, reads: list, writes: list) -> int:
        """The newest instruction of ``engine`` ``reads``/``writes`` conflict with, or -1."""
        w, r = self.writes[engine], self.reads[engine]
        newest = -1
        for space, a, b in reads:   # read after write
            newest = max(newest, *w[space][a:b])
        for space, a, b in writes:  # write after write, write after read
            newest = max(newest, *w[space][a:b], *r[space][a:b])
        return newest

    def record(self, i: int, engine: Engine, reads: list, writes: list) -> None:
        for space, a, b in reads:
            self.reads[engine][space][a:b] = [i] * (b - a)
        for space, a, b in writes:
            self.writes[engine][space][a:b] = [i] * (b - a)
        self.last[engine] = i


def _find_deps(instrs: list[Instruction], fps: list[Footprint]) -> list[dict[Engine, int]]:
    """For each instruction, the latest conflicting earlier instruction per other engine."""
    seen = _NewestAccess(fps)
    # the newest instruction of engine X that engine Y already waits for (transitively
    # through program order on Y): anything older on X needs no new dependency
    covered: dict[tuple[Engine, Engine], int] = {}
    out: list[dict[Engine, int]] = []
    for i, ins in enumerate(instrs):
        me = ins.engine
        reads, writes = seen.segments[i]
        deps: dict[Engine, int] = {}
        for other in (_L, _C, _S):
            if other == me:
                continue
            floor = covered.get((me, other), -1)
            if isinstance(ins, Finish):  # the end waits for everything
                j = seen.last[other]
            else:
                j = seen.newest_conflict(other, reads, writes)
            if j > floor:
                deps[other] = j
                covered[(me, other)] = j
        seen.record(i, me, reads, writes)
        out.append(deps)
    return out


class _Emitter:
    """Builds the output stream, pairing pushes and pops FIFO by FIFO."""

    def __init__(self) -> None:
        self.out: list[Instruction] = []
        self.flags: list[dict[str, bool]] = []
        self.new_index: dict[int, int] = {}
        # per (producer engine, consumer engine): newest producer (output index) popped
        self.popped: dict[tuple[Engine, Engine], int] = {}

    def emit(self, ins: Instruction, old_index: int | None = None) -> int:
        self.out.append(ins)
        self.flags.append({})
        k = len(self.out) - 1
        if old_index is not None:
            self.new_index[old_index] = k
        return k

    def wait(self, consumer: int, producer: int) -> None:
        """Make output instruction ``consumer`` wait for ``producer`` (neighbouring engines)."""
        pe, ce = self.out[producer].engine, self.out[consumer].engine
        if self.popped.get((pe, ce), -1) >= producer:
            return
        self.popped[(pe, ce)] = producer
        toward_consumer = "next" if ce > pe else "prev"
        toward_producer = "prev" if ce > pe else "next"
        self.flags[producer][f"push_{toward_consumer}"] = True
        self.flags[consumer][f"pop_{toward_producer}"] = True

    def result(self) -> list[Instruction]:
        res = []
        for ins, fl in zip(self.out, self.flags):
            d = ins.deps
            deps = Deps(d.pop_prev or fl.get("pop_prev", False),
                        d.pop_next or fl.get("pop_next", False),
                        d.push_prev or fl.get("push_prev", False),
                        d.push_next or fl.get("push_next", False))
            res.append(replace(ins, deps=deps) if deps != d else ins)
        return res


def insert_dependencies(instrs: list[Instruction], cfg: "HardwareConfig") -> list[Instruction]:
    """The program with the tokens (and relay SYNCs) its data dependencies need.

    Input instructions must carry no tokens of their own."""
    for i, ins in enumerate(instrs):
        if ins.deps.any():
            raise ValueError(f"instruction {i} already carries dependency tokens; "
                             f"insert_dependencies derives them all")
    fps = [footprint(ins, cfg) for ins in instrs]
    deps = _find_deps(instrs, fps)
    em = _Emitter()
    for i, ins in enumerate(instrs):
        me = ins.engine
        d = deps[i]
        far = {_L: _S, _S: _L}.get(me)
        relay = None
        if far is not None and far in d:
            # load <-> store: relay through a SYNC on the compute engine
            relay = em.emit(Sync(_C))  # follows any compute dependency in program order
            em.wait(relay, em.new_index[d[far]])
        k = em.emit(ins, i)
        if relay is not None:
            em.wait(k, relay)
        elif _C in d and me != _C:
            em.wait(k, em.new_index[d[_C]])
        if me == _C:
            for other in (_L, _S):
                if other in d:
                    em.wait(k, em.new_index[d[other]])
    return em.result()
