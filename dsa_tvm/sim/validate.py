"""Static checks of a program against a config, before anything runs.

Every address a loop nest or DMA transfer can reach is known from its fields,
so out-of-range scratchpad or DRAM accesses, illegal token flags, empty loops,
malformed immediates and nests too large to count are rejected up front with the
instruction index and the reason; an instruction object that appears several times
(a decoded program shares one object among equal words) is checked once. The encoder's field-width
checks run only for programs that do not already vouch for them (see
``Program.mark_fields_checked``: decoded, encoded and builder-made programs do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..isa.encoding import EncodeError, check_fields
from ..isa.footprint import Footprint, footprint
from ..isa.instructions import (
    ACC_BUFFERS,
    TENSOR_ONLY_OPS,
    Alu,
    AluOp,
    Buffer,
    Engine,
    Finish,
    Gemm,
    Instruction,
    Load,
    Norm,
    Store,
)
from ..isa.intnorm import MAX_ROW
from ..isa.semantics import REQUANT_IMM_RESERVED, REQUANT_WIDE, split_requant_imm
from .errors import SimulationError
from .limits import check_cycle_total, check_nest_points
from .sparse_check import check_sparse

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

#: REQUANT immediate bits past the int8 fields: a reserved one, or the wide bit (whose
#: immediate must leave lo and hi zero)
REQUANT_IMM_CHECKED = REQUANT_IMM_RESERVED | REQUANT_WIDE


def _check_requant_imm(i: int, ins: Alu) -> None:
    """A REQUANT immediate with a reserved bit (25-31) set, or wide (bit 24) with clamp
    bounds in bits 8-23, is not an instruction the ALU runs."""
    imm = ins.imm & 0xFFFFFFFF
    if imm & REQUANT_IMM_RESERVED:
        raise SimulationError(i, f"ALU REQUANT immediate {imm:#010x} has bits 25-31 set; they "
                                 f"must be zero (zero point, lo and hi occupy bits 0-23, the "
                                 f"wide flag bit 24)")
    try:
        split_requant_imm(imm)
    except ValueError:
        raise SimulationError(i, f"ALU REQUANT immediate {imm:#010x} is wide (bit 24) with "
                                 f"bits 8-23 set; a wide REQUANT clamps to int16 and its lo, "
                                 f"hi bytes must be zero") from None


def _check_tokens(i: int, ins: Instruction) -> None:
    d = ins.deps
    eng = ins.engine
    if eng == Engine.LOAD and (d.pop_prev or d.push_prev):
        raise SimulationError(i, f"{ins.opcode.name} runs on the load engine, which has no "
                                 f"previous engine: pop_prev/push_prev are not allowed")
    if eng == Engine.STORE and (d.pop_next or d.push_next):
        raise SimulationError(i, f"{ins.opcode.name} runs on the store engine, which has no "
                                 f"next engine: pop_next/push_next are not allowed")


def _check_dram(i: int, ins: Load | Store, cfg: "HardwareConfig",
                bounds: list[tuple[int, int, str, str]]) -> None:
    unit = cfg.element_bytes(ins.buffer)
    first = ins.dram_base * unit
    end = (ins.dram_base + (ins.y_size - 1) * ins.x_stride + ins.x_size) * unit
    for lo, hi, kind, name in bounds:
        if lo <= first and end <= hi:
            if isinstance(ins, Store) and kind == "const":
                raise SimulationError(i, f"STORE writes into constant DRAM region '{name}'")
            return
    known = ", ".join(f"{name}=[{lo}, {hi})" for lo, hi, _, name in bounds)
    raise SimulationError(i, f"{ins.opcode.name} touches DRAM bytes [{first}, {end}), which is "
                             f"outside every DRAM region of the program ({known or 'none'})")


def _check_lut(i: int, ins: Alu, cfg: "HardwareConfig") -> None:
    """LUT needs the table unit and reads one table for the whole nest."""
    if not cfg.table_present:
        raise SimulationError(i, f"ALU LUT needs the activation table unit; hardware "
                                 f"'{cfg.name}' has none ([table] table_unit = 0)")
    if any(lp.b for lp in ins.loops if lp.extent > 1):
        raise SimulationError(i, "ALU LUT reads one table per instruction: every b stride "
                                 "must be 0")


def _check_norm(i: int, ins: Norm, cfg: "HardwareConfig") -> None:
    """NORM needs the [norm] units, a row length they take and a destination that is the
    source (in place) or apart from it."""
    if cfg.norm_units < 1:
        raise SimulationError(i, f"NORM {ins.op.name} needs the [norm] units; hardware "
                                 f"'{cfg.name}' has none ([norm] norm_units = 0): give the "
                                 f"description norm_units >= 1 or run the op on the CPU")
    if ins.rows < 1:
        raise SimulationError(i, f"NORM normalizes no rows (rows = {ins.rows}); rows must be >= 1")
    if not 1 <= ins.length <= MAX_ROW:
        raise SimulationError(i, f"NORM row length {ins.length} is outside 1..{MAX_ROW}")
    span = ins.rows * -(-ins.length // cfg.block_out)
    if ins.dst_base != ins.src_base and abs(ins.dst_base - ins.src_base) < span:
        raise SimulationError(i, f"NORM destination rows {ins.dst_base}.. overlap its source "
                                 f"rows {ins.src_base}..{ins.src_base + span - 1}; write in "
                                 f"place (dst_base = src_base) or to disjoint rows")


def validate_program(program: "Program", cfg: "HardwareConfig") -> list[Footprint]:
    """Raise SimulationError on the first bad instruction (ProgramError for a bad DRAM
    layout); return every footprint."""
    program.check_config(cfg)
    program.check_layout(cfg)
    ins_list = program.instructions
    if not ins_list or not isinstance(ins_list[-1], Finish):
        raise SimulationError(len(ins_list) - 1 if ins_list else None,
                              "program does not end with FINISH")
    check_cycle_total(program)
    check_sparse(ins_list, cfg)
    check = not program.fields_checked(cfg)
    fps = []
    bounds = [(r.offset, r.offset + r.nbytes, r.kind, r.name) for r in program.regions]
    depths = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth}
    last = len(ins_list) - 1
    done: dict[int, Footprint] = {}  # id -> footprint of an instruction object checked already
    for i, ins in enumerate(ins_list):
        fp = done.get(id(ins))
        if fp is not None and not isinstance(ins, Finish):  # the same object, checked above
            fps.append(fp)
            continue
        d = ins.deps
        if d.pop_prev or d.push_prev or d.pop_next or d.push_next:
            _check_tokens(i, ins)
        if isinstance(ins, Finish) and i != last:
            raise SimulationError(i, "FINISH before the end of the program")
        if isinstance(ins, (Load, Store)):
            name = ins.opcode.name
            if ins.y_size < 1 or ins.x_size < 1:
                raise SimulationError(i, f"{name} moves nothing (y_size={ins.y_size}, "
                                         f"x_size={ins.x_size}); both must be >= 1")
            if isinstance(ins, Store) and ins.buffer not in ACC_BUFFERS:
                raise SimulationError(i, f"STORE reads the accumulator only (buffer ACC, ACC8 or "
                                         f"ACC16), got {ins.buffer.name}")
            if ins.buffer == Buffer.WGT4 and not cfg.int4_weights:
                raise SimulationError(i, f"LOAD WGT4 reads int4 weights, which hardware "
                                         f"'{cfg.name}' cannot unpack ([dram] int4_weights = "
                                         f"false); compile for this description")
            _check_dram(i, ins, cfg, bounds)
        if isinstance(ins, (Gemm, Alu)):
            for k, lp in enumerate(ins.loops):
                if lp.extent < 1:
                    raise SimulationError(i, f"{ins.opcode.name} loop level {k} has extent "
                                             f"{lp.extent}; extents must be >= 1")
            check_nest_points(i, ins)
        if isinstance(ins, Alu):
            if ins.use_imm and ins.op in TENSOR_ONLY_OPS:
                raise SimulationError(i, f"ALU {ins.op.name} reads per-lane parameters from the "
                                         f"accumulator; the immediate form is not allowed")
            if ins.op == AluOp.LUT:
                _check_lut(i, ins, cfg)
            if ins.op == AluOp.REQUANT and ins.imm & REQUANT_IMM_CHECKED:
                _check_requant_imm(i, ins)
        if isinstance(ins, Norm):
            _check_norm(i, ins, cfg)
        fp = footprint(ins, block_out=cfg.block_out)
        for what, ranges in (("reads", fp.reads), ("writes", fp.writes)):
            for sram, lo, hi in ranges:
                depth = depths[sram]
                if lo < 0 or hi >= depth:
                    name = ins.opcode.name
                    if lo < 0:
                        raise SimulationError(i, f"{name} {what} {sram.upper()} rows "
                                                 f"{lo}..{hi}: negative scratchpad row")
                    raise SimulationError(i, f"{name} {what} {sram.upper()} rows {lo}..{hi}, "
                                             f"past the end of the {depth}-row {sram.upper()} "
                                             f"scratchpad (scratchpad overflow)")
        if check:  # never encoded nor checked: apply the encoder's field checks
            try:
                check_fields(ins, cfg, i)
            except EncodeError as e:
                raise SimulationError(i, str(e).split(": ", 1)[-1]) from None
        fps.append(fp)
        done[id(ins)] = fp
    if check:
        program.mark_fields_checked(cfg)
    return fps
