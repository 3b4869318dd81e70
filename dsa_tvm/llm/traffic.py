"""Where a step's DRAM reads go: weights, the KV cache, activations.

Decode is bound by DRAM bandwidth, so the question users ask of a token is which bytes it
moved. Each DMA load of a launch is classified by the DRAM region it reads (the program's
own region table, nothing estimated): constants are ``weights`` (weights with their
requantize parameters and tables); region inputs that an attention matmul takes as its
second operand (``K^T``, ``V``, whether the host packed them or the region permutes them
on chip) are the ``kv`` cache; everything else (region inputs, spilled intermediates) is
``activations``.
"""

from __future__ import annotations

from collections import Counter

from ..isa.instructions import Load
from ..layers.ir import BatchMatmul
from ..sim.timing import dma_bytes

KINDS = ("weights", "kv", "activations")


def _base(name: str) -> str:
    """A DRAM region's tensor: ``lv27>...tiles#colsum`` and ``lv46#params`` are lv27, lv46."""
    return name.split(">", 1)[0].split("#", 1)[0]


def cache_operands(region) -> set[str]:
    """The region inputs its attention matmuls read as the cache side (operand ``b``)."""
    return {_base(ly.b.name) for ly in region.layers if isinstance(ly, BatchMatmul)}


def read_split(launches: list, regions: dict[str, object]) -> Counter:
    """DRAM bytes the launches read, by :data:`KINDS`; ``regions`` maps a program's name to
    its ``layers.ir.Region`` (the compile report's)."""
    out: Counter = Counter({k: 0 for k in KINDS})
    for launch in launches:
        prog, cfg = launch.program, launch.result.config
        region = regions.get(prog.name)
        kv = cache_operands(region) if region is not None else set()
        spans = sorted((r.offset, r.offset + r.nbytes, r) for r in prog.regions)
        for ins in prog.instructions:
            if not isinstance(ins, Load):
                continue
            at = ins.dram_base * cfg.element_bytes(ins.buffer)
            owner = next((r for lo, hi, r in spans if lo <= at < hi), None)
            if owner is None:
                kind = "activations"
            elif owner.kind == "const":
                kind = "weights"
            elif owner.kind == "input" and _base(owner.name) in kv:
                kind = "kv"
            else:
                kind = "activations"
            out[kind] += dma_bytes(ins, cfg)
    return out
