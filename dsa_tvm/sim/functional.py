"""Functional model: what each instruction does to DRAM and the scratchpads.

Loop nests are executed as whole numpy operations rather than step by step:
a GEMM nest is regrouped into one batched matrix product (reduction levels
become the K dimension), and an ALU nest is vectorized over the levels that
write distinct rows. Integer results are exact: the reduction is cut into
chunks of at most 1024 int8 products, whose float32 sums are exact integers
(below 2**24), and the chunk sums are added in int32, which wraps like the
accumulator. ALU results come from ``isa.semantics`` (int32 arithmetic where it
wraps, int64 where it must not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..isa import norm_unit
from ..isa import semantics as sem
from ..isa.instructions import (
    Alu,
    AluOp,
    Buffer,
    Gemm,
    Instruction,
    Load,
    Norm,
    Store,
    b_rows,
    lut_rows,
)
from .errors import SimulationError
from .plans import alu_plan, gemm_plan

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

#: prepared weight matrices kept per machine (oldest evicted first)
WEIGHT_CACHE_SIZE = 64


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
        # prepared GEMM weight matrices: key -> (first tile, last tile, matrix); a WGT
        # load drops the entries whose tiles it overwrites
        self._wcache: dict = {}
        self._elems = {buf: self._elem(buf) for buf in Buffer}

    # --- DRAM element views
    def _elem(self, buffer: Buffer) -> tuple[tuple[int, ...], np.dtype, int, tuple[int, ...]]:
        """(shape, dtype, bytes, inner strides) of one DRAM element of a buffer."""
        cfg = self.cfg
        if buffer == Buffer.INP:
            return (cfg.block_in,), np.dtype(np.int8), cfg.block_in, (1,)
        if buffer == Buffer.WGT:
            return ((cfg.block_out, cfg.block_in), np.dtype(np.int8), cfg.wgt_tile_bytes,
                    (cfg.block_in, 1))
        if buffer == Buffer.ACC:
            return (cfg.block_out,), np.dtype(np.int32), cfg.acc_row_bytes, (4,)
        return (cfg.block_out,), np.dtype(np.int8), cfg.block_out, (1,)

    def _sram(self, buffer: Buffer) -> np.ndarray:
        return {Buffer.INP: self.inp, Buffer.WGT: self.wgt}.get(buffer, self.acc)

    def _dram_window(self, ins: Load | Store) -> np.ndarray:
        """(y_size, x_size, *element) strided view of the DRAM the transfer touches
        (validation has checked that it lies inside the program's DRAM)."""
        shape, dtype, unit, inner = self._elems[ins.buffer]
        return np.ndarray((ins.y_size, ins.x_size) + shape, dtype, buffer=self.dram,
                          offset=ins.dram_base * unit,
                          strides=(ins.x_stride * unit, unit) + inner)

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
        elif isinstance(ins, Norm):
            self.norm(i, ins)

    def load(self, ins: Load) -> None:
        src = self._dram_window(ins)
        sram = self._sram(ins.buffer)
        h = ins.pad_top + ins.y_size + ins.pad_bottom
        w = ins.pad_left + ins.x_size + ins.pad_right
        dst = sram[ins.sram_base:ins.sram_base + h * w].reshape((h, w) + sram.shape[1:])
        if h * w != ins.y_size * ins.x_size:
            dst[...] = ins.pad_value
        dst[ins.pad_top:ins.pad_top + ins.y_size, ins.pad_left:ins.pad_left + ins.x_size] = src
        if ins.buffer == Buffer.WGT and self._wcache:
            lo, hi = ins.sram_base, ins.sram_base + h * w - 1
            stale = [k for k, (w_lo, w_hi, _) in self._wcache.items() if w_lo <= hi and lo <= w_hi]
            for k in stale:
                del self._wcache[k]

    def store(self, ins: Store) -> None:
        n = ins.y_size * ins.x_size
        rows = self.acc[ins.sram_base:ins.sram_base + n].reshape(ins.y_size, ins.x_size, -1)
        self._dram_window(ins)[...] = rows.astype(np.int8) if ins.buffer == Buffer.ACC8 else rows

    def norm(self, i: int, ins: Norm) -> None:
        """The [norm] units on ``ins.rows`` rows: parameters from the block at
        ``param_base``, the math in ``isa.intnorm`` (through ``isa.norm_unit``)."""
        bo, n = self.cfg.block_out, ins.length
        span = norm_unit.row_span(n, bo)
        prow = norm_unit.param_rows(ins.op, n, bo)
        try:
            params = norm_unit.unpack_params(
                ins.op, self.acc[ins.param_base:ins.param_base + prow], n)
        except ValueError as e:
            raise SimulationError(i, f"NORM {ins.op.name} parameter block at accumulator row "
                                     f"{ins.param_base}: {e}") from None
        rows = ins.rows * span
        x = self.acc[ins.src_base:ins.src_base + rows].reshape(ins.rows, span * bo)[:, :n]
        out = np.zeros((ins.rows, span * bo), np.int32)
        out[:, :n] = norm_unit.apply(ins.op, x, ins.in_zp, params)
        self.acc[ins.dst_base:ins.dst_base + rows] = out.reshape(rows, bo)

    def gemm(self, ins: Gemm) -> None:
        plan = gemm_plan(ins.loops, self.cfg.block_in)
        bi, bo = self.cfg.block_in, self.cfg.block_out
        nb, nm, nc, ch = plan.nb, plan.nm, plan.nchunk, plan.chunk
        if plan.inp_run is not None:
            x = self.inp[ins.inp_base:ins.inp_base + plan.inp_run]
        else:  # np.take on the row axis: an order of magnitude faster than x[idx] here
            x = np.take(self.inp, ins.inp_base + plan.inp, axis=0)
        x = x.reshape(nb, nc, nm, ch * bi).astype(np.float32)
        prod = np.matmul(x, self._gemm_weights(ins, plan))        # (nb, nc, nm, nn*bo)
        # every chunk sum is an exact integer below 2**24; int32 adds wrap like the
        # accumulator does
        if nc == 1:
            prod = prod.astype(np.int32).reshape(-1, bo)
        else:
            prod = prod.astype(np.int32).sum(axis=1, dtype=np.int32).reshape(-1, bo)
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
        """(nb, nchunk, chunk*block_in, nn*block_out) float32 weight matrix (zero rows
        where the last chunk is padded), reused until a WGT load overwrites its tiles."""
        key = (ins.wgt_base, ins.loops)
        hit = self._wcache.get(key)
        if hit is not None:
            return hit[2]
        bi, bo = self.cfg.block_in, self.cfg.block_out
        nb, nn, nk = plan.nb, plan.nn, plan.nk
        w = np.take(self.wgt, ins.wgt_base + plan.wgt, axis=0)      # (nb, nn, nk, bo, bi)
        w = w.transpose(0, 2, 4, 1, 3).reshape(nb, nk * bi, nn * bo)
        kpad = plan.nchunk * plan.chunk
        mat = np.zeros((nb, kpad * bi, nn * bo), dtype=np.float32)
        mat[:, :nk * bi] = w
        mat = mat.reshape(nb, plan.nchunk, plan.chunk * bi, nn * bo)
        if len(self._wcache) >= WEIGHT_CACHE_SIZE:
            del self._wcache[next(iter(self._wcache))]
        self._wcache[key] = (ins.wgt_base + plan.wgt_lo, ins.wgt_base + plan.wgt_hi, mat)
        return mat

    def alu(self, i: int, ins: Alu) -> None:
        plan = alu_plan(ins.loops, ins.a_base - ins.dst_base,
                        None if ins.use_imm else ins.b_base - ins.dst_base, ins.op,
                        self.cfg.block_out)
        base = ins.dst_base
        if plan.vectorized:
            n = plan.dst.shape[1]
            period = plan.b_period
            for r in range(plan.dst.shape[0]):
                if plan.b is None:
                    b = None
                elif period:  # the parameter rows repeat: gather one period, broadcast
                    b = base + plan.b[r, :period]
                else:
                    b = self._rows(base, plan.b, r, plan.b_run, n)
                self._alu_step(i, ins, self._rows(base, plan.dst, r, plan.dst_run, n),
                               self._rows(base, plan.a, r, plan.a_run, n), b, period)
        else:  # reads rows this instruction writes elsewhere: step point by point
            d, a = plan.dst.T.reshape(-1), plan.a.T.reshape(-1)
            b = None if plan.b is None else plan.b.T.reshape(-1)
            order = np.argsort(_loop_order(ins), kind="stable")
            for k in order:
                k = int(k)
                self._alu_step(i, ins, slice(base + d[k], base + d[k] + 1),
                               slice(base + a[k], base + a[k] + 1),
                               None if b is None else slice(base + b[k], base + b[k] + 1))

    @staticmethod
    def _rows(base: int, offs: np.ndarray, r: int, run: bool, n: int):
        """Accumulator rows of step ``r``: a slice for a contiguous run, else indices."""
        if run:
            first = base + int(offs[r, 0])
            return slice(first, first + n)
        return base + offs[r]

    def _param(self, rows, k: int) -> np.ndarray:
        """Parameter row b + k of every point (int32)."""
        if isinstance(rows, slice):
            return self.acc[rows.start + k:rows.stop + k]
        return self.acc.take(rows + k, axis=0)

    def _alu_step(self, i: int, ins: Alu, d, a, b, period: int | None = None) -> None:
        """One vector operation over rows ``d`` (destination), ``a`` and ``b`` (slices or
        row indices). With ``period``, ``b`` holds that many parameter rows, which repeat
        over the points: the operands are shaped (points / period, period, lanes)."""
        acc = self.acc
        op = ins.op
        av = acc[a] if isinstance(a, slice) else acc.take(a, axis=0)
        dv = (acc[d] if isinstance(d, slice) else acc.take(d, axis=0)) \
            if op == AluOp.MAC else av
        b2 = b3 = None
        if ins.use_imm:
            if op == AluOp.CLIP:
                lo, hi = sem.split_clip_imm(ins.imm)
                bv, b2 = np.int32(lo), np.int32(hi)
            else:
                bv = np.int32(ins.imm)
            period = None
        elif op == AluOp.LUT:  # one table (validation: b strides 0), rows b_base...
            first = ins.b_base
            bv = acc[first:first + lut_rows(acc.shape[1])].reshape(-1)
        else:
            rows = b_rows(op)
            bv = self._param(b, 0)
            if rows > 1:
                b2 = self._param(b, 1)
            if rows > 2:
                b3 = self._param(b, 2)
        if op == AluOp.REQUANT:
            lo, hi = sem.REQUANT_SHIFT_RANGE
            if b3.view(np.uint32).max() > hi:  # negative shifts are huge as unsigned
                bad = (b3 < lo) | (b3 > hi)
                first = b.start if isinstance(b, slice) else int(b[0])
                raise SimulationError(i, f"REQUANT shift {int(b3[bad][0])} (accumulator row "
                                         f"{first + 2}...) is outside {lo}..{hi}")
        if period:
            lanes = av.shape[-1]
            av = av.reshape(-1, period, lanes)
            dv = dv.reshape(-1, period, lanes) if op == AluOp.MAC else av
        res = sem.alu_apply(op, dv, av, bv, b2, b3, imm=ins.imm)
        acc[d] = res.reshape(-1, res.shape[-1]) if period else res
