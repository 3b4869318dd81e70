"""A small assembler: allocate DRAM regions and append instructions to a program.

Hand-written programs (tests, demos, benchmarks) and the compiler's codegen
both build programs through this, so DRAM alignment and element-unit
addressing are worked out in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..hw.sparsity import parse_n_m
from ..intmath import ceil_div
from .encoding import EncodeError, encode_program_words
from .instructions import (
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
    Store,
    Sync,
)
from .program import INT4, REGION_KINDS, SPARSE, Program, Region, region_alignment
from .semantics import pack_int4
from .sparse_tiles import pack_n_m

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig


def deps(pop_prev=False, pop_next=False, push_prev=False, push_next=False) -> Deps:
    return Deps(bool(pop_prev), bool(pop_next), bool(push_prev), bool(push_next))


class ProgramBuilder:
    def __init__(self, cfg: "HardwareConfig", name: str = "program"):
        self.cfg = cfg
        self.name = name
        self.instructions: list[Instruction] = []
        self.regions: list[Region] = []
        self.meta: dict = {}
        self._top = 0

    # --- DRAM
    def region(self, name: str, kind: str, shape: Sequence[int], dtype: str = "int8",
               data: np.ndarray | None = None) -> Region:
        """Allocate an aligned DRAM region; ``data`` (for constants) is stored as given."""
        if kind not in REGION_KINDS:
            raise ValueError(f"region kind must be one of {REGION_KINDS}, got {kind!r}")
        if any(r.name == name for r in self.regions):
            raise ValueError(f"DRAM region '{name}' already exists")
        align = region_alignment(self.cfg, dtype)
        offset = ceil_div(self._top, align) * align
        blob = None
        packed = dtype == INT4  # int8 codes in [-8, 7], stored two a byte (WGT4 loads)
        # int8 tiles stored as compressed N:M tiles (WGTS loads)
        n_m = parse_n_m(dtype[len(SPARSE):]) if dtype.startswith(SPARSE) else None
        if data is not None:
            arr = np.ascontiguousarray(data, dtype=np.int8 if packed or n_m else dtype)
            if arr.shape != tuple(shape):
                raise ValueError(f"region '{name}': data shape {arr.shape} != {tuple(shape)}")
            blob = (pack_int4(arr) if packed else pack_n_m(arr, *n_m) if n_m else arr).tobytes()
        r = Region(name, kind, offset, dtype if packed or n_m else np.dtype(dtype).name,
                   tuple(int(s) for s in shape), blob)
        self._top = offset + r.nbytes
        if self._top > self.cfg.dram_bytes:
            raise ValueError(f"DRAM region '{name}' ends at byte {self._top}, past the "
                             f"{self.cfg.dram_bytes}-byte DRAM of '{self.cfg.name}'")
        self.regions.append(r)
        return r

    def addr(self, region: Region, buffer: Buffer, byte_offset: int = 0) -> int:
        """DRAM address of ``region`` + ``byte_offset`` in elements of ``buffer``."""
        unit = self.cfg.element_bytes(buffer)
        if not unit:
            raise ValueError(f"hardware '{self.cfg.name}' has no {buffer.name} elements "
                             f"(WGTS needs array.sparsity N:M)")
        b = region.offset + byte_offset
        if b % unit:
            raise ValueError(f"byte {b} of region '{region.name}' is not aligned to the "
                             f"{unit}-byte elements of {buffer.name}")
        return b // unit

    # --- instructions
    def emit(self, ins: Instruction) -> int:
        self.instructions.append(ins)
        return len(self.instructions) - 1

    def load(self, buffer: Buffer, sram_base: int, dram_base: int, y_size: int, x_size: int,
             x_stride: int | None = None, pad=(0, 0, 0, 0), pad_value: int = 0,
             prefetch: bool = False, **dep) -> int:
        """pad = (top, bottom, left, right)."""
        t, b, lft, r = pad
        return self.emit(Load(buffer, sram_base, dram_base, y_size, x_size,
                              x_size if x_stride is None else x_stride, t, b, lft, r, pad_value,
                              deps(**dep), prefetch))

    def store(self, buffer: Buffer, sram_base: int, dram_base: int, y_size: int, x_size: int,
              x_stride: int | None = None, **dep) -> int:
        return self.emit(Store(buffer, sram_base, dram_base, y_size, x_size,
                               x_size if x_stride is None else x_stride, deps(**dep)))

    def gemm(self, acc_base: int, inp_base: int, wgt_base: int,
             loops: Sequence[tuple[int, int, int, int]], reset: bool = False,
             sparse: bool = False, **dep) -> int:
        """loops: (extent, acc_stride, inp_stride, wgt_stride), outermost first;
        ``sparse``: its weight tiles come from WGTS loads (``array.sparsity``)."""
        return self.emit(Gemm(acc_base, inp_base, wgt_base,
                              tuple(GemmLoop(*lp) for lp in loops), reset, deps(**dep), sparse))

    def alu(self, op: AluOp, dst_base: int, a_base: int = 0, b_base: int = 0,
            loops: Sequence[tuple[int, int, int, int]] = (), imm: int = 0,
            use_imm: bool = False, **dep) -> int:
        """loops: (extent, dst_stride, a_stride, b_stride); ``use_imm``: B is ``imm``.
        REQUANT takes its zero point in ``imm`` with ``use_imm`` off."""
        return self.emit(Alu(op, dst_base, a_base, b_base, tuple(AluLoop(*lp) for lp in loops),
                             use_imm, imm, deps(**dep)))

    def norm(self, op: NormOp, dst_base: int, src_base: int, param_base: int, rows: int,
             length: int, in_zp: int = 0, in_wide: bool = False, out_wide: bool = False,
             **dep) -> int:
        """``rows`` rows of ``length`` codes through the [norm] units (``dst_base =
        src_base``: in place); parameters from row ``param_base`` (``isa.norm_unit``);
        ``in_wide`` / ``out_wide``: the rows hold / the results are int16 codes."""
        return self.emit(Norm(op, dst_base, src_base, param_base, rows, length, in_zp,
                              deps(**dep), in_wide, out_wide))

    def sync(self, engine: Engine, **dep) -> int:
        return self.emit(Sync(engine, deps(**dep)))

    def finish(self, **dep) -> int:
        return self.emit(Finish(deps(**dep)))

    def build(self) -> Program:
        """The program (a FINISH is appended when missing). Every instruction is encoded
        here, once, which range-checks its fields: a program whose fields all fit is marked
        so that the simulator does not check them again on every run, and keeps its words.
        One that does not fit is returned unmarked; running it reports the first bad field,
        naming the instruction."""
        if not self.instructions or not isinstance(self.instructions[-1], Finish):
            self.finish()
        prog = Program(self.name, self.cfg.fingerprint, self.cfg.instruction_bits,
                       list(self.instructions), list(self.regions), dict(self.meta))
        prog.check_layout(self.cfg)  # regions appended by hand bypass region()'s checks
        try:  # encoding checks every field; the words are kept for serialization
            words = encode_program_words(prog.instructions, self.cfg)
        except EncodeError:
            return prog
        prog.mark_fields_checked(self.cfg, words)
        return prog
