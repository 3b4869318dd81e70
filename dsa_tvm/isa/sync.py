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

from bisect import bisect_left
from copy import copy
from typing import TYPE_CHECKING

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
        cuts: dict[str, set[int]] = {}
        for fp in fps:
            for ranges in (fp.reads, fp.writes):
                for space, lo, hi in ranges:
                    c = cuts.get(space)
                    if c is None:
                        c = cuts[space] = set()
                    c.add(lo)
                    c.add(hi + 1)
        self.bounds = {space: sorted(c) for space, c in cuts.items()}
        self.reads = {e: {sp: [-1] * len(b) for sp, b in self.bounds.items()}
                      for e in (_L, _C, _S)}
        self.writes = {e: {sp: [-1] * len(b) for sp, b in self.bounds.items()}
                       for e in (_L, _C, _S)}
        self.last = {e: -1 for e in (_L, _C, _S)}

    def segments(self, ranges) -> list[tuple[str, int, int]]:
        """(space, first segment, end segment) of each range."""
        out = []
        for space, lo, hi in ranges:
            b = self.bounds[space]
            out.append((space, bisect_left(b, lo), bisect_left(b, hi + 1)))
        return out

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
        reads, writes = seen.segments(fps[i].reads), seen.segments(fps[i].writes)
        deps: dict[Engine, int] = {}
        for other in (_L, _C, _S):
            if other == me:
                continue
            floor = covered.get((me, other), -1)
            if isinstance(ins, Finish):  # the end waits for everything
                j = seen.last[other]
            else:
                j = seen.newest_conflict(other, reads, writes)
                if j > floor and me == _L and other == _S:
                    # a relay SYNC drains the compute engine up to this load: wait for
                    # every store so far at once, so that the loads after it (the next
                    # tiles of one layer, reading what older stores wrote) need none
                    j = seen.last[_S]
            if j > floor:
                deps[other] = j
                covered[(me, other)] = j
        seen.record(i, me, reads, writes)
        out.append(deps)
    return out


_POP_PREV, _POP_NEXT, _PUSH_PREV, _PUSH_NEXT = 1, 2, 4, 8
#: every combination of token flags (bits above), made once
_DEPS = [Deps(bool(f & _POP_PREV), bool(f & _POP_NEXT), bool(f & _PUSH_PREV),
              bool(f & _PUSH_NEXT)) for f in range(16)]


class _Emitter:
    """Builds the output stream, pairing pushes and pops FIFO by FIFO."""

    def __init__(self) -> None:
        self.out: list[Instruction] = []
        self.engines: list[Engine] = []
        self.flags: list[int] = []
        self.new_index: dict[int, int] = {}
        # per (producer engine, consumer engine): newest producer (output index) popped
        self.popped: dict[tuple[Engine, Engine], int] = {}

    def emit(self, ins: Instruction, engine: Engine, old_index: int | None = None) -> int:
        self.out.append(ins)
        self.engines.append(engine)
        self.flags.append(0)
        k = len(self.out) - 1
        if old_index is not None:
            self.new_index[old_index] = k
        return k

    def wait(self, consumer: int, producer: int) -> None:
        """Make output instruction ``consumer`` wait for ``producer`` (neighbouring engines)."""
        pe, ce = self.engines[producer], self.engines[consumer]
        if self.popped.get((pe, ce), -1) >= producer:
            return
        self.popped[(pe, ce)] = producer
        self.flags[producer] |= _PUSH_NEXT if ce > pe else _PUSH_PREV
        self.flags[consumer] |= _POP_PREV if ce > pe else _POP_NEXT

    def result(self) -> list[Instruction]:
        res = []
        for ins, f in zip(self.out, self.flags):
            if f:  # a copy with the tokens (fields as they are: no re-validation)
                ins = copy(ins)
                object.__setattr__(ins, "deps", _DEPS[f])
            res.append(ins)
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
            relay = em.emit(Sync(_C), _C)  # follows any compute dependency in program order
            em.wait(relay, em.new_index[d[far]])
        k = em.emit(ins, me, i)
        if relay is not None:
            em.wait(k, relay)
        elif _C in d and me != _C:
            em.wait(k, em.new_index[d[_C]])
        if me == _C:
            for other in (_L, _S):
                if other in d:
                    em.wait(k, em.new_index[d[other]])
    return em.result()
