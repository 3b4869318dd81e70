"""The instruction-by-instruction reference machine: the device tests' oracle.

It is written independently of ``dsa_tvm.sim``: it executes a program one
instruction at a time, in program order, and every loop nest one point at a time
with Python integers, following the semantics documented in
``dsa_tvm/isa/instructions.py``. Tests build programs whose dependency tokens
make the hardware order equal program order (:func:`sequential`), so the
simulator must agree with it bit for bit (``harness.run_and_check``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

import numpy as np

from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import (
    Alu,
    AluOp,
    Buffer,
    Deps,
    Engine,
    Finish,
    Gemm,
    Instruction,
    Load,
    Store,
    Sync,
)
from dsa_tvm.isa.program import Program

# ----------------------------------------------------------------------------- integers

def wrap32(v: int) -> int:
    """Two's-complement int32 wrap of a Python integer."""
    return ((int(v) + (1 << 31)) % (1 << 32)) - (1 << 31)


def rshift_round_py(x: int, s: int) -> int:
    """floor(x / 2**s + 1/2) for s >= 0; x * 2**-s for s < 0 (Python integers, exact)."""
    x, s = int(x), int(s)
    # for |x| < 2**63 every shift beyond +-64 gives the same int32 result as +-64;
    # bounding it keeps Python from building astronomically large integers
    s = max(-64, min(64, s))
    if s > 0:
        return (x + (1 << (s - 1))) >> s
    if s == 0:
        return x
    return x << (-s)


def requant_py(a: int, mult: int, shift: int, zp: int, lo: int = -128, hi: int = 127) -> int:
    y = rshift_round_py(int(a) * int(mult), shift) + int(zp)
    return min(max(y, lo), hi)


def output_stage_py(a: int, bias: int, mult: int, shift: int, zp: int = 0, lo: int = -128,
                    hi: int = 127) -> int:
    """The fused REQUANT: clamp(rshift_round(wrap32(a + bias) * mult, shift) + zp, lo, hi)."""
    return requant_py(wrap32(int(a) + int(bias)), mult, shift, zp, lo, hi)


def requant_imm_fields(imm: int) -> tuple[int, int, int]:
    """(zp, lo, hi) of a REQUANT immediate: signed bytes 0, 1, 2; bit 24 (wide) set: the
    clamp is int16 and bytes 1, 2 are zero; bits 25-31 must be zero."""
    assert 0 <= imm < (1 << 25), hex(imm)

    def byte(k):
        v = (imm >> (8 * k)) & 0xFF
        return v - 256 if v >= 128 else v

    if imm >> 24:  # wide
        assert byte(1) == byte(2) == 0, hex(imm)
        return byte(0), -(1 << 15), (1 << 15) - 1
    return byte(0), byte(1), byte(2)


def clip_imm_halves(imm: int) -> tuple[int, int]:
    u = imm & 0xFFFFFFFF
    lo, hi = u & 0xFFFF, u >> 16
    return (lo - 0x10000 if lo >= 0x8000 else lo), (hi - 0x10000 if hi >= 0x8000 else hi)


#: parameter rows the tensor form reads from row b on (documented in AluOp)
PARAM_ROWS = {AluOp.CLIP: 2, AluOp.REQUANT: 3}


def low_byte_signed(x: int) -> int:
    """The low 8 bits of ``x`` read as a two's-complement byte."""
    v = x & 0xFF
    return v - 256 if v >= 128 else v


def alu_lane(op: AluOp, d: int, a: int, b: int, b2: int | None, b3: int | None,
             imm: int) -> int:
    """One int32 lane of one ALU step (documented semantics, Python integers): ``b``,
    ``b2``, ``b3`` are the lane's parameter rows b, b + 1, b + 2 (or the immediate)."""
    if op == AluOp.MOV:
        return wrap32(b)
    if op == AluOp.ADD:
        return wrap32(a + b)
    if op == AluOp.SUB:
        return wrap32(a - b)
    if op == AluOp.MUL:
        return wrap32(a * b)
    if op == AluOp.MAC:
        return wrap32(d + a * b)
    if op == AluOp.MAC8:  # the low bytes of a and b, as signed 8-bit numbers
        return wrap32(d + low_byte_signed(a) * low_byte_signed(b))
    if op == AluOp.MIN:
        return min(a, b)
    if op == AluOp.MAX:
        return max(a, b)
    if op == AluOp.SHR:
        return wrap32(rshift_round_py(a, b))
    if op == AluOp.CLIP:
        return min(max(a, b), b2)
    if op == AluOp.REQUANT:
        if not 0 <= b3 <= 62:
            raise ValueError("REQUANT shift out of range")
        return output_stage_py(a, b, b2, b3, *requant_imm_fields(imm))
    raise AssertionError(op)


# ----------------------------------------------------------------------------- reference

def _points(loops) -> Iterable[tuple[int, ...]]:
    return itertools.product(*[range(lp.extent) for lp in loops])


def _row(base: int, loops, point, attr: str) -> int:
    return base + sum(i * getattr(lp, attr) for i, lp in zip(point, loops))


class RefMachine:
    """Step-by-step reference of the DSA's data semantics (no timing, program order)."""

    def __init__(self, cfg, program: Program, inputs: dict[str, np.ndarray] | None = None):
        self.cfg = cfg
        self.program = program
        size = max((r.offset + r.nbytes for r in program.regions), default=1)
        self.dram = bytearray(size)
        for r in program.regions:
            if r.data is not None:
                self.dram[r.offset:r.offset + r.nbytes] = r.data
        for name, arr in (inputs or {}).items():
            r = program.region(name)
            self.dram[r.offset:r.offset + r.nbytes] = np.ascontiguousarray(arr).tobytes()
        bi, bo = cfg.block_in, cfg.block_out
        self.inp = np.zeros((cfg.inp_depth, bi), dtype=np.int64)
        self.wgt = np.zeros((cfg.wgt_depth, bo, bi), dtype=np.int64)
        self.acc = np.zeros((cfg.acc_depth, bo), dtype=np.int64)

    # DRAM elements, read and written through bytes
    def _elem_shape_dtype(self, buffer: Buffer):
        cfg = self.cfg
        return {Buffer.INP: ((cfg.block_in,), np.int8),
                Buffer.WGT: ((cfg.block_out, cfg.block_in), np.int8),
                Buffer.ACC: ((cfg.block_out,), np.int32),
                Buffer.ACC8: ((cfg.block_out,), np.int8),
                Buffer.ACC16: ((cfg.block_out,), np.int16),
                Buffer.WGT4: ((cfg.block_out, cfg.block_in), "int4"),
                Buffer.WGTS: ((cfg.block_out, cfg.block_in), "n:m")}[buffer]

    def _elem_bytes(self, buffer: Buffer) -> int:
        shape, dt = self._elem_shape_dtype(buffer)
        if dt == "int4":
            return int(np.prod(shape)) // 2
        if dt == "n:m":  # kept values, then log2(M)-bit indices, whole bytes
            n, m = self.cfg.sparse_n_m
            kept = int(np.prod(shape)) * n // m
            return kept + -(-kept * (m.bit_length() - 1) // 8)
        return int(np.prod(shape)) * np.dtype(dt).itemsize

    def _read_n_m(self, raw: bytes, shape) -> np.ndarray:
        """A compressed N:M tile, decoded with Python integers: every kept value, then its
        column inside its group from the little-endian bit stream that follows."""
        n, m = self.cfg.sparse_n_m
        rows, cols = shape
        kept = rows * cols * n // m
        bits = m.bit_length() - 1
        stream = int.from_bytes(raw[kept:], "little")
        tile = np.zeros(shape, np.int64)
        for j in range(kept):
            value = raw[j] - 256 if raw[j] >= 128 else raw[j]
            col = stream >> (j * bits) & ((1 << bits) - 1)
            row, group = divmod(j // n, cols // m)
            tile[row, group * m + col] = value
        return tile

    def read_elem(self, buffer: Buffer, index: int) -> np.ndarray:
        shape, dt = self._elem_shape_dtype(buffer)
        n = self._elem_bytes(buffer)
        raw = bytes(self.dram[index * n:(index + 1) * n])
        assert len(raw) == n
        if dt == "n:m":
            return self._read_n_m(raw, shape)
        if dt == "int4":  # two's-complement nibbles, the low one first
            nibbles = [b >> s & 0xF for b in raw for s in (0, 4)]
            return np.array([v - 16 if v >= 8 else v for v in nibbles],
                            dtype=np.int64).reshape(shape)
        return np.frombuffer(raw, dtype=dt).reshape(shape).astype(np.int64)

    def write_elem(self, buffer: Buffer, index: int, row: np.ndarray) -> None:
        n = self._elem_bytes(buffer)
        if buffer == Buffer.ACC8:
            raw = bytes(int(v) & 0xFF for v in row)        # the low byte of every lane
        elif buffer == Buffer.ACC16:                       # the low 16 bits of every lane
            raw = b"".join((int(v) & 0xFFFF).to_bytes(2, "little") for v in row)
        else:
            raw = b"".join((int(v) & 0xFFFFFFFF).to_bytes(4, "little") for v in row)
        assert len(raw) == n
        self.dram[index * n:(index + 1) * n] = raw

    def sram(self, buffer: Buffer) -> np.ndarray:
        return {Buffer.INP: self.inp, Buffer.WGT: self.wgt, Buffer.WGT4: self.wgt,
                Buffer.WGTS: self.wgt}.get(
            buffer, self.acc)

    def run(self) -> "RefMachine":
        for ins in self.program.instructions:
            self.execute(ins)
        return self

    def execute(self, ins: Instruction) -> None:
        if isinstance(ins, Load):
            self.load(ins)
        elif isinstance(ins, Store):
            self.store(ins)
        elif isinstance(ins, Gemm):
            self.gemm(ins)
        elif isinstance(ins, Alu):
            self.alu(ins)

    def load(self, ins: Load) -> None:
        h = ins.pad_top + ins.y_size + ins.pad_bottom
        w = ins.pad_left + ins.x_size + ins.pad_right
        sram = self.sram(ins.buffer)
        for y in range(h):
            for x in range(w):
                row = ins.sram_base + y * w + x
                yy, xx = y - ins.pad_top, x - ins.pad_left
                if 0 <= yy < ins.y_size and 0 <= xx < ins.x_size:
                    sram[row] = self.read_elem(ins.buffer, ins.dram_base + yy * ins.x_stride + xx)
                else:
                    sram[row] = ins.pad_value

    def store(self, ins: Store) -> None:
        for y in range(ins.y_size):
            for x in range(ins.x_size):
                row = self.acc[ins.sram_base + y * ins.x_size + x]
                self.write_elem(ins.buffer, ins.dram_base + y * ins.x_stride + x, row)

    def gemm(self, ins: Gemm) -> None:
        loops = ins.loops
        if ins.reset:
            for p in _points(loops):
                self.acc[_row(ins.acc_base, loops, p, "acc")] = 0
        for p in _points(loops):
            a = _row(ins.acc_base, loops, p, "acc")
            i = _row(ins.inp_base, loops, p, "inp")
            w = _row(ins.wgt_base, loops, p, "wgt")
            tile, vec = self.wgt[w], self.inp[i]
            for lane in range(self.cfg.block_out):
                dot = sum(int(tile[lane, k]) * int(vec[k]) for k in range(self.cfg.block_in))
                self.acc[a, lane] = wrap32(int(self.acc[a, lane]) + dot)

    def alu(self, ins: Alu) -> None:
        loops = ins.loops
        for p in _points(loops):
            d = _row(ins.dst_base, loops, p, "dst")
            a = _row(ins.a_base, loops, p, "a")
            drow = [int(v) for v in self.acc[d]]
            arow = [int(v) for v in self.acc[a]]
            bo = self.cfg.block_out
            none = [None] * bo
            if ins.use_imm:
                if ins.op == AluOp.CLIP:
                    lo, hi = clip_imm_halves(ins.imm)
                    brow, b2row, b3row = [lo] * bo, [hi] * bo, none
                else:
                    brow, b2row, b3row = [ins.imm] * bo, none, none
            elif ins.op == AluOp.LUT:  # entry i: row b + i // block_out, lane i % block_out
                idx = [min(max(v, -128), 127) + 128 for v in arow]
                self.acc[d] = [int(self.acc[ins.b_base + i // bo, i % bo]) for i in idx]
                continue
            else:
                b = _row(ins.b_base, loops, p, "b")
                rows = [[int(v) for v in self.acc[b + k]]
                        for k in range(PARAM_ROWS.get(ins.op, 1))]
                brow, b2row, b3row = (rows + [none, none])[:3]
            self.acc[d] = [alu_lane(ins.op, drow[k], arow[k], brow[k], b2row[k], b3row[k],
                                    ins.imm) for k in range(bo)]

    def outputs(self) -> dict[str, np.ndarray]:
        out = {}
        for r in self.program.regions_of("output"):
            raw = bytes(self.dram[r.offset:r.offset + r.nbytes])
            out[r.name] = np.frombuffer(raw, dtype=r.dtype).reshape(r.shape).copy()
        return out


def reference_outputs(cfg, program: Program, inputs=None) -> dict[str, np.ndarray]:
    return RefMachine(cfg, program, inputs).run().outputs()


# ----------------------------------------------------------------------------- programs

def sequential(instrs: list[Instruction]) -> list[Instruction]:
    """The same instructions with dependency tokens (and SYNCs where load and store
    meet) such that each one starts only after the previous one completed; a FINISH
    is appended if missing. Hardware order then equals program order."""
    body = [ins for ins in instrs if not isinstance(ins, Finish)] + [Finish()]
    seq: list[Instruction] = []
    for ins in body:
        if seq and {seq[-1].engine, ins.engine} == {Engine.LOAD, Engine.STORE}:
            seq.append(Sync(Engine.COMPUTE))
        seq.append(dataclasses.replace(ins, deps=Deps()))
    flags = [dict(pop_prev=False, pop_next=False, push_prev=False, push_next=False) for _ in seq]
    for k in range(1, len(seq)):
        pe, ne = seq[k - 1].engine, seq[k].engine
        if pe == ne:
            continue
        if ne > pe:       # load -> compute, compute -> store
            flags[k - 1]["push_next"] = True
            flags[k]["pop_prev"] = True
        else:             # compute -> load, store -> compute
            flags[k - 1]["push_prev"] = True
            flags[k]["pop_next"] = True
    return [dataclasses.replace(ins, deps=Deps(**f)) for ins, f in zip(seq, flags)]


def build_sequential(b: ProgramBuilder) -> Program:
    prog = b.build()
    prog.instructions = sequential(prog.instructions)
    return prog
