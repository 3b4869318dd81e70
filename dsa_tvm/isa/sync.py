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

from .footprint import Footprint, conflicts, footprint
from .instructions import Deps, Engine, Finish, Instruction, Sync

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

_L, _C, _S = Engine.LOAD, Engine.COMPUTE, Engine.STORE


class _History:
    """One engine's instructions in program order, in blocks that carry the union of
    their footprints, so a search for the newest conflicting instruction skips whole
    blocks that cannot conflict (the answer is the same as a plain backward scan)."""

    BLOCK = 32

    def __init__(self) -> None:
        self.idx: list[int] = []
        self.agg: list[tuple[dict[str, list[int]], dict[str, list[int]]]] = []

    def add(self, i: int, fp: Footprint) -> None:
        if len(self.idx) % self.BLOCK == 0:
            self.agg.append(({}, {}))
        self.idx.append(i)
        for part, ranges in zip(self.agg[-1], (fp.reads, fp.writes)):
            for space, lo, hi in ranges:
                cur = part.get(space)
                if cur is None:
                    part[space] = [lo, hi]
                else:
                    cur[0], cur[1] = min(cur[0], lo), max(cur[1], hi)

    def last(self) -> int | None:
        return self.idx[-1] if self.idx else None

    def newest_conflict(self, fp: Footprint, floor: int, fps: list[Footprint]) -> int | None:
        for b in range(len(self.agg) - 1, -1, -1):
            start = b * self.BLOCK
            end = min(start + self.BLOCK, len(self.idx))
            if self.idx[end - 1] <= floor:
                return None
            reads, writes = self.agg[b]
            agg = Footprint(tuple((s, r[0], r[1]) for s, r in reads.items()),
                            tuple((s, r[0], r[1]) for s, r in writes.items()))
            if not conflicts(agg, fp):
                continue
            for k in range(end - 1, start - 1, -1):
                j = self.idx[k]
                if j <= floor:
                    return None
                if conflicts(fps[j], fp):
                    return j
        return None


def _find_deps(instrs: list[Instruction], fps: list[Footprint]) -> list[dict[Engine, int]]:
    """For each instruction, the latest conflicting earlier instruction per other engine."""
    recent = {_L: _History(), _C: _History(), _S: _History()}
    # the newest instruction of engine X that engine Y already waits for (transitively
    # through program order on Y): anything older on X needs no new dependency
    covered: dict[tuple[Engine, Engine], int] = {}
    out: list[dict[Engine, int]] = []
    for i, ins in enumerate(instrs):
        me = ins.engine
        deps: dict[Engine, int] = {}
        for other in (_L, _C, _S):
            if other == me:
                continue
            floor = covered.get((me, other), -1)
            if isinstance(ins, Finish):  # the end waits for everything
                last = recent[other].last()
                if last is not None and last > floor:
                    deps[other] = last
                continue
            j = recent[other].newest_conflict(fps[i], floor, fps)
            if j is not None:
                deps[other] = j
        for other, j in deps.items():
            covered[(me, other)] = max(covered.get((me, other), -1), j)
        recent[me].add(i, fps[i])
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
