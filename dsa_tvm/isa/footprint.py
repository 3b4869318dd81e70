"""What an instruction touches: scratchpad rows and DRAM bytes, read and written.

Bounding ranges, known statically from the fields; used to validate programs,
to detect races in the simulator, and to derive dependency tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .instructions import PAIRED_B_OPS, Alu, Buffer, Gemm, Instruction, Load, Store

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

SRAM = ("inp", "wgt", "acc")
BUF_SRAM = {Buffer.INP: "inp", Buffer.WGT: "wgt", Buffer.ACC: "acc", Buffer.ACC8: "acc"}

Range = tuple[str, int, int]  # (space, first, last) inclusive; space is a scratchpad or "dram"


@dataclass(frozen=True)
class Footprint:
    """Rows (scratchpads) or bytes (``"dram"``) an instruction reads and writes."""

    reads: tuple[Range, ...] = ()
    writes: tuple[Range, ...] = ()


def _span(base: int, loops, attr: str) -> tuple[int, int]:
    hi = base + sum((lp.extent - 1) * getattr(lp, attr) for lp in loops)
    return base, hi


def dram_span(ins: Load | Store, cfg: "HardwareConfig") -> tuple[int, int]:
    """First and last DRAM byte a transfer touches."""
    unit = cfg.element_bytes(ins.buffer)
    first = ins.dram_base * unit
    end = (ins.dram_base + (ins.y_size - 1) * ins.x_stride + ins.x_size) * unit
    return first, end - 1


def footprint(ins: Instruction, cfg: "HardwareConfig | None" = None) -> Footprint:
    """Scratchpad ranges; with ``cfg``, DMA transfers also carry their DRAM byte range."""
    if isinstance(ins, Load):
        dram = (("dram", *dram_span(ins, cfg)),) if cfg is not None else ()
        return Footprint(reads=dram, writes=((BUF_SRAM[ins.buffer], ins.sram_base,
                                              ins.sram_base + ins.rows_written - 1),))
    if isinstance(ins, Store):
        dram = (("dram", *dram_span(ins, cfg)),) if cfg is not None else ()
        return Footprint(reads=(("acc", ins.sram_base,
                                 ins.sram_base + ins.y_size * ins.x_size - 1),), writes=dram)
    if isinstance(ins, Gemm):
        return Footprint(reads=(("inp", *_span(ins.inp_base, ins.loops, "inp")),
                                ("wgt", *_span(ins.wgt_base, ins.loops, "wgt"))),
                         writes=(("acc", *_span(ins.acc_base, ins.loops, "acc")),))
    if isinstance(ins, Alu):
        reads = [("acc", *_span(ins.a_base, ins.loops, "a"))]
        if not ins.use_imm:
            lo, hi = _span(ins.b_base, ins.loops, "b")
            reads.append(("acc", lo, hi + (1 if ins.op in PAIRED_B_OPS else 0)))
        return Footprint(reads=tuple(reads), writes=(("acc", *_span(ins.dst_base, ins.loops,
                                                                    "dst")),))
    return Footprint()


def _overlap(a: tuple[Range, ...], b: tuple[Range, ...]) -> bool:
    for s1, lo1, hi1 in a:
        for s2, lo2, hi2 in b:
            if s1 == s2 and lo1 <= hi2 and lo2 <= hi1:
                return True
    return False


def conflicts(first: Footprint, later: Footprint) -> bool:
    """True if ``later`` must wait for ``first``: read-after-write, write-after-read or
    write-after-write on overlapping rows or bytes."""
    return (_overlap(first.writes, later.reads) or _overlap(first.reads, later.writes)
            or _overlap(first.writes, later.writes))
