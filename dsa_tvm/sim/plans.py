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

from ..intmath import ceil_div
from ..isa.instructions import AluLoop, AluOp, GemmLoop, b_rows

#: int8 x int8 products summed exactly in float32: every partial sum of at most this many
#: products of magnitude <= 128 * 128 = 2**14 is an integer of magnitude <= 2**24
EXACT_F32_PRODUCTS = (1 << 24) // (128 * 128)


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
    K (accumulator fixed: the reduction), so a nest is one batched matrix product.

    The reduction is cut into ``nchunk`` chunks of ``chunk`` input blocks (at most
    EXACT_F32_PRODUCTS products per output each), so each chunk's float32 sums are
    exact integers; the chunk results are added in int32 (wrapping, like the
    accumulator). When ``nk`` does not split evenly the last chunk is padded: the
    padding repeats a real input row and meets zero weight rows."""

    nb: int
    nm: int
    nn: int
    nk: int
    nchunk: int
    chunk: int
    inp: np.ndarray        # (nb, nchunk, nm, chunk) input row offsets (padding: a real row)
    wgt: np.ndarray        # (nb, nn, nk) weight tile offsets
    acc: np.ndarray        # (nb * nm * nn,)
    inp_run: int | None    # contiguous run length, if the offsets are 0..n-1 (one chunk)
    acc_run: int | None
    acc_injective: bool
    wgt_lo: int            # smallest and largest weight tile offset read
    wgt_hi: int


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
    max_blocks = max(1, EXACT_F32_PRODUCTS // block_in)
    nchunk = ceil_div(nk, max_blocks)
    chunk = ceil_div(nk, nchunk)
    inp_run = _as_slice(inp) if nchunk == 1 else None
    if nchunk * chunk > nk:
        inp = np.concatenate([inp, np.repeat(inp[:, :, :1], nchunk * chunk - nk, axis=2)],
                             axis=2)
    inp = np.ascontiguousarray(inp.reshape(nb, nm, nchunk, chunk).transpose(0, 2, 1, 3))
    for a in (inp, wgt, acc):
        a.setflags(write=False)
    return GemmPlan(nb, nm, nn, nk, nchunk, chunk, inp, wgt, acc, inp_run, _as_slice(acc),
                    len(np.unique(acc)) == len(acc), int(wgt.min()), int(wgt.max()))


@dataclass(frozen=True)
class AluPlan:
    """Index offsets regrouped as (reduction steps, vector): levels that revisit a
    destination row are stepped in loop order, the others run as one vector op.
    ``vectorized`` is False when an iteration reads a row another iteration writes;
    then the instruction runs point by point, in loop order. ``*_run`` says that
    every step's offsets of that operand are a contiguous run (``x[r, 0] + 0..n-1``),
    so the rows are a slice."""

    dst: np.ndarray   # (steps, n) offsets from dst_base
    a: np.ndarray     # from dst_base as well (a_base - dst_base folded in)
    b: np.ndarray | None
    vectorized: bool
    in_place: bool    # a is dst at every point
    dst_run: bool
    a_run: bool
    b_run: bool
    b_period: int | None  # every step's b offsets repeat with this period (< n), if any
    sum_steps: bool = False  # an in-place ADD over steps that reads no row it writes:
    #                          dst + the sum of every step's b rows (int32 wraps, so the
    #                          order of the additions does not matter)


def _period(x: np.ndarray | None) -> int | None:
    """Smallest p < n dividing n with x[r] = tile(x[r, :p]) for every step r, else None
    (then the p parameter rows of a step broadcast over its n points)."""
    if x is None:
        return None
    n = x.shape[1]
    for p in range(1, n // 2 + 1):
        if n % p == 0 and (x.reshape(x.shape[0], n // p, p) == x[:, None, :p]).all():
            return p
    return None


def _runs(x: np.ndarray | None) -> bool:
    if x is None:
        return False
    return bool((x == x[:, :1] + np.arange(x.shape[1], dtype=np.int64)).all())


@lru_cache(maxsize=4096)
def alu_plan(loops: tuple[AluLoop, ...], a_off: int, b_off: int | None, op: AluOp,
             block_out: int | None = None) -> AluPlan:
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
                            None if b is None else b.reshape(-1), d2[0], block_out)
    for x in (d2, a2, b2):
        if x is not None:
            x.setflags(write=False)
    b_run = _runs(b2)
    in_place = bool(np.array_equal(a2, d2))
    sums = bool(vec and in_place and op == AluOp.ADD and b2 is not None and nred > 1
                and not np.isin(b2, d2).any())
    return AluPlan(d2, a2, b2, vec, in_place, _runs(d2), _runs(a2),
                   b_run, None if b_run else _period(b2), sums)


def _alu_vectorizable(op: AluOp, d, a, b, d_step, block_out: int | None = None) -> bool:
    if len(np.unique(d_step)) != len(d_step):
        return False
    written = np.unique(d)
    reads = [] if op == AluOp.MOV else [a]
    if b is not None:
        reads += [b + k for k in range(b_rows(op, block_out))]
    for r in reads:
        hit = np.isin(r, written)
        if hit.any() and not np.array_equal(r[hit], d[hit]):
            return False
    return True
