"""Functional model: what each instruction does to DRAM and the scratchpads.

Loop nests are executed as whole numpy operations rather than step by step:
a GEMM nest is regrouped into one batched matrix product (reduction levels
become the K dimension), and an ALU nest is vectorized over the levels that
write distinct rows. Integer results are exact: the reduction is cut into
chunks of at most 1024 int8 products, whose float32 sums are exact integers
(below 2**24), and the chunk sums are added in int32, which wraps like the
accumulator. ALU results come from ``isa.semantics`` (int32 arithmetic where it
wraps, int64 where it must not).

Every state array has a leading batch axis: one pass over a program computes
``batch`` independent inputs at once (one machine per input, stepped in lockstep:
the program and its timing do not depend on the data), and a single run is the
batch of one. A GEMM whose weight tiles all came from the program's constant DRAM
multiplies every input by one shared weight matrix.
"""

from __future__ import annotations

import bisect
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ..isa import norm_unit
from ..isa import semantics as sem
from ..isa.instructions import (
    ACCUMULATING_OPS,
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
from ..isa.sparse_tiles import unpack_n_m
from . import int8_gemm
from .errors import SimulationError
from .plans import alu_plan, gemm_plan

#: a REQUANT immediate's (zero point, lo, hi), parsed once per distinct immediate
requant_imm = lru_cache(maxsize=1024)(sem.split_requant_imm)

#: the simulator's common ALU ops on int32 rows, ``(dst, a, b, b2) -> result``: what
#: ``sem.alu_apply`` computes (numpy's int32 arithmetic wraps as the ALU does), without its
#: general dispatch, which costs more than the op on a tile's rows (tests/device check
#: every op against the reference machine)
_INT32_OPS = {
    AluOp.ADD: lambda d, a, b, b2: a + b,
    AluOp.SUB: lambda d, a, b, b2: a - b,
    AluOp.MUL: lambda d, a, b, b2: a * b,
    AluOp.MAC: lambda d, a, b, b2: d + a * b,
    AluOp.MIN: lambda d, a, b, b2: np.minimum(a, b),
    AluOp.MAX: lambda d, a, b, b2: np.maximum(a, b),
    AluOp.SHR: lambda d, a, b, b2: sem.rshift_round(a, b),   # int64, wrapped on assignment
    AluOp.CLIP: lambda d, a, b, b2: np.minimum(np.maximum(a, b), b2),
}

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program
    from .cim_arrays import ProgrammedArrays
    from .replay import ReplayPlan

#: prepared weight matrices kept per machine (oldest evicted first)
WEIGHT_CACHE_SIZE = 64
#: the DRAM type a STORE narrows int32 lanes to (a C cast: the low bits, wrapped)
_NARROW = {Buffer.ACC8: np.int8, Buffer.ACC16: np.int16}


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
    """DRAM and scratchpad state of ``batch`` devices running one program in lockstep."""

    def __init__(self, cfg: "HardwareConfig", program: "Program", batch: int = 1,
                 arrays: "ProgrammedArrays | None" = None):
        if batch < 1:
            raise ValueError(f"a batch holds at least one input, got {batch}")
        self.cfg = cfg
        self.batch = batch
        self.arrays = arrays  # a CIM part's crossbars: the GEMMs they hold read them
        size = max(program.dram_size, 1)
        regions = sorted((r.offset, r.offset + r.nbytes, r.data) for r in program.regions
                         if r.data is not None)
        self._const = [(lo, hi) for lo, hi, _ in regions]   # byte ranges every input shares
        # a load from a constant region reads the program's own bytes, shared by every
        # input and never copied (validation has checked that every transfer lies inside
        # one region and that no store writes a constant one); the batch's own DRAM holds
        # the rest, zeroed in one sweep (a zero page mapped at its first scattered store
        # costs more than the sweep)
        self._const_bytes = [np.frombuffer(data, dtype=np.uint8) for _, _, data in regions]
        self.dram = np.empty((batch, size), dtype=np.uint8)
        start = 0
        for lo, hi in self._const + [(size, size)]:
            self.dram[:, start:lo] = 0
            start = hi
        bi, bo = cfg.block_in, cfg.block_out
        self.inp = np.zeros((batch, cfg.inp_depth, bi), dtype=np.int8)
        self.wgt = np.zeros((batch, cfg.wgt_depth, bo, bi), dtype=np.int8)
        self.acc = np.zeros((batch, cfg.acc_depth, bo), dtype=np.int32)
        # weight tiles loaded from constant DRAM: the same in every input
        self.wgt_shared = np.ones(cfg.wgt_depth, dtype=bool)
        # prepared GEMM weight matrices: key -> (first tile, last tile, matrix, column
        # sums); a WGT load drops the entries whose tiles it overwrites
        self._wcache: dict = {}
        # exact int8 products on the CPU's dot-product instructions when it proves exact
        # (int8_gemm); float32 chunks whose sums stay exact otherwise
        self.int8 = int8_gemm.available()
        # on the int8 path the input scratchpad holds codes + 128 (their bytes with the top
        # bit flipped), as the products take them: the loads flip the bits as they copy
        self.inp_bias = np.int8(-128) if self.int8 and arrays is None else None
        self._elems = {buf: self._elem(buf) for buf in Buffer}
        #: a replay's ALU rows by instruction (kept in its plan, shared by every later run
        #: of the program): an ALU op on a tile costs less than working its rows out again
        self.alu_memo: dict[int, tuple] | None = None

    def is_const(self, lo: int, hi: int) -> bool:
        """Whether DRAM bytes lo..hi-1 lie in one constant region."""
        return self.const_region(lo, hi) is not None

    def const_region(self, lo: int, hi: int) -> int | None:
        """The constant region holding DRAM bytes lo..hi-1, if one does (regions do not
        overlap: the one starting last at or before ``lo`` is the only candidate)."""
        k = bisect.bisect_right(self._const, (lo, float("inf"))) - 1
        return k if k >= 0 and hi <= self._const[k][1] else None

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
        if buffer == Buffer.WGT4:  # the packed bytes; load() unpacks them
            half = cfg.wgt_tile_bytes // 2
            return (half,), np.dtype(np.uint8), half, (1,)
        if buffer == Buffer.WGTS:  # compressed N:M tiles; load() expands them
            size = cfg.sparse_tile_bytes
            return (size,), np.dtype(np.uint8), size, (1,)
        if buffer == Buffer.ACC16:  # int16 lanes: sign-extended on load, low 16 bits stored
            return (cfg.block_out,), np.dtype(np.int16), 2 * cfg.block_out, (2,)
        return (cfg.block_out,), np.dtype(np.int8), cfg.block_out, (1,)

    def _sram(self, buffer: Buffer) -> np.ndarray:
        return {Buffer.INP: self.inp, Buffer.WGT: self.wgt, Buffer.WGT4: self.wgt,
                Buffer.WGTS: self.wgt}.get(
            buffer, self.acc)

    def _dram_window(self, ins: Load | Store, run: tuple[int, int] | None = None) -> np.ndarray:
        """(batch, y_size, x_size, *element) strided view of the DRAM the transfer touches
        (validation has checked that it lies inside one region): a load from a constant
        region reads the shared constants (batch stride 0). ``run = (n, step)``: the
        windows of n such transfers ``step`` elements apart, (batch, n, y, x, *element)."""
        shape, dtype, unit, inner = self._elems[ins.buffer]
        first = ins.dram_base * unit
        buf, batch_stride = self.dram, self.dram.shape[1]
        k = self.const_region(first, first + 1) if isinstance(ins, Load) else None
        if k is not None:
            buf, batch_stride, first = self._const_bytes[k], 0, first - self._const[k][0]
        outer = (run[0],) if run else ()
        steps = (run[1] * unit,) if run else ()
        return np.ndarray((self.batch,) + outer + (ins.y_size, ins.x_size) + shape, dtype,
                          buffer=buf, offset=first,
                          strides=(batch_stride,) + steps + (ins.x_stride * unit, unit) + inner)

    # --- instructions
    def replay(self, instrs: "list[Instruction]", order: list[int], plan: "ReplayPlan") -> None:
        """Run ``instrs`` in ``order`` as :meth:`execute` would, skipping the plan's
        redundant loads and computing its shared-input GEMMs together."""
        skip, shared, runs = plan.skip, plan.gemms, plan.load_runs
        pending: dict[int, np.ndarray] = {}
        self.alu_memo = plan.alu_steps
        for i in order:
            if i in skip:
                continue
            run = runs.get(i)
            if run is not None:
                self.load_run(instrs[i], *run)
                continue
            hit = shared.get(i)
            if hit is None:
                self.execute(i, instrs[i])
                continue
            group, pos = hit
            ins = instrs[i]
            plan_i = gemm_plan(ins.loops, self.cfg.block_in)
            if pos == 0:
                prod = self.product(ins, plan_i, group.weights, group.sums)
                if len(group.members) == 1:
                    self._accumulate(ins, plan_i, prod)
                    continue
                bo = self.cfg.block_out
                cols = prod.reshape(self.batch, plan_i.nb * plan_i.nm, -1)
                for j, sl in zip(group.members, group.cols):
                    pending[j] = cols[:, :, sl].reshape(self.batch, -1, bo)
            self._accumulate(ins, plan_i, pending.pop(i))

    def execute(self, i: int, ins: Instruction) -> None:
        if isinstance(ins, Gemm):
            if self.arrays is not None and i in self.arrays.analog:
                self.analog_gemm(i, ins)
            else:
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
        shared = src.strides[0] == 0   # the program's constants: the same in every input
        if ins.buffer == Buffer.WGT4:  # int4 pairs sign-extended into int8 tiles
            src = sem.unpack_int4(src[:1] if shared else src).reshape(
                (1 if shared else self.batch,) + src.shape[1:3] + self.wgt.shape[2:])
        elif ins.buffer == Buffer.WGTS:  # compressed N:M tiles expanded
            src = unpack_n_m(src[:1] if shared else src, *self.wgt.shape[2:],
                             *self.cfg.sparse_n_m)
        sram = self._sram(ins.buffer)
        h = ins.pad_top + ins.y_size + ins.pad_bottom
        w = ins.pad_left + ins.x_size + ins.pad_right
        dst = sram[:, ins.sram_base:ins.sram_base + h * w].reshape(
            (self.batch, h, w) + sram.shape[2:])
        self._fill(ins, dst, src)
        if ins.buffer in (Buffer.WGT, Buffer.WGT4, Buffer.WGTS):
            lo, hi = ins.sram_base, ins.sram_base + h * w - 1
            self.wgt_shared[lo:hi + 1] = self.batch == 1 or shared
            stale = [k for k, (w_lo, w_hi, *_) in self._wcache.items() if w_lo <= hi and lo <= w_hi]
            for k in stale:
                del self._wcache[k]

    def load_run(self, ins: Load, n: int, sram_step: int, dram_step: int) -> None:
        """``ins`` and the n - 1 loads like it that follow, each ``sram_step`` rows and
        ``dram_step`` elements further (disjoint rows; INP, ACC, ACC8 or ACC16), in one copy."""
        sram = self._sram(ins.buffer)
        h = ins.pad_top + ins.y_size + ins.pad_bottom
        w = ins.pad_left + ins.x_size + ins.pad_right
        row = sram.strides[1]
        dst = np.lib.stride_tricks.as_strided(
            sram[:, ins.sram_base:], (self.batch, n, h, w) + sram.shape[2:],
            (sram.strides[0], sram_step * row, w * row, row) + sram.strides[2:])
        self._fill(ins, dst, self._dram_window(ins, (n, dram_step)))

    def _fill(self, ins: Load, dst: np.ndarray, src: np.ndarray) -> None:
        """Write a load's padding and data into its (..., h, w, *element) rows ``dst``."""
        lead = (slice(None),) * (dst.ndim - self._sram(ins.buffer).ndim)
        inner = dst[lead + (slice(ins.pad_top, ins.pad_top + ins.y_size),
                            slice(ins.pad_left, ins.pad_left + ins.x_size))]
        padded = (ins.pad_top or ins.pad_bottom or ins.pad_left or ins.pad_right)
        if ins.buffer == Buffer.INP and self.inp_bias is not None:
            if padded:
                dst[...] = np.int8(ins.pad_value) ^ self.inp_bias
            np.bitwise_xor(src, self.inp_bias, out=inner)
            return
        if padded:
            dst[...] = ins.pad_value
        inner[...] = src

    def store(self, ins: Store) -> None:
        n = ins.y_size * ins.x_size
        rows = self.acc[:, ins.sram_base:ins.sram_base + n].reshape(
            self.batch, ins.y_size, ins.x_size, -1)
        narrow = _NARROW.get(ins.buffer)  # ACC8 / ACC16 keep the low 8 / 16 bits of a lane
        self._dram_window(ins)[...] = rows.astype(narrow) if narrow is not None else rows

    def norm(self, i: int, ins: Norm) -> None:
        """The [norm] units on ``ins.rows`` rows: parameters from the block at
        ``param_base``, the math in ``isa.intnorm`` (through ``isa.norm_unit``)."""
        bo, n = self.cfg.block_out, ins.length
        span = norm_unit.row_span(n, bo)
        prow = norm_unit.param_rows(ins.op, n, bo)
        try:
            params = norm_unit.unpack_params(
                ins.op, self.acc[0, ins.param_base:ins.param_base + prow], n)
        except ValueError as e:
            raise SimulationError(i, f"NORM {ins.op.name} parameter block at accumulator row "
                                     f"{ins.param_base}: {e}") from None
        rows = ins.rows * span
        for b in range(self.batch):  # the parameter block is each input's own
            if b:
                params = norm_unit.unpack_params(
                    ins.op, self.acc[b, ins.param_base:ins.param_base + prow], n)
            x = self.acc[b, ins.src_base:ins.src_base + rows].reshape(ins.rows, span * bo)
            out = np.zeros((ins.rows, span * bo), np.int32)
            out[:, :n] = norm_unit.apply(ins.op, x[:, :n], ins.in_zp, params, ins.in_wide,
                                           ins.out_wide)
            self.acc[b, ins.dst_base:ins.dst_base + rows] = out.reshape(rows, bo)

    def gemm(self, ins: Gemm) -> None:
        plan = gemm_plan(ins.loops, self.cfg.block_in)
        w, sums = self._gemm_weights(ins, plan)
        self._accumulate(ins, plan, self.product(ins, plan, w, sums))

    def product(self, ins: Gemm, plan, w: np.ndarray, sums: np.ndarray | None) -> np.ndarray:
        """(batch, nb * nm * N / block_out, block_out) int32 products of a GEMM's input
        rows with the weight matrix ``w`` (:meth:`weight_matrix`; N its columns, which
        may be wider than the GEMM's own when several GEMMs share the input)."""
        bi, nbat = self.cfg.block_in, self.batch
        nb, nm, nc, ch = plan.nb, plan.nm, plan.nchunk, plan.chunk
        base = ins.inp_base
        if sums is not None:   # int8 path: one reduction over every chunk, exact in int32
            biased = self.inp_bias is not None
            if plan.inp_run is not None:
                x = self.inp[:, base:base + plan.inp_run]
            else:  # np.take on the row axis: an order of magnitude faster than x[idx] here
                x = np.take(self.inp, base + plan.inp.transpose(0, 2, 1, 3), axis=1)
            if nb == 1 and w.ndim == 3:   # one weight matrix: one 2-D product
                prod = int8_gemm.matmul(x.reshape(nbat * nm, -1), w[0], sums[0], biased)
            else:
                prod = int8_gemm.matmul(x.reshape(nbat, nb, nm, -1), w, sums, biased)
            return prod.reshape(nbat, -1, self.cfg.block_out)
        if plan.inp_run is not None:
            x = self.inp[:, base:base + plan.inp_run]
        else:
            x = np.take(self.inp, base + plan.inp, axis=1)
        x = x.reshape(nbat, nb, nc, nm, ch * bi)
        # every chunk sum is an exact integer below 2**24; int32 adds wrap like the
        # accumulator does
        prod = np.matmul(x.astype(np.float32), w).astype(np.int32)
        if nc > 1:
            prod = prod.sum(axis=2, dtype=np.int32)
        return prod.reshape(nbat, -1, self.cfg.block_out)

    def analog_gemm(self, i: int, ins: Gemm) -> None:
        """GEMM ``i`` read on the crossbars its weights were programmed into
        (``dsa_tvm.cim``): the same inputs and accumulator rows as :meth:`gemm`."""
        plan = gemm_plan(ins.loops, self.cfg.block_in)
        nb, nm, nk = plan.nb, plan.nm, plan.nk
        rows = plan.inp.transpose(0, 2, 1, 3).reshape(nb, nm, -1)[..., :nk]
        x = np.take(self.inp, ins.inp_base + rows, axis=1).reshape(self.batch, nb, nm, -1)
        prod = self.arrays.gemm(i, x)                   # int64 (batch, nb, nm, nn * bo)
        self._accumulate(ins, plan, prod.astype(np.int32).reshape(self.batch, -1,
                                                                  self.cfg.block_out))

    def _accumulate(self, ins: Gemm, plan, prod: np.ndarray) -> None:
        """Write or add a GEMM's (batch, points, block_out) products into its rows."""
        nbat = self.batch
        acc = self.acc
        if plan.acc_run is not None:
            rows = slice(ins.acc_base, ins.acc_base + plan.acc_run)
        else:
            rows = ins.acc_base + plan.acc
        if plan.acc_injective:
            if ins.reset:
                acc[:, rows] = prod
            else:
                acc[:, rows] += prod
        else:  # several loop points update the same row: np.add.at sums them
            if ins.reset:
                acc[:, rows] = 0
            for b in range(nbat):
                np.add.at(acc[b], rows, prod[b])

    def _gemm_weights(self, ins: Gemm, plan) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`weight_matrix`, reused until a WGT load overwrites its tiles."""
        key = (ins.wgt_base, ins.loops)
        hit = self._wcache.get(key)
        if hit is not None:
            return hit[2], hit[3]
        mat, sums = self.weight_matrix(ins, plan)
        if len(self._wcache) >= WEIGHT_CACHE_SIZE:
            del self._wcache[next(iter(self._wcache))]
        self._wcache[key] = (ins.wgt_base + plan.wgt_lo, ins.wgt_base + plan.wgt_hi, mat, sums)
        return mat, sums

    def weight_matrix(self, ins: Gemm, plan) -> tuple[np.ndarray, np.ndarray | None]:
        """A GEMM's weight tiles as one matrix, with a leading batch axis when some tile is
        not the same in every input. On the int8 path (nb, K, nn*block_out) int8 (K the
        chunks' rows, zero where the last chunk is padded) with its
        :func:`int8_gemm.column_sums`; else (nb, nchunk, chunk*block_in, nn*block_out)
        float32 and None."""
        bi, bo = self.cfg.block_in, self.cfg.block_out
        nb, nn, nk = plan.nb, plan.nn, plan.nk
        tiles = ins.wgt_base + plan.wgt
        shared = bool(self.wgt_shared[tiles].all())
        w = np.take(self.wgt[0] if shared else self.wgt, tiles, axis=0 if shared else 1)
        lead = () if shared else (self.batch,)                  # (..., nb, nn, nk, bo, bi)
        w = np.moveaxis(w, (-4, -3, -2, -1), (-2, -4, -1, -3)).reshape(
            lead + (nb, nk * bi, nn * bo))
        kpad = plan.nchunk * plan.chunk
        mat = np.zeros(lead + (nb, kpad * bi, nn * bo),
                       dtype=np.int8 if self.int8 else np.float32)
        mat[..., :nk * bi, :] = w
        if self.int8:
            return mat, int8_gemm.column_sums(mat)
        return mat.reshape(lead + (nb, plan.nchunk, plan.chunk * bi, nn * bo)), None

    def alu(self, i: int, ins: Alu) -> None:
        memo = self.alu_memo
        steps = None if memo is None else memo.get(i)
        if steps is not None:          # a replayed program: the rows worked out before
            for d, a, b, period in steps:
                self._alu_step(i, ins, d, a, b, period)
            return
        plan = alu_plan(ins.loops, ins.a_base - ins.dst_base,
                        None if ins.use_imm else ins.b_base - ins.dst_base, ins.op,
                        self.cfg.block_out)
        base = ins.dst_base
        if plan.sum_steps:
            self._sum_steps(base, plan)
        elif plan.vectorized:
            n = plan.dst.shape[1]
            period = plan.b_period
            steps = []
            for r in range(plan.dst.shape[0]):
                if plan.b is None:
                    b = None
                elif period:  # the parameter rows repeat: gather one period, broadcast
                    b = base + plan.b[r, :period]
                else:
                    b = self._rows(base, plan.b, r, plan.b_run, n)
                steps.append((self._rows(base, plan.dst, r, plan.dst_run, n),
                              self._rows(base, plan.a, r, plan.a_run, n), b, period))
            for step in steps:
                self._alu_step(i, ins, *step)
            if memo is not None:
                memo[i] = tuple(steps)
        else:  # reads rows this instruction writes elsewhere: step point by point
            d, a = plan.dst.T.reshape(-1), plan.a.T.reshape(-1)
            b = None if plan.b is None else plan.b.T.reshape(-1)
            order = np.argsort(_loop_order(ins), kind="stable")
            for k in order:
                k = int(k)
                self._alu_step(i, ins, slice(base + d[k], base + d[k] + 1),
                               slice(base + a[k], base + a[k] + 1),
                               None if b is None else slice(base + b[k], base + b[k] + 1))

    def _sum_steps(self, base: int, plan) -> None:
        """An in-place ADD reduction in one gather: the destination rows plus every step's
        b rows, summed in int64 and wrapped to int32 once (what the steps' int32 adds
        give, in any order)."""
        steps, n = plan.dst.shape
        d = self._rows(base, plan.dst, 0, plan.dst_run, n)
        terms = self.acc.take((base + plan.b).reshape(-1), axis=1)
        total = terms.reshape(self.batch, steps, n, -1).sum(axis=1, dtype=np.int64)
        total += self._read(d)
        self.acc[:, d] = total.astype(np.int32)

    @staticmethod
    def _rows(base: int, offs: np.ndarray, r: int, run: bool, n: int):
        """Accumulator rows of step ``r``: a slice for a contiguous run, else indices."""
        if run:
            first = base + int(offs[r, 0])
            return slice(first, first + n)
        return base + offs[r]

    def _read(self, rows) -> np.ndarray:
        """(batch, len(rows), lanes) accumulator rows (a slice or row indices)."""
        return self.acc[:, rows] if isinstance(rows, slice) else self.acc.take(rows, axis=1)

    def _param(self, rows, k: int) -> np.ndarray:
        """Parameter row b + k of every point (int32)."""
        if isinstance(rows, slice):
            return self.acc[:, rows.start + k:rows.stop + k]
        return self.acc.take(rows + k, axis=1)

    def _alu_step(self, i: int, ins: Alu, d, a, b, period: int | None = None) -> None:
        """One vector operation over rows ``d`` (destination), ``a`` and ``b`` (slices or
        row indices), in every input of the batch. With ``period``, ``b`` holds that many
        parameter rows, which repeat over the points: the operands are shaped
        (batch, points / period, period, lanes)."""
        acc = self.acc
        op = ins.op
        av = self._read(a)
        dv = self._read(d) if op in ACCUMULATING_OPS else av
        b2 = b3 = None
        if ins.use_imm:
            if op == AluOp.CLIP:
                lo, hi = sem.split_clip_imm(ins.imm)
                bv, b2 = np.int32(lo), np.int32(hi)
            else:
                bv = np.int32(ins.imm)
            period = None
        elif op == AluOp.LUT:  # one table per input (validation: b strides 0), rows b_base...
            first = ins.b_base
            bv = acc[:, first:first + lut_rows(acc.shape[2])].reshape(self.batch, -1)
        else:
            rows = b_rows(op)
            bv = self._param(b, 0)
            if rows > 1:
                b2 = self._param(b, 1)
            if rows > 2:
                b3 = self._param(b, 2)
        if op == AluOp.REQUANT:
            lo, hi = sem.REQUANT_SHIFT_RANGE
            top = b3.view(np.uint32).max()       # negative shifts are huge as unsigned
            if top > hi:
                bad = (b3 < lo) | (b3 > hi)
                first = b.start if isinstance(b, slice) else int(b[0])
                raise SimulationError(i, f"REQUANT shift {int(b3[bad][0])} (accumulator row "
                                         f"{first + 2}...) is outside {lo}..{hi}")
            if not period and top <= sem.FOLD_SHIFT_MAX:   # the common case, checked here
                acc[:, d] = sem.output_stage_int32(av, bv, b2, b3, *requant_imm(ins.imm))
                return
        elif not period and op in _INT32_OPS:   # int32 operands: numpy's wrap is the ALU's
            acc[:, d] = _INT32_OPS[op](dv, av, bv, b2)
            return
        if period:
            lanes = av.shape[-1]
            av = av.reshape(self.batch, -1, period, lanes)
            dv = dv.reshape(self.batch, -1, period, lanes) if op in ACCUMULATING_OPS else av
            bv, b2, b3 = (None if v is None else v[:, None] for v in (bv, b2, b3))
        if op == AluOp.LUT:
            res = np.stack([sem.alu_apply(op, dv[k], av[k], bv[k], imm=ins.imm)
                            for k in range(self.batch)])
        else:
            res = sem.alu_apply(op, dv, av, bv, b2, b3, imm=ins.imm)
        acc[:, d] = res.reshape(self.batch, -1, res.shape[-1]) if period else res
