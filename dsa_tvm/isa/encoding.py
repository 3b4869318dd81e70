"""Encode instructions to fixed-width words and decode them back, exactly.

Every field is range-checked on encode against the width its format gives it
for this config; a word that is not a valid instruction fails to decode. Both
errors name the instruction index and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

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
    Norm,
    NormOp,
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


def _field_getter(name: str):
    """``instruction -> int`` for one named field of its format (``formats.FORMATS``)."""
    if name == "opcode":
        return lambda ins: int(ins.opcode)
    if name in ("pop_prev", "pop_next", "push_prev", "push_next"):
        return lambda ins: int(getattr(ins.deps, name))
    if name[-1].isdigit():  # a loop level's field: ext0, acc_stride1, ...
        attr, k = name[:-1], int(name[-1])
        attr = {"ext": "extent", "acc_stride": "acc", "inp_stride": "inp", "wgt_stride": "wgt",
                "dst_stride": "dst", "a_stride": "a", "b_stride": "b"}[attr]
        return lambda ins: getattr(ins.loops[k], attr)
    attr = {"alu_op": "op", "norm_op": "op", "engine": "on"}.get(name, name)
    return lambda ins: int(getattr(ins, attr))


@lru_cache(maxsize=64)
def _packer(opcode: Opcode, cfg: "HardwareConfig") -> tuple:
    """(name, getter, offset, mask, lo, hi, width, signed) of every field, in word order."""
    return tuple((name, _field_getter(name), off, (1 << width) - 1, lo, hi, width, signed)
                 for name, off, width, lo, hi, signed in _layout(opcode, cfg))


def _range_error(ins: Instruction, index: int, name: str, v: int, width: int, lo: int, hi: int,
                 signed: bool) -> EncodeError:
    return EncodeError(index, f"{ins.opcode.name} field '{name}' = {v} does not fit "
                              f"in {width} {'signed ' if signed else ''}bits "
                              f"(range {lo}..{hi})")


_MEMBERS: dict[type, dict[int, object]] = {}


def _enum(index: int, enum_cls, value: int, field: str):
    members = _MEMBERS.get(enum_cls)
    if members is None:
        members = _MEMBERS[enum_cls] = {int(m.value): m for m in enum_cls}
    try:
        return members[value]
    except KeyError:
        raise DecodeError(index, f"field '{field}' = {value} is not a valid "
                                 f"{enum_cls.__name__}") from None


def from_fields(f: dict[str, int], index: int = 0) -> Instruction:
    """Rebuild an instruction from its named fields (what :func:`decode_instruction` reads)."""
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
                    loops=loops, reset=bool(f["reset"]), sparse=bool(f["sparse"]), deps=deps)
    if op == Opcode.ALU:
        loops = tuple(AluLoop(f[e], f[d], f[a], f[b]) for e, d, a, b in _ALU_KEYS)
        return Alu(op=_enum(index, AluOp, f["alu_op"], "alu_op"), dst_base=f["dst_base"],
                   a_base=f["a_base"], b_base=f["b_base"], loops=loops,
                   use_imm=bool(f["use_imm"]), imm=f["imm"], deps=deps)
    if op == Opcode.SYNC:
        return Sync(on=_enum(index, Engine, f["engine"], "engine"), deps=deps)
    if op == Opcode.NORM:
        return Norm(op=_enum(index, NormOp, f["norm_op"], "norm_op"), dst_base=f["dst_base"],
                    src_base=f["src_base"], param_base=f["param_base"], rows=f["rows"],
                    length=f["length"], in_zp=f["in_zp"], in_wide=bool(f["in_wide"]),
                    deps=deps, out_wide=bool(f["out_wide"]))
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


def check_fields(ins: Instruction, cfg: "HardwareConfig", index: int = 0) -> None:
    """EncodeError unless every field of the instruction fits its width."""
    encode_instruction(ins, cfg, index)


def encode_instruction(ins: Instruction, cfg: "HardwareConfig", index: int = 0,
                       checked: bool = False) -> int:
    """One instruction as an integer of ``cfg.instruction_bits`` bits (``checked``: the
    fields are known to fit, skip the range checks)."""
    if not isinstance(ins, (Load, Store, Gemm, Alu, Sync, Finish, Norm)):
        raise EncodeError(index, f"not an instruction: {ins!r}")
    word = 0
    for name, get, off, mask, lo, hi, width, signed in _packer(ins.opcode, cfg):
        v = get(ins)
        if not checked and not lo <= v <= hi:
            raise _range_error(ins, index, name, v, width, lo, hi, signed)
        word |= (v & mask) << off
    return word


def decode_instruction(word: int, cfg: "HardwareConfig", index: int = 0) -> Instruction:
    opcode = word & 0b111
    if opcode not in FORMATS:
        raise DecodeError(index, f"malformed word: opcode {opcode} is not an instruction")
    op = Opcode(opcode)
    fields: dict[str, int] = {}
    end = 0
    for name, _get, off, mask, _lo, _hi, width, signed in _packer(op, cfg):
        v = (word >> off) & mask
        if signed and v >> (width - 1):
            v -= 1 << width
        fields[name] = v
        end = off + width
    if word >> end:
        raise DecodeError(index, f"malformed {op.name} word: bits above bit {end - 1} "
                                 f"(unused by the format) are set")
    return from_fields(fields, index)


def encode_program_words(instrs: Iterable[Instruction], cfg: "HardwareConfig",
                         checked: bool = False) -> bytes:
    nbytes = cfg.instruction_bits // 8
    return b"".join(encode_instruction(ins, cfg, i, checked).to_bytes(nbytes, "little")
                    for i, ins in enumerate(instrs))


def decode_program_words(data: bytes, cfg: "HardwareConfig") -> list[Instruction]:
    nbytes = cfg.instruction_bits // 8
    if len(data) % nbytes:
        raise DecodeError(None, f"instruction stream of {len(data)} bytes is not a whole number "
                                f"of {nbytes}-byte words")
    try:
        return _decode_columns(data, nbytes, cfg)
    except DecodeError:
        pass  # decode word by word: the first bad word (in program order) raises
    return [decode_instruction(int.from_bytes(data[i:i + nbytes], "little"), cfg, i // nbytes)
            for i in range(0, len(data), nbytes)]


def _decode_columns(data: bytes, nbytes: int, cfg: "HardwareConfig") -> list[Instruction]:
    """Every distinct word's fields extracted column-wise with numpy (words of one opcode
    at a time), then its instruction built once: equal words share one (immutable)
    instruction object, so a program whose tiles repeat their compute instructions
    decodes each of those once. The same result as :func:`decode_instruction` on each
    word. Raises DecodeError on any malformed word without saying which first."""
    n = len(data) // nbytes
    raw = np.frombuffer(data, np.uint8).reshape(n, nbytes)
    opcodes = raw[:, 0] & 0b111
    out: list[Instruction | None] = [None] * n
    for opcode in np.unique(opcodes).tolist():
        if opcode not in FORMATS:
            raise DecodeError(None, "malformed word")
        idx = np.flatnonzero(opcodes == opcode)
        rows, which = np.unique(raw[idx], axis=0, return_inverse=True)
        names, columns, end = [], [], 0
        for name, _get, off, _mask, _lo, _hi, width, signed in _packer(Opcode(opcode), cfg):
            names.append(name)
            columns.append(_bit_field(rows, off, width, signed).tolist())
            end = off + width
        if _bits_above(rows, end):
            raise DecodeError(None, "malformed word")
        # a bad field raises DecodeError here without an index; the caller then decodes
        # word by word, which names the first bad word
        built = [from_fields(dict(zip(names, values))) for values in zip(*columns)]
        for k, u in zip(idx.tolist(), which.reshape(-1).tolist()):
            out[k] = built[u]
    return out  # type: ignore[return-value]


def _bit_field(rows: np.ndarray, off: int, width: int, signed: bool) -> np.ndarray:
    """Bits ``off .. off + width - 1`` of each little-endian row of bytes, as int64."""
    first, last = off // 8, (off + width - 1) // 8
    v = np.zeros(len(rows), np.uint64)
    for b in range(first, last + 1):
        v |= rows[:, b].astype(np.uint64) << np.uint64(8 * (b - first))
    v = ((v >> np.uint64(off % 8)) & np.uint64((1 << width) - 1)).astype(np.int64)
    if signed:
        v = np.where(v >> (width - 1), v - (1 << width), v)
    return v


def _bits_above(rows: np.ndarray, end: int) -> bool:
    """Whether any row has a bit set at or above bit ``end``."""
    byte = end // 8
    if byte >= rows.shape[1]:
        return False
    keep = (1 << (end % 8)) - 1
    return bool((rows[:, byte] & ~np.uint8(keep)).any() or rows[:, byte + 1:].any())
