"""Readable listings of instructions and programs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .encoding import encode_instruction
from .instructions import Alu, AluOp, Deps, Finish, Gemm, Instruction, Load, Norm, Store, Sync
from .semantics import (
    REQUANT_IMM_RESERVED,
    requant_imm_is_wide,
    split_clip_imm,
    split_requant_imm,
)

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from .program import Program


def _deps(d: Deps) -> str:
    flags = [n for n, v in (("pop_prev", d.pop_prev), ("pop_next", d.pop_next),
                            ("push_prev", d.push_prev), ("push_next", d.push_next)) if v]
    return f"  [{' '.join(flags)}]" if flags else ""


def _loops(loops, names: tuple[str, ...]) -> str:
    live = [lp for lp in loops if lp.extent > 1] or [loops[-1]]
    parts = []
    for lp in live:
        strides = ",".join(f"{n}{getattr(lp, n)}" for n in names)
        parts.append(f"{lp.extent}:{strides}")
    return " x ".join(parts)


def disassemble_one(ins: Instruction) -> str:
    if isinstance(ins, Load):
        pads = (ins.pad_top, ins.pad_bottom, ins.pad_left, ins.pad_right)
        pad = f" pad(t{pads[0]} b{pads[1]} l{pads[2]} r{pads[3]})={ins.pad_value}" if any(
            pads) else ""
        text = (f"LOAD   {ins.buffer.name:<4} sram[{ins.sram_base}] <- dram[{ins.dram_base}] "
                f"{ins.y_size}x{ins.x_size} stride {ins.x_stride}{pad}"
                f"{' prefetch' if ins.prefetch else ''}")
    elif isinstance(ins, Store):
        text = (f"STORE  {ins.buffer.name:<4} sram[{ins.sram_base}] -> dram[{ins.dram_base}] "
                f"{ins.y_size}x{ins.x_size} stride {ins.x_stride}")
    elif isinstance(ins, Gemm):
        text = (f"GEMM   acc[{ins.acc_base}] {'=' if ins.reset else '+='} inp[{ins.inp_base}] . "
                f"wgt[{ins.wgt_base}]  loops {_loops(ins.loops, ('acc', 'inp', 'wgt'))}")
    elif isinstance(ins, Alu):
        if ins.op == AluOp.REQUANT:
            b = ins.b_base
            try:
                zp, lo, hi = split_requant_imm(ins.imm)
                wide = " wide" if requant_imm_is_wide(ins.imm) else ""
                stage = f"zp {zp}, clamp{wide} [{lo}, {hi}]"
            except ValueError:
                why = ("bits 25-31 set" if ins.imm & REQUANT_IMM_RESERVED
                       else "wide with bits 8-23 set")
                stage = f"imm {ins.imm & 0xFFFFFFFF:#010x} (invalid: {why})"
            src = (f"acc[{ins.a_base}] + bias acc[{b}], mult acc[{b + 1}], "
                   f"shift acc[{b + 2}], {stage}")
        elif ins.op == AluOp.LUT:
            src = f"table acc[{ins.b_base}...][acc[{ins.a_base}]]"
        elif ins.use_imm:
            imm = ins.imm
            if ins.op == AluOp.CLIP:
                lo, hi = split_clip_imm(imm)
                imm = f"[{lo}, {hi}]"
            src = f"acc[{ins.a_base}], #{imm}"
        else:
            src = f"acc[{ins.a_base}], acc[{ins.b_base}]"
        text = (f"ALU    {ins.op.name:<7} acc[{ins.dst_base}] <- {src}  loops "
                f"{_loops(ins.loops, ('dst', 'a', 'b'))}")
    elif isinstance(ins, Norm):
        text = (f"NORM   {ins.op.name:<9} acc[{ins.dst_base}] <- acc[{ins.src_base}] "
                f"{ins.rows} rows x {ins.length}{' int16' if ins.in_wide else ''}, "
                f"{'int16 out, ' if ins.out_wide else ''}in_zp {ins.in_zp}, "
                f"params acc[{ins.param_base}...]")
    elif isinstance(ins, Sync):
        text = f"SYNC   {ins.on.name.lower()}"
    elif isinstance(ins, Finish):
        text = "FINISH"
    else:
        raise TypeError(f"not an instruction: {ins!r}")
    return text + _deps(ins.deps)


def disassemble(program: "Program", cfg: "HardwareConfig | None" = None,
                with_words: bool = False) -> str:
    """A listing: DRAM regions, then one numbered line per instruction."""
    lines = [f"; program '{program.name}'  ({len(program.instructions)} instructions, "
             f"{program.instruction_bits}-bit words, fingerprint {program.fingerprint.hex()})"]
    for r in program.regions:
        lines.append(f"; dram {r.kind:<7} {r.name:<12} @ {r.offset:>10}  {r.dtype}"
                     f"{list(r.shape)}  ({r.nbytes} bytes)")
    width = len(str(len(program.instructions)))
    if with_words:
        if cfg is None:
            raise ValueError("with_words needs the hardware config")
    for i, ins in enumerate(program.instructions):
        word = ""
        if with_words:
            word = f"{encode_instruction(ins, cfg, i):0{program.instruction_bits // 4}x}  "
        lines.append(f"{i:>{width}}  {word}{disassemble_one(ins)}")
    return "\n".join(lines)
