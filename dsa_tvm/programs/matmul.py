"""Hand-written tiled int8 matmul programs: the demo and the device tests, which need a
program without the compiler (benchmarks time compiled programs: ``bench_sim.py``).

``out[M, N] = clamp(requant(x[M, K] @ w[N, K].T + bias) + zp, lo, hi)`` with the
per-channel fused output stage (one ALU REQUANT per tile), or the raw int32
accumulators. K stays whole on chip; M and N are tiled. With ``double_buffer``
every scratchpad tile has two slots and dependency tokens let the load of tile
s+1 and the store of tile s-1 overlap the compute of tile s.

DRAM layouts (K and N padded to the array blocks)::

    x    int8  [M][KB*block_in]
    w    int8  [NB][KB][block_out][block_in]
    qp   int32 [NB][3][block_out]    (REQUANT rows: bias, mult, shift; see pack_qparams)
    out  int8  [M][NB*block_out]     (int32 without requant)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..intmath import ceil_div
from ..isa import semantics as sem
from ..isa.builder import ProgramBuilder
from ..isa.instructions import AluOp, Buffer, Engine
from ..isa.program import Program
from ..isa.semantics import INT8_MAX, INT8_MIN, pack_requant_imm
from .common import QPARAM_ROWS, pack_qparams, unpack_qparams

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

__all__ = ["MatmulTiling", "default_tiling", "matmul_program", "pack_qparams", "pack_weights",
           "pad_cols", "reference_matmul"]


@dataclass(frozen=True)
class MatmulTiling:
    tile_m: int   # rows of x per tile
    tile_n: int   # output blocks (of block_out columns) per tile


def pack_weights(w: np.ndarray, cfg: "HardwareConfig") -> np.ndarray:
    """[N, K] int8 -> [NB, KB, block_out, block_in], zero padded."""
    n, k = w.shape
    bo, bi = cfg.block_out, cfg.block_in
    nb, kb = ceil_div(n, bo), ceil_div(k, bi)
    p = np.zeros((nb * bo, kb * bi), dtype=np.int8)
    p[:n, :k] = w
    return np.ascontiguousarray(p.reshape(nb, bo, kb, bi).transpose(0, 2, 1, 3))


def pad_cols(x: np.ndarray, block: int) -> np.ndarray:
    m, k = x.shape
    p = np.zeros((m, ceil_div(k, block) * block), dtype=x.dtype)
    p[:, :k] = x
    return p


def default_tiling(cfg: "HardwareConfig", m: int, n: int, k: int,
                   double_buffer: bool = True) -> MatmulTiling:
    """Largest tiles that fit the scratchpads (``nbuf`` slots each)."""
    nbuf = 2 if double_buffer else 1
    kb, nb = ceil_div(k, cfg.block_in), ceil_div(n, cfg.block_out)
    tile_n = max(1, min(nb, cfg.wgt_depth // (nbuf * kb)))
    acc_rows = (cfg.acc_depth - QPARAM_ROWS * nb) // nbuf
    tile_m = max(1, min(m, cfg.inp_depth // (nbuf * kb), acc_rows // tile_n))
    return MatmulTiling(tile_m, tile_n)


def matmul_program(cfg: "HardwareConfig", m: int, n: int, k: int,
                   requant: bool = True, double_buffer: bool = True,
                   tiling: MatmulTiling | None = None, name: str = "matmul",
                   w: np.ndarray | None = None, qparams: np.ndarray | None = None,
                   output_zp: int = 0, clamp: tuple[int, int] = (INT8_MIN, INT8_MAX)
                   ) -> Program:
    """Build the program; ``w`` ([N, K] int8) and ``qparams`` ([NB, 3, block_out] int32:
    bias, mult, shift rows, see :func:`pack_qparams`; the bias is optional there, zeros
    without) become constants when given, else they are program inputs. With ``requant``
    the output is ``clamp(rshift_round(wrap32(acc + bias) * mult, shift) + output_zp)``
    within ``clamp`` (int8 bounds; ``(output_zp, 127)`` is a fused ReLU), one ALU REQUANT
    per tile."""
    bi, bo = cfg.block_in, cfg.block_out
    kb, nb = ceil_div(k, bi), ceil_div(n, bo)
    t = tiling or default_tiling(cfg, m, n, k, double_buffer)
    nbuf = 2 if double_buffer else 1
    imm = pack_requant_imm(output_zp, *clamp) if requant else 0
    if nbuf * t.tile_m * kb > cfg.inp_depth or nbuf * t.tile_n * kb > cfg.wgt_depth:
        raise ValueError(f"tiling {t} does not fit the scratchpads of '{cfg.name}' with K={k}")
    param_rows = QPARAM_ROWS * nb if requant else 0
    if nbuf * t.tile_m * t.tile_n + param_rows > cfg.acc_depth:
        raise ValueError(f"tiling {t} does not fit the accumulator of '{cfg.name}'")
    if requant and qparams is not None:
        qparams = np.asarray(qparams)
        if qparams.shape != (nb, QPARAM_ROWS, bo):
            raise ValueError(f"qparams must be [{nb}, {QPARAM_ROWS}, {bo}] (bias, mult, shift "
                             f"rows per output block; see pack_qparams), got {qparams.shape}")

    b = ProgramBuilder(cfg, name)
    rx = b.region("x", "input", (m, kb * bi))
    wk = "const" if w is not None else "input"
    rw = b.region("w", wk, (nb, kb, bo, bi), data=None if w is None else pack_weights(w, cfg))
    rq = None
    if requant:
        qk = "const" if qparams is not None else "input"
        rq = b.region("qp", qk, (nb, QPARAM_ROWS, bo), "int32", data=qparams)
    ro = b.region("out", "output", (m, nb * bo), "int8" if requant else "int32")
    b.meta.update(kind="matmul", m=m, n=n, k=k, tile_m=t.tile_m, tile_n=t.tile_n,
                  double_buffer=double_buffer)

    inp_slot = t.tile_m * kb
    wgt_slot = t.tile_n * kb
    acc_slot = t.tile_m * t.tile_n
    param_base = nbuf * acc_slot
    if rq is not None:  # per-channel parameters stay resident after the tiles
        b.load(Buffer.ACC, param_base, b.addr(rq, Buffer.ACC), 1, QPARAM_ROWS * nb)

    steps = [(n0, m0) for n0 in range(0, nb, t.tile_n) for m0 in range(0, m, t.tile_m)]
    for s, (n0, m0) in enumerate(steps):
        tn, tm = min(t.tile_n, nb - n0), min(t.tile_m, m - m0)
        slot = s % nbuf
        # --- load engine: weights at the start of each N tile, then the x tile
        first = True
        wait_free = s >= nbuf
        if m0 == 0:
            b.load(Buffer.WGT, (n0 // t.tile_n % nbuf) * wgt_slot,
                   b.addr(rw, Buffer.WGT, n0 * kb * bo * bi), 1, tn * kb, pop_next=wait_free)
            first = False
        b.load(Buffer.INP, slot * inp_slot, b.addr(rx, Buffer.INP, m0 * kb * bi), 1, tm * kb,
               pop_next=wait_free and first, push_next=True)
        # --- compute engine: GEMM over (n block, m row, k block), then requantize
        acc0 = slot * acc_slot
        wgt0 = (n0 // t.tile_n % nbuf) * wgt_slot
        b.gemm(acc0, slot * inp_slot, wgt0,
               [(tn, 1, 0, kb), (tm, tn, kb, 0), (kb, 0, 1, 1)], reset=True,
               pop_prev=True, pop_next=s >= nbuf, push_prev=True)
        if requant:  # bias, requantize, zero point and clamp in one pass
            b.alu(AluOp.REQUANT, acc0, acc0, param_base + QPARAM_ROWS * n0,
                  [(tm, tn, tn, 0), (tn, 1, 1, QPARAM_ROWS)], imm=imm, push_next=True)
        else:
            b.sync(Engine.COMPUTE, push_next=True)
        # --- store engine
        buf = Buffer.ACC8 if requant else Buffer.ACC
        b.store(buf, acc0, b.addr(ro, buf, (m0 * nb + n0) * bo * (1 if requant else 4)),
                tm, tn, nb, pop_prev=True, push_prev=True)
    # the last stores must finish before FINISH: take their tokens in order
    for _ in range(min(nbuf, len(steps)) - 1):
        b.sync(Engine.COMPUTE, pop_next=True)
    b.finish(pop_next=True)
    return b.build()


def reference_matmul(x: np.ndarray, w: np.ndarray, qparams: np.ndarray | None,
                     cfg: "HardwareConfig", output_zp: int = 0,
                     clamp: tuple[int, int] = (INT8_MIN, INT8_MAX)) -> np.ndarray:
    """numpy reference of :func:`matmul_program` on padded operands: int8 [M, NB*block_out]
    through the output stage of ``qparams`` ([NB, 3, block_out]), int32 without."""
    acc = sem.wrap_int32(x.astype(np.int64) @ pad_cols(w, cfg.block_in).astype(np.int64).T)
    n = w.shape[0]
    nb = ceil_div(n, cfg.block_out)
    out = np.zeros((x.shape[0], nb * cfg.block_out), dtype=np.int64)
    out[:, :n] = acc
    if qparams is None:
        return out.astype(np.int32)
    bias, mult, shift = unpack_qparams(qparams)
    return sem.output_stage(out, bias, mult, shift, output_zp, *clamp).astype(np.int8)
