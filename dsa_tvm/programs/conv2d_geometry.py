"""Geometry, DRAM layouts, packing and the numpy reference of the hand-written conv2d
programs (:mod:`.conv2d`), and the tile plan the emitter follows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..isa.formats import DRAM_SIZE_BITS, PAD_BITS
from ..isa.semantics import INT8_MAX, INT8_MIN
from .common import unpack_qparams

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

_MAX_SIZE = (1 << DRAM_SIZE_BITS) - 1
_MAX_PAD = (1 << PAD_BITS) - 1


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- geometry
def _pair(v, what: str) -> tuple[int, int]:
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    v = tuple(int(x) for x in v)
    if len(v) != 2:
        raise ValueError(f"{what} must be an int or a pair, got {v}")
    return v


def _pads(pad) -> tuple[int, int, int, int]:
    """int, (pad_h, pad_w) or (top, bottom, left, right)."""
    if isinstance(pad, (int, np.integer)):
        return (int(pad),) * 4
    p = tuple(int(x) for x in pad)
    if len(p) == 2:
        return p[0], p[0], p[1], p[1]
    if len(p) == 4:
        return p  # type: ignore[return-value]
    raise ValueError(f"pad must be an int, (pad_h, pad_w) or (top, bottom, left, right), got {p}")


def conv_output_size(h: int, w: int, kh: int, kw: int, stride=1, pad=0) -> tuple[int, int]:
    sh, sw = _pair(stride, "stride")
    pt, pb, pl, pr = _pads(pad)
    return (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1


@dataclass(frozen=True)
class ConvGeometry:
    """One conv layer and its blocked sizes on a config."""

    h: int
    w: int
    cin: int
    cout: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pb: int
    pl: int
    pr: int
    icb: int
    ocb: int

    @classmethod
    def make(cls, cfg: "HardwareConfig", h, w, cin, cout, kh, kw, stride=1, pad=0):
        sh, sw = _pair(stride, "stride")
        pt, pb, pl, pr = _pads(pad)
        for name, v in (("h", h), ("w", w), ("cin", cin), ("cout", cout), ("kh", kh),
                        ("kw", kw), ("stride", sh), ("stride", sw)):
            if v < 1:
                raise ValueError(f"conv2d: {name} must be >= 1, got {v}")
        if min(pt, pb, pl, pr) < 0 or max(pt, pb, pl, pr) > _MAX_PAD:
            raise ValueError(f"conv2d: padding must be in 0..{_MAX_PAD}, got {(pt, pb, pl, pr)}")
        g = cls(h, w, cin, cout, kh, kw, sh, sw, pt, pb, pl, pr,
                _ceil(cin, cfg.block_in), _ceil(cout, cfg.block_out))
        if g.oh < 1 or g.ow < 1:
            raise ValueError(f"conv2d: a {kh}x{kw} kernel does not fit the padded {h}x{w} input")
        return g

    @property
    def oh(self) -> int:
        return (self.h + self.pt + self.pb - self.kh) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pl + self.pr - self.kw) // self.sw + 1

    @property
    def row_skip(self) -> bool:
        """1-row kernels load only the image rows they use (every sh-th)."""
        return self.kh == 1

    def tile_rows(self, toh: int) -> int:
        return toh if self.row_skip else (toh - 1) * self.sh + self.kh

    @property
    def col_skip(self) -> bool:
        """1-column kernels with a column stride load only the pixels they use (a
        pixel-strided LOAD per tile row)."""
        return self.kw == 1 and self.sw > 1

    def tile_cols(self, tow: int) -> int:
        """Input columns of a tile in the scratchpad. When kw <= sw the tile is widened
        (with padding) to sw*tow columns so the oh and ow GEMM levels can merge."""
        if self.col_skip:
            return tow
        need = (tow - 1) * self.sw + self.kw
        return self.sw * tow if self.kw <= self.sw else need

    def tile_cols_used(self, tow: int) -> int:
        return tow if self.col_skip else (tow - 1) * self.sw + self.kw

    @property
    def col_step(self) -> int:
        """Image columns between neighbouring scratchpad columns of a tile."""
        return self.sw if self.col_skip else 1

    def col_of(self, ow0: int, j: int) -> int:
        """Image column of tile column ``j`` of the tile starting at output column ``ow0``."""
        return ow0 * self.sw - self.pl + j * self.col_step

    def row_of(self, oh0: int, i: int) -> int:
        """Image row of tile row ``i`` of the tile starting at output row ``oh0``."""
        if self.row_skip:
            return (oh0 + i) * self.sh - self.pt
        return oh0 * self.sh - self.pt + i

    @property
    def macs(self) -> int:
        return self.oh * self.ow * self.cout * self.kh * self.kw * self.cin


@dataclass(frozen=True)
class Conv2dTiling:
    tile_oh: int    # output rows per tile
    tile_ow: int    # output columns per tile
    tile_ocb: int   # output blocks (of block_out channels) per tile
    tile_icb: int   # input blocks (of block_in channels) per reduction chunk
    ocb_outer: bool = True  # loop order: output-block tiles outside spatial tiles


# --------------------------------------------------------------------------- packing
def pack_input(x: np.ndarray, cfg: "HardwareConfig") -> np.ndarray:
    """[H, W, C] int8 -> [H, W, ICB*block_in], channels zero padded."""
    h, w, c = x.shape
    p = np.zeros((h, w, _ceil(c, cfg.block_in) * cfg.block_in), dtype=np.int8)
    p[:, :, :c] = x
    return p


def pack_conv_weights(wt: np.ndarray, cfg: "HardwareConfig") -> np.ndarray:
    """[Cout, KH, KW, Cin] (OHWI) int8 -> [OCB, KH, KW, ICB, block_out, block_in]."""
    co, kh, kw, ci = wt.shape
    bo, bi = cfg.block_out, cfg.block_in
    ocb, icb = _ceil(co, bo), _ceil(ci, bi)
    p = np.zeros((ocb * bo, kh, kw, icb * bi), dtype=np.int8)
    p[:co, :, :, :ci] = wt
    return np.ascontiguousarray(p.reshape(ocb, bo, kh, kw, icb, bi).transpose(0, 2, 3, 4, 1, 5))


def pack_bias(bias: np.ndarray, cfg: "HardwareConfig") -> np.ndarray:
    """[Cout] int32 -> [OCB, block_out] int32, zero padded."""
    bias = np.asarray(bias)
    bo = cfg.block_out
    p = np.zeros(_ceil(len(bias), bo) * bo, dtype=np.int32)
    p[:len(bias)] = bias
    return p.reshape(-1, bo)


def unpack_output(out: np.ndarray, cout: int) -> np.ndarray:
    """[OH, OW, OCB*block_out] -> [OH, OW, Cout]."""
    return out[..., :cout]


# --------------------------------------------------------------------------- reference
def conv2d_acc_reference(x: np.ndarray, wt: np.ndarray, stride=1, pad=0,
                         input_zp: int = 0) -> np.ndarray:
    """Exact int32 (wrapped) accumulators of conv2d(pad(x, input_zp), wt): [OH, OW, Cout].

    ``x`` [H, W, C] int8 with C >= Cin (extra channels are ignored), ``wt`` [Cout, KH, KW, Cin].
    Sums of int8 products are exact in float64 (|sum| < 2**53), so BLAS does the work.
    """
    from ..isa import semantics as sem

    co, kh, kw, ci = wt.shape
    sh, sw = _pair(stride, "stride")
    pt, pb, pl, pr = _pads(pad)
    xp = np.pad(np.asarray(x)[:, :, :ci], ((pt, pb), (pl, pr), (0, 0)),
                constant_values=input_zp).astype(np.float64)
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(0, 1))[::sh, ::sw]
    oh, ow = win.shape[:2]
    cols = win.transpose(0, 1, 3, 4, 2).reshape(oh * ow, kh * kw * ci)   # (ky, kx, c)
    acc = cols @ wt.reshape(co, -1).astype(np.float64).T
    return sem.wrap_int32(acc.astype(np.int64)).reshape(oh, ow, co)


def output_clamp(requant: bool, relu: bool, output_zp: int,
                 clip: tuple[int, int] | None) -> tuple[int, int]:
    """(lo, hi) of the fused REQUANT clamp: ``clip`` (default the int8 range), with ``relu``
    raising lo to the output zero point."""
    if clip is not None and not requant:
        raise ValueError("conv2d: clip bounds apply to the int8 output stage (requant) only")
    lo, hi = (INT8_MIN, INT8_MAX) if clip is None else (int(clip[0]), int(clip[1]))
    if relu:
        lo = max(lo, output_zp)
    return lo, hi


def reference_conv2d(x: np.ndarray, wt: np.ndarray, qparams: np.ndarray | None, stride=1,
                     pad=0, bias: np.ndarray | None = None, input_zp: int = 0,
                     output_zp: int = 0, relu: bool = False,
                     clip: tuple[int, int] | None = None) -> np.ndarray:
    """numpy reference of :func:`conv2d_program`: [OH, OW, Cout] int8 (int32 without qparams).

    ``qparams`` is the packed [OCB, 3, block_out] table the program reads (bias, mult, shift
    rows: :func:`pack_qparams`); the output is the fused output stage
    ``clamp(rshift_round(wrap32(acc + bias) * mult, shift) + output_zp, lo, hi)`` with
    ``(lo, hi)`` = ``clip`` (default int8) and ``relu`` raising lo to ``output_zp``.
    Without qparams: int32 ``acc + bias`` (``bias`` [Cout] int32), ``relu`` clamps at 0.
    """
    from ..isa import semantics as sem

    co = wt.shape[0]
    acc = conv2d_acc_reference(x, wt, stride, pad, input_zp).astype(np.int64)
    if qparams is None:
        if bias is not None:
            acc = sem.wrap_int32(acc + np.asarray(bias, dtype=np.int64)[:co]).astype(np.int64)
        out = acc.astype(np.int32)
        return np.maximum(out, 0) if relu else out
    if bias is not None:
        raise ValueError("reference_conv2d: with qparams the bias is row 0 of the table "
                         "(pack_qparams(mult, shift, cfg, bias=...))")
    qb, mult, shift = unpack_qparams(qparams, co)
    lo, hi = output_clamp(True, relu, output_zp, clip)
    return sem.output_stage(acc, qb, mult, shift, output_zp, lo, hi).astype(np.int8)


# --------------------------------------------------------------------------- planning
@dataclass(frozen=True)
class _Plan:
    tiling: Conv2dTiling
    nbuf: int
    inp_slot: int
    wgt_slot: int
    acc_slot: int
    param_rows_per_ocb: int
    params_resident: bool
    block_loads: bool  # True: one 2-D LOAD per input tile; False: one per tile row

    @property
    def param_base(self) -> int:
        return self.nbuf * self.acc_slot


def _gemm_nest(g: ConvGeometry, toh: int, tow: int, tocb: int, ticb: int, cols: int):
    """(loops, peeled) of one tile's GEMM: ``loops`` <= 4 levels (extent, acc, inp, wgt),
    ``peeled`` the list of (acc, inp, wgt) base offsets of the GEMMs to emit."""
    row_in = (1 if g.row_skip else g.sh) * cols * ticb
    levels = [  # name, extent, acc, inp, wgt  (outermost first)
        ("ocb", tocb, 1, 0, g.kh * g.kw * ticb),
        ("oh", toh, tow * tocb, row_in, 0),
        ("ow", tow, tocb, (1 if g.col_skip else g.sw) * ticb, 0),
        ("ky", 1 if g.row_skip else g.kh, 0, cols * ticb, g.kw * ticb),
        ("kx", g.kw * ticb, 0, 1, 1),
    ]
    levels = [lv for lv in levels if lv[1] > 1]
    merged: list[tuple] = []
    for lv in levels:
        if merged:
            o = merged[-1]
            if all(o[k] == lv[k] * lv[1] for k in (2, 3, 4)):
                merged[-1] = (o[0] + "*" + lv[0], o[1] * lv[1], lv[2], lv[3], lv[4])
                continue
        merged.append(lv)
    peeled = [(0, 0, 0)]
    if len(merged) > 4:
        # peel the non-reduction level with the fewest iterations (prefer not ocb: the
        # simulator would regather the same input rows for every output block)
        cands = [i for i, lv in enumerate(merged) if lv[2] != 0]
        i = min(cands, key=lambda i: (merged[i][1], merged[i][0] == "ocb"))
        _, ext, a, b_, c = merged.pop(i)
        peeled = [(k * a, k * b_, k * c) for k in range(ext)]
    loops = [lv[1:] for lv in merged] or [(1, 0, 0, 0)]
    return loops, peeled


# --------------------------------------------------------------------------- program
