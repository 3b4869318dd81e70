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

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

_EXACT_F32 = 1 << 24


def _nest_indices(base: int, loops, attr: str) -> np.ndarray:
    """Row index of every loop point, shaped by the loop extents (outermost first)."""
    idx = np.full([lp.extent for lp in loops], base, dtype=np.int64)
    for k, lp in enumerate(loops):
        s = getattr(lp, attr)
        if s and lp.extent > 1:
            shape = [1] * len(loops)
            shape[k] = lp.extent
            idx = idx + (np.arange(lp.extent, dtype=np.int64) * s).reshape(shape)
    return idx


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

    def store(self, ins: Store) -> None:
        n = ins.y_size * ins.x_size
        rows = self.acc[ins.sram_base:ins.sram_base + n].reshape(ins.y_size, ins.x_size, -1)
        self._dram_window(ins)[...] = rows.astype(np.int8) if ins.buffer == Buffer.ACC8 else rows

    def gemm(self, ins: Gemm) -> None:
        loops = [lp for lp in ins.loops if lp.extent > 1]
        if ins.reset:
            touched = np.unique(_nest_indices(ins.acc_base, loops, "acc"))
            self.acc[touched] = 0
        # Regroup the levels: B (batch: all operands move), M (rows: weight fixed),
        # N (columns: input fixed), K (reduction: accumulator fixed).
        groups: dict[str, list] = {"B": [], "M": [], "N": [], "K": []}
        for lp in loops:
            if lp.acc == 0:
                groups["K"].append(lp)
            elif lp.wgt == 0:
                groups["M"].append(lp)
            elif lp.inp == 0:
                groups["N"].append(lp)
            else:
                groups["B"].append(lp)
        order = groups["B"] + groups["M"] + groups["N"] + groups["K"]
        nb, nm, nn, nk = (int(np.prod([lp.extent for lp in groups[g]], dtype=np.int64))
                          for g in "BMNK")
        bi, bo = self.cfg.block_in, self.cfg.block_out
        # Index arrays over the reordered nest; sizes 1 where an operand does not move.
        ii = _nest_indices(ins.inp_base, order, "inp")
        wi = _nest_indices(ins.wgt_base, order, "wgt")
        ai = _nest_indices(ins.acc_base, order, "acc")
        nlev = len(order)
        cut_b, cut_m, cut_n = (len(groups["B"]), len(groups["B"]) + len(groups["M"]),
                               len(groups["B"]) + len(groups["M"]) + len(groups["N"]))
        inp_idx = ii.reshape(ii.shape)[(slice(None),) * cut_m + (0,) * (cut_n - cut_m)
                                       + (slice(None),) * (nlev - cut_n)].reshape(nb, nm, nk)
        wgt_idx = wi[(slice(None),) * cut_b + (0,) * (cut_m - cut_b)].reshape(nb, nn, nk)
        acc_idx = ai[(Ellipsis,) + (0,) * (nlev - cut_n)].reshape(nb, nm, nn)
        dt = np.float32 if nk * bi * 128 * 128 <= _EXACT_F32 else np.float64
        x = self.inp[inp_idx].astype(dt).reshape(nb, nm, nk * bi)
        w = self.wgt[wgt_idx].astype(dt)                      # (nb, nn, nk, bo, bi)
        w = w.transpose(0, 2, 4, 1, 3).reshape(nb, nk * bi, nn * bo)
        prod = np.matmul(x, w).reshape(nb, nm, nn, bo).astype(np.int64)
        flat = acc_idx.reshape(-1)
        prod = prod.reshape(-1, bo)
        if len(np.unique(flat)) == len(flat):
            self.acc[flat] = sem.wrap_int32(self.acc[flat].astype(np.int64) + prod)
        else:
            tot = self.acc.astype(np.int64)
            np.add.at(tot, flat, prod)
            uniq = np.unique(flat)
            self.acc[uniq] = sem.wrap_int32(tot[uniq])

    def alu(self, i: int, ins: Alu) -> None:
        loops = list(ins.loops)
        d = _nest_indices(ins.dst_base, loops, "dst").reshape(-1)
        a = _nest_indices(ins.a_base, loops, "a").reshape(-1)
        b = None if ins.use_imm else _nest_indices(ins.b_base, loops, "b").reshape(-1)
        # Levels that revisit a destination row are stepped in loop order; the rest vectorize.
        red = [k for k, lp in enumerate(loops) if lp.dst == 0 and lp.extent > 1]
        par = [k for k in range(len(loops)) if k not in red]
        shape = [lp.extent for lp in loops]
        perm = red + par
        nred = int(np.prod([shape[k] for k in red], dtype=np.int64))

        def regroup(idx):
            return idx.reshape(shape).transpose(perm).reshape(nred, -1)

        d2, a2 = regroup(d), regroup(a)
        b2 = None if b is None else regroup(b)
        if self._alu_vectorizable(ins, d, a, b, d2[0]):
            for r in range(nred):
                self._alu_step(i, ins, d2[r], a2[r], None if b2 is None else b2[r])
        else:  # reads rows this instruction writes elsewhere: run it step by step
            for k in range(len(d)):
                self._alu_step(i, ins, d[k:k + 1], a[k:k + 1], None if b is None else b[k:k + 1])

    @staticmethod
    def _alu_vectorizable(ins: Alu, d, a, b, d_step) -> bool:
        if len(np.unique(d_step)) != len(d_step):
            return False
        written = np.unique(d)
        reads = [a] if ins.op not in (AluOp.MOV,) else []
        if b is not None:
            reads.append(b)
            if ins.op in PAIRED_B_OPS:
                reads.append(b + 1)
        for r in reads:
            hit = np.isin(r, written)
            if hit.any() and not np.array_equal(r[hit], d[hit]):
                return False
        return True

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
