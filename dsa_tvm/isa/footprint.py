"""What an instruction touches: scratchpad rows and DRAM bytes, read and written.

Bounding ranges, known statically from the fields; used to validate programs,
to detect races in the simulator, and to derive dependency tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .instructions import Alu, Buffer, Gemm, Instruction, Load, Norm, Store, b_rows
from .norm_unit import param_rows, row_span

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

SRAM = ("inp", "wgt", "acc")
BUF_SRAM = {Buffer.INP: "inp", Buffer.WGT: "wgt", Buffer.ACC: "acc", Buffer.ACC8: "acc",
            Buffer.WGT4: "wgt", Buffer.WGTS: "wgt", Buffer.ACC16: "acc"}

Range = tuple[str, int, int]  # (space, first, last) inclusive; space is a scratchpad or "dram"


@dataclass(frozen=True)
class Footprint:
    """Rows (scratchpads) or bytes (``"dram"``) an instruction reads and writes."""

    reads: tuple[Range, ...] = ()
    writes: tuple[Range, ...] = ()


def dram_span(ins: Load | Store, cfg: "HardwareConfig") -> tuple[int, int]:
    """First and last DRAM byte a transfer touches."""
    unit = cfg.element_bytes(ins.buffer)
    first = ins.dram_base * unit
    end = (ins.dram_base + (ins.y_size - 1) * ins.x_stride + ins.x_size) * unit
    return first, end - 1


def footprint(ins: Instruction, cfg: "HardwareConfig | None" = None,
              block_out: int | None = None) -> Footprint:
    """Scratchpad ranges; with ``cfg``, DMA transfers also carry their DRAM byte range.
    An ALU LUT's table rows depend on the row width: ``cfg`` or ``block_out`` gives it."""
    if isinstance(ins, Load):
        dram = (("dram", *dram_span(ins, cfg)),) if cfg is not None else ()
        return Footprint(reads=dram, writes=((BUF_SRAM[ins.buffer], ins.sram_base,
                                              ins.sram_base + ins.rows_written - 1),))
    if isinstance(ins, Store):
        dram = (("dram", *dram_span(ins, cfg)),) if cfg is not None else ()
        return Footprint(reads=(("acc", ins.sram_base,
                                 ins.sram_base + ins.y_size * ins.x_size - 1),), writes=dram)
    if isinstance(ins, Gemm):
        acc, inp, wgt = ins.acc_base, ins.inp_base, ins.wgt_base
        for lp in ins.loops:
            if lp.extent > 1:
                e = lp.extent - 1
                acc += e * lp.acc
                inp += e * lp.inp
                wgt += e * lp.wgt
        return Footprint(reads=(("inp", ins.inp_base, inp), ("wgt", ins.wgt_base, wgt)),
                         writes=(("acc", ins.acc_base, acc),))
    if isinstance(ins, Alu):
        dst, a, b = ins.dst_base, ins.a_base, ins.b_base
        for lp in ins.loops:
            if lp.extent > 1:
                e = lp.extent - 1
                dst += e * lp.dst
                a += e * lp.a
                b += e * lp.b
        if ins.use_imm:
            reads: tuple[Range, ...] = (("acc", ins.a_base, a),)
        else:  # CLIP and REQUANT read parameter rows b + 1 (and b + 2) too
            lanes = cfg.block_out if cfg is not None else block_out
            reads = (("acc", ins.a_base, a),
                     ("acc", ins.b_base, b + b_rows(ins.op, lanes) - 1))
        return Footprint(reads=reads, writes=(("acc", ins.dst_base, dst),))
    if isinstance(ins, Norm):
        lanes = cfg.block_out if cfg is not None else block_out
        n = ins.rows * row_span(max(ins.length, 1), lanes)
        reads = (("acc", ins.src_base, ins.src_base + n - 1),
                 ("acc", ins.param_base,
                  ins.param_base + param_rows(ins.op, max(ins.length, 1), lanes) - 1))
        return Footprint(reads=reads, writes=(("acc", ins.dst_base, ins.dst_base + n - 1),))
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
