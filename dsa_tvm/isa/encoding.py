"""Encode instructions to fixed-width words and decode them back, exactly.

Every field is range-checked on encode against the width its format gives it
for this config; a word that is not a valid instruction fails to decode. Both
errors name the instruction index and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

from .formats import FORMATS, Format
from .instructions import (
    ALU_LEVELS,
    GEMM_LEVELS,
    Alu,
    AluLoop,
    AluOp,
    Buffer,
    Deps,
    Engine,
    Finish,
    Gemm,
    GemmLoop,
    Instruction,
    Load,
    Opcode,
    Store,
    Sync,
)

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig


class IsaError(ValueError):
    """An instruction that cannot be encoded or a word that cannot be decoded."""

    def __init__(self, index: int | None, message: str):
        self.index = index
        where = f"instruction {index}: " if index is not None else ""
        super().__init__(where + message)


class EncodeError(IsaError):
    pass


class DecodeError(IsaError):
    pass


#: field names of each loop level, outermost first
_GEMM_KEYS = tuple((f"ext{k}", f"acc_stride{k}", f"inp_stride{k}", f"wgt_stride{k}")
                   for k in range(GEMM_LEVELS))
_ALU_KEYS = tuple((f"ext{k}", f"dst_stride{k}", f"a_stride{k}", f"b_stride{k}")
                  for k in range(ALU_LEVELS))


def _dep_fields(d: Deps) -> dict[str, int]:
    return {"pop_prev": int(d.pop_prev), "pop_next": int(d.pop_next),
            "push_prev": int(d.push_prev), "push_next": int(d.push_next)}


def to_fields(ins: Instruction) -> dict[str, int]:
    """Flatten an instruction into its format's named integer fields."""
    if not isinstance(ins, (Load, Store, Gemm, Alu, Sync, Finish)):
        raise EncodeError(None, f"not an instruction: {ins!r}")
    f: dict[str, int] = {"opcode": int(ins.opcode), **_dep_fields(ins.deps)}
    if isinstance(ins, (Load, Store)):
        f.update(buffer=int(ins.buffer), sram_base=ins.sram_base, dram_base=ins.dram_base,
                 y_size=ins.y_size, x_size=ins.x_size, x_stride=ins.x_stride)
        if isinstance(ins, Load):
            f.update(pad_top=ins.pad_top, pad_bottom=ins.pad_bottom, pad_left=ins.pad_left,
                     pad_right=ins.pad_right, pad_value=ins.pad_value,
                     prefetch=int(ins.prefetch))
    elif isinstance(ins, Gemm):
        f.update(reset=int(ins.reset), acc_base=ins.acc_base, inp_base=ins.inp_base,
                 wgt_base=ins.wgt_base)
        for (e, a, i, w), lp in zip(_GEMM_KEYS, ins.loops):
            f[e], f[a], f[i], f[w] = lp.extent, lp.acc, lp.inp, lp.wgt
    elif isinstance(ins, Alu):
        f.update(alu_op=int(ins.op), use_imm=int(ins.use_imm), dst_base=ins.dst_base,
                 a_base=ins.a_base, b_base=ins.b_base, imm=ins.imm)
        for (e, d, a, b), lp in zip(_ALU_KEYS, ins.loops):
            f[e], f[d], f[a], f[b] = lp.extent, lp.dst, lp.a, lp.b
    elif isinstance(ins, Sync):
        f["engine"] = int(ins.on)
    return f


def _enum(index: int, enum_cls, value: int, field: str):
    try:
        return enum_cls(value)
    except ValueError:
        raise DecodeError(index, f"field '{field}' = {value} is not a valid "
                                 f"{enum_cls.__name__}") from None


def from_fields(f: dict[str, int], index: int = 0) -> Instruction:
    """Rebuild an instruction from its named fields (inverse of :func:`to_fields`)."""
    deps = Deps(bool(f["pop_prev"]), bool(f["pop_next"]), bool(f["push_prev"]),
                bool(f["push_next"]))
    op = _enum(index, Opcode, f["opcode"], "opcode")
    if op in (Opcode.LOAD, Opcode.STORE):
        common = dict(buffer=_enum(index, Buffer, f["buffer"], "buffer"), sram_base=f["sram_base"],
                      dram_base=f["dram_base"], y_size=f["y_size"], x_size=f["x_size"],
                      x_stride=f["x_stride"], deps=deps)
        if op == Opcode.STORE:
            return Store(**common)
        return Load(**common, pad_top=f["pad_top"], pad_bottom=f["pad_bottom"],
                    pad_left=f["pad_left"], pad_right=f["pad_right"], pad_value=f["pad_value"],
                    prefetch=bool(f["prefetch"]))
    if op == Opcode.GEMM:
        loops = tuple(GemmLoop(f[e], f[a], f[i], f[w]) for e, a, i, w in _GEMM_KEYS)
        return Gemm(acc_base=f["acc_base"], inp_base=f["inp_base"], wgt_base=f["wgt_base"],
                    loops=loops, reset=bool(f["reset"]), deps=deps)
    if op == Opcode.ALU:
        loops = tuple(AluLoop(f[e], f[d], f[a], f[b]) for e, d, a, b in _ALU_KEYS)
        return Alu(op=_enum(index, AluOp, f["alu_op"], "alu_op"), dst_base=f["dst_base"],
                   a_base=f["a_base"], b_base=f["b_base"], loops=loops,
                   use_imm=bool(f["use_imm"]), imm=f["imm"], deps=deps)
    if op == Opcode.SYNC:
        return Sync(on=_enum(index, Engine, f["engine"], "engine"), deps=deps)
    return Finish(deps=deps)


def _range(width: int, signed: bool) -> tuple[int, int]:
    if signed:
        return -(1 << (width - 1)), (1 << (width - 1)) - 1
    return 0, (1 << width) - 1


@lru_cache(maxsize=64)
def _layout(opcode: Opcode, cfg: "HardwareConfig") -> tuple[tuple[str, int, int, int, int,
                                                                  bool], ...]:
    """(name, offset, width, lo, hi, signed) of every field of a format, for this config."""
    fmt: Format = FORMATS[opcode]
    return tuple((fd.name, off, w, *_range(w, fd.signed), fd.signed)
                 for fd, off, w in fmt.widths(cfg))


def check_fields(ins: Instruction, cfg: "HardwareConfig", index: int = 0) -> dict[str, int]:
    """The instruction's fields, each checked against its width; EncodeError otherwise."""
    try:
        fields = to_fields(ins)
    except EncodeError as e:
        raise EncodeError(index, str(e)) from None
    for name, _off, width, lo, hi, signed in _layout(ins.opcode, cfg):
        v = fields[name]
        if not lo <= v <= hi:
            raise EncodeError(index, f"{ins.opcode.name} field '{name}' = {v} does not fit "
                                     f"in {width} {'signed ' if signed else ''}bits "
                                     f"(range {lo}..{hi})")
    return fields


def encode_instruction(ins: Instruction, cfg: "HardwareConfig", index: int = 0) -> int:
    """One instruction as an integer of ``cfg.instruction_bits`` bits."""
    fields = check_fields(ins, cfg, index)
    word = 0
    for name, off, width, _lo, _hi, _signed in _layout(ins.opcode, cfg):
        word |= (fields[name] & ((1 << width) - 1)) << off
    return word


def decode_instruction(word: int, cfg: "HardwareConfig", index: int = 0) -> Instruction:
    opcode = word & 0b111
    if opcode not in FORMATS:
        raise DecodeError(index, f"malformed word: opcode {opcode} is not an instruction")
    op = Opcode(opcode)
    fields: dict[str, int] = {}
    end = 0
    for name, off, width, _lo, _hi, signed in _layout(op, cfg):
        v = (word >> off) & ((1 << width) - 1)
        if signed and v >> (width - 1):
            v -= 1 << width
        fields[name] = v
        end = off + width
    if word >> end:
        raise DecodeError(index, f"malformed {op.name} word: bits above bit {end - 1} "
                                 f"(unused by the format) are set")
    return from_fields(fields, index)


def encode_program_words(instrs: Iterable[Instruction], cfg: "HardwareConfig") -> bytes:
    nbytes = cfg.instruction_bits // 8
    return b"".join(encode_instruction(ins, cfg, i).to_bytes(nbytes, "little")
                    for i, ins in enumerate(instrs))


def decode_program_words(data: bytes, cfg: "HardwareConfig") -> list[Instruction]:
    nbytes = cfg.instruction_bits // 8
    if len(data) % nbytes:
        raise DecodeError(None, f"instruction stream of {len(data)} bytes is not a whole number "
                                f"of {nbytes}-byte words")
    return [decode_instruction(int.from_bytes(data[i:i + nbytes], "little"), cfg, i // nbytes)
            for i in range(0, len(data), nbytes)]
