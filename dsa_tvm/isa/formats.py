"""Bit layouts of the instruction formats, sized from a hardware config.

This is the one definition of the binary encoding: the encoder, the decoder,
the disassembler's field names and the generated ISA reference all read these
tables. Fields are packed from the least significant bit in the order listed;
every word starts with the 3-bit opcode and the four dependency flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..hw.config import add_rule
from .instructions import ALU_LEVELS, GEMM_LEVELS, AluOp, NormOp, Opcode

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

Width = Callable[["HardwareConfig"], int]


def addr_bits(depth: int) -> int:
    """Bits to address ``depth`` rows (at least 1)."""
    return max(1, (depth - 1).bit_length())


def _fixed(n: int) -> Width:
    return lambda cfg: n


def _inp(cfg) -> int:
    return addr_bits(cfg.inp_depth)


def _wgt(cfg) -> int:
    return addr_bits(cfg.wgt_depth)


def _acc(cfg) -> int:
    return addr_bits(cfg.acc_depth)


def _any_sram(cfg) -> int:
    return max(_inp(cfg), _wgt(cfg), _acc(cfg))


def _dram(cfg) -> int:
    return 32


EXTENT_BITS = 16
DRAM_SIZE_BITS = 16
PAD_BITS = 8
IMM_BITS = 32


@dataclass(frozen=True)
class FieldDef:
    name: str
    width: Width
    doc: str
    signed: bool = False
    width_rule: str = ""  # how the width is derived, for the reference


@dataclass(frozen=True)
class Format:
    opcode: Opcode
    fields: tuple[FieldDef, ...]
    doc: str

    def widths(self, cfg: "HardwareConfig") -> list[tuple[FieldDef, int, int]]:
        """(field, bit offset, width) for every field, header included."""
        out, off = [], 0
        for f in HEADER + self.fields:
            w = f.width(cfg)
            out.append((f, off, w))
            off += w
        return out

    def total_bits(self, cfg: "HardwareConfig") -> int:
        return sum(f.width(cfg) for f in HEADER + self.fields)


HEADER: tuple[FieldDef, ...] = (
    FieldDef("opcode", _fixed(3), "LOAD=0 STORE=1 GEMM=2 ALU=3 SYNC=4 FINISH=5 NORM=6", width_rule="3"),
    FieldDef("pop_prev", _fixed(1), "wait for a token from the previous engine", width_rule="1"),
    FieldDef("pop_next", _fixed(1), "wait for a token from the next engine", width_rule="1"),
    FieldDef("push_prev", _fixed(1), "send a token to the previous engine when done",
             width_rule="1"),
    FieldDef("push_next", _fixed(1), "send a token to the next engine when done", width_rule="1"),
)

_SRAM_RULE = "address bits of the largest scratchpad"
_DMA_COMMON = (
    FieldDef("buffer", _fixed(3), "INP=0 WGT=1 ACC=2 (int32 in DRAM) ACC8=3 (int8 in DRAM) "
             "WGT4=4 (weight tiles, int4 in DRAM) WGTS=5 (weight tiles, compressed N:M in DRAM) "
             "ACC16=6 (int16 in DRAM)", width_rule="3"),
    FieldDef("sram_base", _any_sram, "first scratchpad row/tile", width_rule=_SRAM_RULE),
    FieldDef("dram_base", _dram, "first DRAM element (in elements of the buffer's type)",
             width_rule="32"),
    FieldDef("y_size", _fixed(DRAM_SIZE_BITS), "rows of the 2-D transfer",
             width_rule=str(DRAM_SIZE_BITS)),
    FieldDef("x_size", _fixed(DRAM_SIZE_BITS), "elements per row", width_rule=str(DRAM_SIZE_BITS)),
    FieldDef("x_stride", _fixed(DRAM_SIZE_BITS),
             "DRAM elements between row starts (0: every row reads the same source row)",
             width_rule=str(DRAM_SIZE_BITS)),
)

_pad_rule = str(PAD_BITS)
LOAD_FORMAT = Format(Opcode.LOAD, _DMA_COMMON + (
    FieldDef("pad_top", _fixed(PAD_BITS), "padding rows written before the data", width_rule=_pad_rule),
    FieldDef("pad_bottom", _fixed(PAD_BITS), "padding rows written after the data",
             width_rule=_pad_rule),
    FieldDef("pad_left", _fixed(PAD_BITS), "padding elements before each row", width_rule=_pad_rule),
    FieldDef("pad_right", _fixed(PAD_BITS), "padding elements after each row", width_rule=_pad_rule),
    FieldDef("pad_value", _fixed(8), "value of padding elements (int8, e.g. a zero point)",
             signed=True, width_rule="8"),
    FieldDef("prefetch", _fixed(1), "ACC/ACC8/ACC16: run on the load engine, overlapping compute "
             "(ordered by tokens); 0: on the compute engine, in order with it", width_rule="1"),
), "DRAM -> scratchpad, 2-D strided, with padding")

STORE_FORMAT = Format(Opcode.STORE, _DMA_COMMON,
                      "accumulator scratchpad -> DRAM, int32 or narrowed to int16 or int8")


def _gemm_fields() -> tuple[FieldDef, ...]:
    fs = [FieldDef("reset", _fixed(1), "zero the touched accumulator rows first", width_rule="1"),
          FieldDef("acc_base", _acc, "first accumulator row", width_rule="acc address bits"),
          FieldDef("inp_base", _inp, "first input row", width_rule="inp address bits"),
          FieldDef("wgt_base", _wgt, "first weight tile", width_rule="wgt address bits")]
    for k in range(GEMM_LEVELS):
        fs += [FieldDef(f"ext{k}", _fixed(EXTENT_BITS), f"extent of loop level {k} (0 = outermost)",
                        width_rule=str(EXTENT_BITS)),
               FieldDef(f"acc_stride{k}", _acc, f"accumulator stride of level {k}",
                        width_rule="acc address bits"),
               FieldDef(f"inp_stride{k}", _inp, f"input stride of level {k}",
                        width_rule="inp address bits"),
               FieldDef(f"wgt_stride{k}", _wgt, f"weight stride of level {k}",
                        width_rule="wgt address bits")]
    # last, so a dense GEMM's word is the one it was before the field existed
    fs.append(FieldDef("sparse", _fixed(1), "weight tiles loaded by WGTS: the array skips "
                       "the pruned N of each M (array.sparsity)", width_rule="1"))
    return tuple(fs)


def _alu_fields() -> tuple[FieldDef, ...]:
    ops = " ".join(op.name for op in AluOp) + f" (0..{int(max(AluOp))})"
    fs = [FieldDef("alu_op", _fixed(4), ops, width_rule="4"),
          FieldDef("use_imm", _fixed(1), "source B is the immediate", width_rule="1"),
          FieldDef("dst_base", _acc, "first destination row", width_rule="acc address bits"),
          FieldDef("a_base", _acc, "first source-A row", width_rule="acc address bits"),
          FieldDef("b_base", _acc, "first source-B row", width_rule="acc address bits")]
    for k in range(ALU_LEVELS):
        fs += [FieldDef(f"ext{k}", _fixed(EXTENT_BITS), f"extent of loop level {k} (0 = outermost)",
                        width_rule=str(EXTENT_BITS)),
               FieldDef(f"dst_stride{k}", _acc, f"destination stride of level {k}",
                        width_rule="acc address bits"),
               FieldDef(f"a_stride{k}", _acc, f"source-A stride of level {k}",
                        width_rule="acc address bits"),
               FieldDef(f"b_stride{k}", _acc, f"source-B stride of level {k}",
                        width_rule="acc address bits")]
    fs.append(FieldDef("imm", _fixed(IMM_BITS),
                       "immediate (int32); CLIP: lo/hi int16 halves; REQUANT: zp, lo, hi in "
                       "bytes 0-2 (int8 each), bit 24 wide (int16 clamp; lo, hi zero), bits "
                       "25-31 zero", signed=True,
                       width_rule=str(IMM_BITS)))
    return tuple(fs)


GEMM_FORMAT = Format(Opcode.GEMM, _gemm_fields(), "loop nest of MAC-array steps")
ALU_FORMAT = Format(Opcode.ALU, _alu_fields(), "loop nest of vector operations on accumulator rows")
SYNC_FORMAT = Format(Opcode.SYNC, (
    FieldDef("engine", _fixed(2), "LOAD=0 COMPUTE=1 STORE=2", width_rule="2"),),
    "no work; carries dependency tokens on the named engine")
FINISH_FORMAT = Format(Opcode.FINISH, (), "end of program (compute engine)")
#: bits of NORM's row length (rows of 1..intnorm.MAX_ROW = 2**16 codes)
NORM_LENGTH_BITS = 17
NORM_FORMAT = Format(Opcode.NORM, (
    FieldDef("norm_op", _fixed(2), " ".join(f"{op.name}={int(op)}" for op in NormOp),
             width_rule="2"),
    FieldDef("dst_base", _acc, "first destination row (= src_base: in place)",
             width_rule="acc address bits"),
    FieldDef("src_base", _acc, "first source row", width_rule="acc address bits"),
    FieldDef("param_base", _acc, "first row of the parameter block (isa.norm_unit)",
             width_rule="acc address bits"),
    FieldDef("rows", _fixed(EXTENT_BITS), "rows to normalize", width_rule=str(EXTENT_BITS)),
    FieldDef("length", _fixed(NORM_LENGTH_BITS), "codes per row (n); a row spans "
             "ceil(n / block_out) accumulator rows", width_rule=str(NORM_LENGTH_BITS)),
    FieldDef("in_zp", _fixed(8), "input zero point (int8; the norms subtract it, softmax "
             "ignores it)", signed=True, width_rule="8"),
    # last, so a NORM of int8 codes has the word it had before the field existed
    FieldDef("in_wide", _fixed(1), "rows hold int16 codes (clamped to int16, not int8; e.g. "
             "an ACC16-loaded residual stream)", width_rule="1"),
    FieldDef("out_wide", _fixed(1), "results saturate at int16, not int8 (for an ACC16 "
             "store; e.g. attention probabilities on a grid finer than 1/256)",
             width_rule="1"),
), "softmax / LayerNorm / RMSNorm of accumulator rows on the [norm] units (compute engine)")

FORMATS: dict[Opcode, Format] = {f.opcode: f for f in (
    LOAD_FORMAT, STORE_FORMAT, GEMM_FORMAT, ALU_FORMAT, SYNC_FORMAT, FINISH_FORMAT, NORM_FORMAT)}


def check_formats_fit(cfg: "HardwareConfig") -> str | None:
    """None if every format fits the instruction width, else what does not."""
    for fmt in FORMATS.values():
        need = fmt.total_bits(cfg)
        if need > cfg.instruction_bits:
            return (f"the {fmt.opcode.name} format needs {need} bits with these scratchpad sizes "
                    f"(more than {cfg.instruction_bits}); raise isa.instruction_bits or shrink SRAM")
    return None


add_rule("isa.instruction_bits", check_formats_fit)  # the ISA is sized from the config
