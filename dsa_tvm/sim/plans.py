"""Execution plans for loop-nest instructions, computed once per loop shape.

A program repeats the same nest shape with different base addresses (one
GEMM per tile), so the index arithmetic, the regrouping of levels and the
hazard analysis are cached by shape and relative offsets, not recomputed for
every instruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..isa.instructions import PAIRED_B_OPS, AluLoop, AluOp, GemmLoop

_EXACT_F32 = 1 << 24  # float32 sums of int8 products are exact up to here


def nest_offsets(loops, attr: str) -> np.ndarray:
    """Offset of every loop point from the base, shaped by the extents (outermost first)."""
    idx = np.zeros([lp.extent for lp in loops], dtype=np.int64)
    for k, lp in enumerate(loops):
        s = getattr(lp, attr)
        if s and lp.extent > 1:
            shape = [1] * len(loops)
            shape[k] = lp.extent
            idx = idx + (np.arange(lp.extent, dtype=np.int64) * s).reshape(shape)
    return idx


def _as_slice(rel: np.ndarray) -> int | None:
    """Length if ``rel`` is 0, 1, 2, ... (a contiguous run), else None."""
    flat = rel.reshape(-1)
    n = len(flat)
    if n and flat[0] == 0 and flat[-1] == n - 1 and np.array_equal(flat, np.arange(n)):
        return n
    return None


@dataclass(frozen=True)
class GemmPlan:
    """Levels regrouped as B (all operands move), M (weight fixed), N (input fixed),
    K (accumulator fixed: the reduction), so a nest is one batched matrix product."""

    nb: int
    nm: int
    nn: int
    nk: int
    inp: np.ndarray        # (nb, nm, nk) offsets
    wgt: np.ndarray        # (nb, nn, nk)
    acc: np.ndarray        # (nb * nm * nn,)
    inp_run: int | None    # contiguous run length, if the offsets are 0..n-1
    acc_run: int | None
    acc_injective: bool
    dtype: type


@lru_cache(maxsize=4096)
def gemm_plan(loops: tuple[GemmLoop, ...], block_in: int) -> GemmPlan:
    live = [lp for lp in loops if lp.extent > 1]
    groups: dict[str, list[GemmLoop]] = {"B": [], "M": [], "N": [], "K": []}
    for lp in live:
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
    cb = len(groups["B"])
    cm = cb + len(groups["M"])
    cn = cm + len(groups["N"])
    full = slice(None)
    inp = nest_offsets(order, "inp")[(full,) * cm + (0,) * (cn - cm)].reshape(nb, nm, nk)
    wgt = nest_offsets(order, "wgt")[(full,) * cb + (0,) * (cm - cb)].reshape(nb, nn, nk)
    acc = nest_offsets(order, "acc")[(Ellipsis,) + (0,) * (len(order) - cn)].reshape(-1)
    dtype = np.float32 if nk * block_in * 128 * 128 <= _EXACT_F32 else np.float64
    for a in (inp, wgt, acc):
        a.setflags(write=False)
    return GemmPlan(nb, nm, nn, nk, inp, wgt, acc, _as_slice(inp), _as_slice(acc),
                    len(np.unique(acc)) == len(acc), dtype)


@dataclass(frozen=True)
class AluPlan:
    """Index offsets regrouped as (reduction steps, vector): levels that revisit a
    destination row are stepped in loop order, the others run as one vector op.
    ``vectorized`` is False when an iteration reads a row another iteration writes;
    then the instruction runs point by point, in loop order."""

    dst: np.ndarray   # (steps, n) offsets from dst_base
    a: np.ndarray     # from dst_base as well (a_base - dst_base folded in)
    b: np.ndarray | None
    vectorized: bool
    in_place: bool    # a is dst at every point


@lru_cache(maxsize=4096)
def alu_plan(loops: tuple[AluLoop, ...], a_off: int, b_off: int | None, op: AluOp) -> AluPlan:
    shape = [lp.extent for lp in loops]
    d = nest_offsets(loops, "dst")
    a = nest_offsets(loops, "a") + a_off
    b = None if b_off is None else nest_offsets(loops, "b") + b_off
    red = [k for k, lp in enumerate(loops) if lp.dst == 0 and lp.extent > 1]
    perm = red + [k for k in range(len(loops)) if k not in red]
    nred = int(np.prod([shape[k] for k in red], dtype=np.int64))

    def regroup(x):
        return np.ascontiguousarray(x.transpose(perm).reshape(nred, -1))

    d2, a2 = regroup(d), regroup(a)
    b2 = None if b is None else regroup(b)
    vec = _alu_vectorizable(op, d.reshape(-1), a.reshape(-1),
                            None if b is None else b.reshape(-1), d2[0])
    return AluPlan(d2, a2, b2, vec, bool(np.array_equal(a2, d2)))


def _alu_vectorizable(op: AluOp, d, a, b, d_step) -> bool:
    if len(np.unique(d_step)) != len(d_step):
        return False
    written = np.unique(d)
    reads = [] if op == AluOp.MOV else [a]
    if b is not None:
        reads.append(b)
        if op in PAIRED_B_OPS:
            reads.append(b + 1)
    for r in reads:
        hit = np.isin(r, written)
        if hit.any() and not np.array_equal(r[hit], d[hit]):
            return False
    return True
