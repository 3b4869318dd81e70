"""Functional model: what each instruction does to DRAM and the scratchpads.

Loop nests are executed as whole numpy operations rather than step by step:
a GEMM nest is regrouped into one batched matrix product (reduction levels
become the K dimension), and an ALU nest is vectorized over the levels that
write distinct rows. Integer results are exact: products of int8 are summed
in float32 only while every partial sum stays below 2**24, else in float64,
and accumulators wrap to int32 through ``isa.semantics``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..isa import semantics as sem
from ..isa.instructions import PAIRED_B_OPS, Alu, AluOp, Buffer, Gemm, Instruction, Load, Store
from .errors import SimulationError
from .plans import alu_plan, gemm_plan

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

def _loop_order(ins: Alu) -> np.ndarray:
    """Loop-order position of every point, in the (steps, n) layout of its plan, transposed."""
    loops = ins.loops
    pos = np.arange(int(np.prod([lp.extent for lp in loops])), dtype=np.int64).reshape(
        [lp.extent for lp in loops])
    red = [k for k, lp in enumerate(loops) if lp.dst == 0 and lp.extent > 1]
    perm = red + [k for k in range(len(loops)) if k not in red]
    nred = int(np.prod([loops[k].extent for k in red], dtype=np.int64))
    return pos.transpose(perm).reshape(nred, -1).T.reshape(-1)


class Machine:
    """DRAM and scratchpad state of one device."""

    def __init__(self, cfg: "HardwareConfig", program: "Program"):
        self.cfg = cfg
        self.dram = np.zeros(max(program.dram_size, 1), dtype=np.uint8)
        for r in program.regions:
            if r.data is not None:
                self.dram[r.offset:r.offset + r.nbytes] = np.frombuffer(r.data, dtype=np.uint8)
        bi, bo = cfg.block_in, cfg.block_out
        self.inp = np.zeros((cfg.inp_depth, bi), dtype=np.int8)
        self.wgt = np.zeros((cfg.wgt_depth, bo, bi), dtype=np.int8)
        self.acc = np.zeros((cfg.acc_depth, bo), dtype=np.int32)
        self._wcache: dict = {}  # prepared GEMM weight matrices; cleared when WGT is written

    # --- DRAM element views
    def _dram_elems(self, buffer: Buffer) -> np.ndarray:
        cfg = self.cfg
        usable = len(self.dram) - len(self.dram) % cfg.element_bytes(buffer)
        raw = self.dram[:usable]
        if buffer == Buffer.INP:
            return raw.view(np.int8).reshape(-1, cfg.block_in)
        if buffer == Buffer.WGT:
            return raw.view(np.int8).reshape(-1, cfg.block_out, cfg.block_in)
        if buffer == Buffer.ACC:
            return raw.view(np.int32).reshape(-1, cfg.block_out)
        return raw.view(np.int8).reshape(-1, cfg.block_out)

    def _sram(self, buffer: Buffer) -> np.ndarray:
        return {Buffer.INP: self.inp, Buffer.WGT: self.wgt}.get(buffer, self.acc)

    def _dram_window(self, ins: Load | Store) -> np.ndarray:
        """(y_size, x_size, *element) strided view of the DRAM the transfer touches."""
        elems = self._dram_elems(ins.buffer)
        rows = elems[ins.dram_base:]
        st = rows.strides
        return np.lib.stride_tricks.as_strided(
            rows, shape=(ins.y_size, ins.x_size) + rows.shape[1:],
            strides=(st[0] * ins.x_stride, st[0]) + st[1:], writeable=True)

    # --- instructions
    def execute(self, i: int, ins: Instruction) -> None:
        if isinstance(ins, Gemm):
            self.gemm(ins)
        elif isinstance(ins, Alu):
            self.alu(i, ins)
        elif isinstance(ins, Load):
            self.load(ins)
        elif isinstance(ins, Store):
            self.store(ins)

    def load(self, ins: Load) -> None:
        src = self._dram_window(ins)
        sram = self._sram(ins.buffer)
        h = ins.pad_top + ins.y_size + ins.pad_bottom
        w = ins.pad_left + ins.x_size + ins.pad_right
        dst = sram[ins.sram_base:ins.sram_base + h * w].reshape((h, w) + sram.shape[1:])
        if h * w != ins.y_size * ins.x_size:
            dst[...] = ins.pad_value
        dst[ins.pad_top:ins.pad_top + ins.y_size, ins.pad_left:ins.pad_left + ins.x_size] = src
        if ins.buffer == Buffer.WGT:
            self._wcache.clear()

    def store(self, ins: Store) -> None:
        n = ins.y_size * ins.x_size
        rows = self.acc[ins.sram_base:ins.sram_base + n].reshape(ins.y_size, ins.x_size, -1)
        self._dram_window(ins)[...] = rows.astype(np.int8) if ins.buffer == Buffer.ACC8 else rows

    def gemm(self, ins: Gemm) -> None:
        plan = gemm_plan(ins.loops, self.cfg.block_in)
        bi, bo = self.cfg.block_in, self.cfg.block_out
        nb, nm, nk = plan.nb, plan.nm, plan.nk
        if plan.inp_run is not None:
            x = self.inp[ins.inp_base:ins.inp_base + plan.inp_run]
        else:
            x = self.inp[ins.inp_base + plan.inp]
        x = x.astype(plan.dtype).reshape(nb, nm, nk * bi)
        prod = np.matmul(x, self._gemm_weights(ins, plan)).reshape(-1, bo)
        # exact integers; int32 adds wrap around like the accumulator does
        prod = (prod.astype(np.int32) if plan.dtype is np.float32
                else sem.wrap_int32(prod.astype(np.int64)))
        acc = self.acc
        if plan.acc_run is not None:
            rows = slice(ins.acc_base, ins.acc_base + plan.acc_run)
        else:
            rows = ins.acc_base + plan.acc
        if plan.acc_injective:
            if ins.reset:
                acc[rows] = prod
            else:
                acc[rows] += prod
        else:  # several loop points update the same row: np.add.at sums them
            if ins.reset:
                acc[rows] = 0
            np.add.at(acc, rows, prod)

    def _gemm_weights(self, ins: Gemm, plan) -> np.ndarray:
        """(nb, nk*block_in, nn*block_out) weight matrix, reused while WGT is unchanged."""
        key = (ins.wgt_base, ins.loops)
        w = self._wcache.get(key)
        if w is None:
            bi, bo = self.cfg.block_in, self.cfg.block_out
            w = self.wgt[ins.wgt_base + plan.wgt].astype(plan.dtype)  # (nb, nn, nk, bo, bi)
            w = np.ascontiguousarray(w.transpose(0, 2, 4, 1, 3)).reshape(
                plan.nb, plan.nk * bi, plan.nn * bo)
            if len(self._wcache) > 64:
                self._wcache.clear()
            self._wcache[key] = w
        return w

    def alu(self, i: int, ins: Alu) -> None:
        plan = alu_plan(ins.loops, ins.a_base - ins.dst_base,
                        None if ins.use_imm else ins.b_base - ins.dst_base, ins.op)
        base = ins.dst_base
        if plan.vectorized:
            for r in range(plan.dst.shape[0]):
                self._alu_step(i, ins, base + plan.dst[r], base + plan.a[r],
                               None if plan.b is None else base + plan.b[r])
        else:  # reads rows this instruction writes elsewhere: step point by point
            d, a = plan.dst.T.reshape(-1), plan.a.T.reshape(-1)
            b = None if plan.b is None else plan.b.T.reshape(-1)
            order = np.argsort(_loop_order(ins), kind="stable")
            for k in order:
                self._alu_step(i, ins, base + d[k:k + 1], base + a[k:k + 1],
                               None if b is None else base + b[k:k + 1])

    def _alu_step(self, i: int, ins: Alu, d, a, b) -> None:
        acc = self.acc
        av = acc[a].astype(np.int64)
        dv = acc[d].astype(np.int64) if ins.op == AluOp.MAC else av
        b2 = None
        if ins.use_imm:
            if ins.op == AluOp.CLIP:
                lo, hi = sem.split_clip_imm(ins.imm)
                bv, b2 = np.int64(lo), np.int64(hi)
            else:
                bv = np.int64(ins.imm)
        else:
            bv = acc[b].astype(np.int64)
            if ins.op in PAIRED_B_OPS:
                b2 = acc[b + 1].astype(np.int64)
        if ins.op == AluOp.REQUANT:
            lo, hi = sem.REQUANT_SHIFT_RANGE
            if (b2 < lo).any() or (b2 > hi).any():
                bad = int(b2[(b2 < lo) | (b2 > hi)][0])
                raise SimulationError(i, f"REQUANT shift {bad} (accumulator row "
                                         f"{int(b[0]) + 1}...) is outside {lo}..{hi}")
        acc[d] = sem.alu_apply(ins.op, dv, av, bv, b2, zero_point=ins.imm)
