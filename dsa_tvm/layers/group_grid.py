"""Weights on per-group grids (GGUF Q4_1's ``w = d * q + min``) as a :class:`GroupedDense`.

A Q4_1 weight has one step ``d`` and one minimum per group of 32 consecutive input rows of
each output channel. :func:`group_grid` finds that grid in real weights (exactly, when they
are on one: the group's minimum and maximum are codes 0 and 15) and :func:`grouped_dense`
folds it, the input and output scales, zero points and bias into the integer layer: every
real number becomes an int16 factor per group, one shift per layer and a REQUANT per
channel, sized so that no int32 the array or the ALU makes can wrap for any input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa import semantics as sem
from .ir import BytePlanes, GroupedDense, QTensor, Requant
from .reference import PLANE_SHIFT

#: the int16 factors' bound (the table rows are loaded from int16 DRAM)
FACTOR_MAX = 32767
#: the int32 every MUL, MAC and the sum over groups must stay within
INT32_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class GroupGrid:
    """``w[n, k] = step[n, g] * codes[n, k] + offset[n, g]`` for ``k`` in group ``g``; the
    codes are centred (``[-2^(b-1), 2^(b-1) - 1]``), so ``offset = min + 2^(b-1) * step``."""

    codes: np.ndarray    # int8 [N, K]
    step: np.ndarray     # float64 [N, G]
    offset: np.ndarray   # float64 [N, G]
    group: int

    def values(self) -> np.ndarray:
        """The weights the grid holds, float64 [N, K]."""
        k = self.codes.shape[1]
        rep = lambda a: np.repeat(a, self.group, axis=1)[:, :k]  # noqa: E731
        return rep(self.step) * self.codes + rep(self.offset)


def group_grid(w: np.ndarray, group: int, bits: int = 4) -> GroupGrid:
    """The ``bits``-bit grid from each group's minimum to its maximum in ``2^bits - 1``
    steps, per output channel (``w`` is [N, K], groups run along K; a partial last group
    keeps its own grid). A group already on a coarser uniform grid of at most ``2^bits``
    levels (GGUF Q4_0's symmetric one, an integer zero point's) keeps that grid, exactly.
    A constant group has step 0 and codes at the grid's middle."""
    w = np.asarray(w, np.float64)
    if w.ndim != 2 or not w.size:
        raise ValueError(f"group_grid needs a non-empty [N, K] weight, got shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("group_grid: the weight holds NaN or infinity")
    if group < 1 or not 2 <= bits <= 8:
        raise ValueError(f"group_grid: group {group} (>= 1) and bits {bits} (2..8)")
    n, k = w.shape
    ng = -(-k // group)
    pad = np.full((n, ng * group), np.nan)
    pad[:, :k] = w
    blocks = pad.reshape(n, ng, group)
    lo, hi = np.nanmin(blocks, axis=2), np.nanmax(blocks, axis=2)
    step = _own_steps(blocks, lo, hi, bits)
    safe = np.where(step > 0, step, 1.0)
    q = np.rint((blocks - lo[..., None]) / safe[..., None])
    q = np.where(step[..., None] > 0, q, 2 ** (bits - 1))
    mid = 2 ** (bits - 1)
    codes = (np.clip(q, 0, 2**bits - 1) - mid).reshape(n, ng * group)[:, :k]
    offset = lo + mid * step
    return GroupGrid(codes.astype(np.int8), step, offset, group)


def _own_steps(blocks: np.ndarray, lo: np.ndarray, hi: np.ndarray, bits: int) -> np.ndarray:
    """Each group's step: the grid its values already lie on when they take at most
    ``2^bits`` levels of one step from the minimum (the smallest gap between two of its
    values), else the minimum-to-maximum grid's ``(max - min) / (2^bits - 1)``."""
    levels = 2**bits - 1
    even = (hi - lo) / levels
    tol = 1e-6 * np.maximum(np.abs(lo), np.abs(hi))[..., None]
    gaps = np.diff(np.sort(blocks, axis=2), axis=2)          # NaN pads sort last
    gaps = np.where(gaps > tol, gaps, np.inf)
    own = np.min(np.where(np.isnan(gaps), np.inf, gaps), axis=2, initial=np.inf)
    finite = np.isfinite(own) & (own > 0)
    span = np.rint((hi - lo) / np.where(finite, own, 1.0))      # the grid's steps, min to max
    own = np.where(finite, (hi - lo) / np.maximum(span, 1), 1.0)  # from the extremes: precise
    q = (blocks - lo[..., None]) / own[..., None]
    on_grid = np.nanmax(np.abs(q - np.rint(q)) * own[..., None], axis=2) <= tol[..., 0]
    return np.where(finite & on_grid & (span <= levels), own, even)


def _group_sizes(k: int, group: int) -> np.ndarray:
    ng = -(-k // group)
    sizes = np.full(ng, group, np.int64)
    sizes[-1] = k - group * (ng - 1)
    return sizes


def grouped_dense(name: str, x: QTensor, y: QTensor, grid: GroupGrid,
                  bias: np.ndarray | None = None, clip: tuple[int, int] = (-128, 127)
                  ) -> GroupedDense | tuple[BytePlanes, GroupedDense]:
    """The integer layer computing ``y = x @ grid.values().T + bias`` (reals) from int8
    ``x`` (any zero point) into ``y`` (int8, or int16 with REQUANT's wide clip); an int16
    ``x`` (zero point 0) becomes its byte planes and a plane grouped dense.

    Per channel, the factors ``scales = round(u * step)`` and ``offsets = round(u *
    offset)`` take the largest ``u`` that keeps both within int16 and every group's
    ``P * scale + S * offset`` within int32 for any int8 input (each byte plane is one);
    the layer's ``shift`` is the smallest that keeps the sum over groups (and planes) and
    the bias within int32 too. One accumulator unit is then ``s_x * 2^shift / u`` of the
    output's reals (``s_x * 256 * 2^shift / u`` with planes)."""
    planes = x.dtype == "int16"
    if planes and x.zero_point:
        raise ValueError(f"{name}: an int16 input needs zero point 0 (its byte planes), got "
                         f"{x.zero_point}")
    codes, step, offset = grid.codes.astype(np.int64), grid.step, grid.offset
    n, k = codes.shape
    sizes = _group_sizes(k, grid.group)
    b = np.zeros(n) if bias is None else np.asarray(bias, np.float64).reshape(n)
    if not (np.isfinite(b).all() and np.isfinite(step).all() and np.isfinite(offset).all()):
        raise ValueError(f"{name}: the grid or bias holds NaN or infinity")
    cmax = float(np.abs(codes).max(initial=1))
    p_max, s_max = sizes * 128 * cmax, sizes * 128.0            # |P|, |S| for any input
    worst = np.abs(step) * p_max + np.abs(offset) * s_max        # [N, G] per unit of u
    big = np.maximum(np.abs(step), np.abs(offset)).max(axis=1)
    u = np.minimum(FACTOR_MAX / np.where(big > 0, big, 1.0),
                   INT32_LIMIT / np.where(worst.max(axis=1) > 0, worst.max(axis=1), 1.0))
    # one rounding must not push a factor past the bounds: stay a hair inside
    u *= 1 - 1e-9
    scales = np.rint(step * u[:, None]).astype(np.int64)
    offsets = np.rint(offset * u[:, None]).astype(np.int64)
    s_x = float(x.scale)
    # the zero point's share, exact in reals: sum_k (x - zx) w = P + S terms - zx sum_k w
    reals_of_zp = s_x * x.zero_point * (step * _sums(codes, grid.group)
                                        + offset * sizes).sum(axis=1)
    v_worst = (np.abs(scales) * p_max + np.abs(offsets) * s_max).sum(axis=1)
    if planes:                                  # the lo plane's sums add 1/256 as much
        v_worst = v_worst * (1 + 2.0**-PLANE_SHIFT)
        s_x *= 2**PLANE_SHIFT                   # a hi code is 256 input steps
    for shift in range(32 - PLANE_SHIFT * planes):
        unit = s_x * 2.0**shift / u                              # reals per accumulator unit
        acc_bias = np.rint((b - reals_of_zp) / unit)
        if (v_worst / 2.0**shift + np.abs(acc_bias) + 1).max() <= INT32_LIMIT:
            break
    else:
        raise ValueError(f"{name}: the bias does not fit int32 at any shift")
    mult, rshift = sem.quantize_multipliers(unit / float(y.scale))
    rq = Requant(mult, rshift, int(y.zero_point), tuple(clip))
    ints = (grid.codes, grid.group, scales.astype(np.int16), offsets.astype(np.int16), shift,
            acc_bias.astype(np.int32), rq)
    if not planes:
        return GroupedDense(name, x, y, *ints)
    rows = tuple(x.shape)
    split = QTensor(f"{name}/planes", rows[:-2] + (2 * rows[-2], rows[-1]), x.scale, 0)
    return (BytePlanes(f"{name}/planes", x, split),
            GroupedDense(name, split, y, *ints, planes=True))


def _sums(codes: np.ndarray, group: int) -> np.ndarray:
    """Per channel and group, the sum of its codes, [N, G]."""
    n, k = codes.shape
    ng = -(-k // group)
    pad = np.zeros((n, ng * group), np.int64)
    pad[:, :k] = codes
    return pad.reshape(n, ng, group).sum(axis=2)


#: the grids :func:`find_grid` tries, in order: 4 bits before 8, larger groups first
#: (fewer factors to move); GGUF's Q4_1 and Q8_1 use 32
GRID_BITS = (4, 8)
GRID_GROUPS = (128, 64, 32, 16)
#: how close (relative to the weight's largest magnitude) a weight must be to the grid
GRID_TOLERANCE = 4e-6
_FOUND: dict[bytes, GroupGrid | None] = {}


def find_grid(w: np.ndarray) -> GroupGrid | None:
    """The grid a float [N, K] weight lies on (within float32 rounding), or None: a
    weight quantized per group (``quantize_onnx(..., weight_group=...)``, a GGUF file)
    keeps its grid however it was stored. Remembered by content: the front end asks
    about each weight several times."""
    import hashlib

    w = np.ascontiguousarray(w, np.float32)
    key = hashlib.blake2b(w.tobytes(), digest_size=16).digest() + repr(w.shape).encode()
    if key not in _FOUND:
        if len(_FOUND) > 4096:
            _FOUND.clear()
        _FOUND[key] = _search(w)
    return _FOUND[key]


def _search(w: np.ndarray) -> GroupGrid | None:
    if w.ndim != 2 or not w.size or not np.isfinite(w).all():
        return None
    tol = GRID_TOLERANCE * float(np.abs(w).max())
    sample = w[:64]            # a grid that misses these channels misses: try them first

    def fits(x: np.ndarray, group: int, bits: int) -> GroupGrid | None:
        g = group_grid(x, group, bits)
        return g if np.abs(g.values() - x).max() <= tol else None

    for bits in GRID_BITS:
        for group in GRID_GROUPS:
            if group <= w.shape[1] and fits(sample, group, bits) is not None:
                found = fits(w, group, bits)
                if found is not None:
                    return found
    return None
