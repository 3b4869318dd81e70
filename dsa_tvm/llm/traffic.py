"""Where a step's DRAM reads go: weights, the KV cache, activations.

Decode is bound by DRAM bandwidth, so the question users ask of a token is which bytes it
moved. Each DMA load of a launch is classified by the DRAM region it reads (the program's
own region table, nothing estimated): constants are ``weights`` (weights with their
requantize parameters and tables); region inputs that an attention matmul takes as its
second operand (``K^T``, ``V``, whether the host packed them or the region permutes them
on chip, directly or through the region's cache concat of the cache and the new rows) are
the ``kv`` cache; everything else (region inputs, spilled intermediates) is
``activations``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter

from ..isa.instructions import Load
from ..layers.ir import Add, BatchMatmul, Concat, Permute, Rescale, TilesAppend
from ..sim.timing import dma_bytes

KINDS = ("weights", "kv", "activations")


def _base(name: str) -> str:
    """A DRAM region's tensor: ``lv27>...tiles#colsum`` and ``lv46#params`` are lv27, lv46."""
    return name.split(">", 1)[0].split("#", 1)[0]


def cache_operands(region) -> set[str]:
    """The region inputs its attention matmuls read as the cache side (operand ``b``),
    back through the movements (Permute, Concat) that make that operand in the region and
    an int16 cache's byte-plane split (Rescale, Add: ``layers.plane_split``)."""
    made = {ly.output.name: ly for ly in region.layers
            if isinstance(ly, (Permute, Concat, TilesAppend, Rescale, Add))}
    todo = [_base(ly.b.name) for ly in region.layers if isinstance(ly, BatchMatmul)]
    out: set[str] = set()
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        ly = made.get(name)
        if isinstance(ly, Permute):
            todo.append(_base(ly.input.name))
        elif isinstance(ly, Concat):
            todo.extend(_base(t.name) for t in ly.inputs)
        elif isinstance(ly, TilesAppend):
            todo.extend(_base(t.name) for t in (ly.cache, ly.input))
        elif isinstance(ly, Rescale):
            todo.append(_base(ly.input.name))
        elif isinstance(ly, Add):
            todo.extend(_base(t.name) for t in (ly.a, ly.b))
    return out


def program_reads(prog, cfg, kv: set[str], resident: frozenset[int] = frozenset()) -> Counter:
    """DRAM bytes one program reads, by :data:`KINDS` (``kv``: its cache operands;
    ``resident``: loads that move nothing, a CIM part's programmed weights). A program's
    loads do not depend on the data: callers keep the answer per program."""
    spans = sorted((r.offset, r.offset + r.nbytes, r) for r in prog.regions)
    starts = [lo for lo, _, _ in spans]
    out: Counter = Counter({k: 0 for k in KINDS})
    for i, ins in enumerate(prog.instructions):
        if not isinstance(ins, Load) or i in resident:
            continue
        at = ins.dram_base * cfg.element_bytes(ins.buffer)
        i = bisect_right(starts, at) - 1
        owner = spans[i][2] if i >= 0 and at < spans[i][1] else None
        if owner is not None and owner.kind == "const":
            kind = "weights"
        elif owner is not None and owner.kind == "input" and _base(owner.name) in kv:
            kind = "kv"
        else:
            kind = "activations"
        out[kind] += dma_bytes(ins, cfg)
    return out


def read_split(launches: list, regions: dict[str, object],
               known: dict[tuple, Counter] | None = None) -> Counter:
    """DRAM bytes the launches read, by :data:`KINDS`; ``regions`` maps a program's name to
    its ``layers.ir.Region`` (the compile report's); ``known`` keeps each program's answer
    across calls (by compile and program name), so a decode loop classifies a program once."""
    known = {} if known is None else known
    out: Counter = Counter({k: 0 for k in KINDS})
    for launch in launches:
        key = (launch.compile_id, launch.program.name)
        if key not in known:
            region = regions.get(launch.program.name)
            cim = launch.result.cim
            known[key] = program_reads(launch.program, launch.result.config,
                                       cache_operands(region) if region is not None else set(),
                                       cim.resident_loads if cim is not None else frozenset())
        out.update(known[key])
    return out
