"""TIR compute definitions of the DSA's vector-unit layers, in the blocked DRAM layouts.

The MAC array only multiplies a row of ``block_in`` inputs by a full weight tile,
so everything without a dense channel reduction runs on the vector unit, whose
operands are accumulator rows: int8 tensors are loaded widened to int32 lanes
(ACC8), reduced or combined there, and leave through the fused REQUANT.

* :func:`window` — depthwise conv2d (``dw``), max and average pooling: a window
  reduction over a padded input tile, one channel per lane. (A depthwise conv
  can also run on the array with diagonal weight tiles: ``compute.conv2d`` with
  ``depthwise=True``; ``lowering.kinds`` picks the engine.)
* :func:`global_sum` — global average pooling: a sum over every pixel.
* :func:`eltwise` — residual add and rescale: one pixel in, one pixel out.

Stage names the schedules look up: ``pad`` (the input with its border, the ACC8
LOAD), ``acc`` (the int32 reduction or combination), ``requant`` (the output
stage) and ``y`` (the int8 result). Zero points never appear in the arithmetic:
the stages work on raw int8 values and the REQUANT bias removes the offset
(``region.py`` computes it per layer), which keeps every stage a single ALU op.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

from .compute import window_out_hw
from .intrinsics import SCALAR_AXPBY
from .names import SCALAR_REQUANT

WINDOW_KINDS = ("dw", "max", "avg")


@dataclass(frozen=True)
class WindowShape:
    """A per-channel window reduction over an image ``x[n, h, w, cb, c]``."""

    kind: str                           # "dw" | "max" | "avg"
    n: int
    h: int
    w: int
    cb: int                             # channel blocks
    kh: int
    kw: int
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    block: int
    pad_value: int                      # int8 border value: input zero point, -128 for max
    output_zp: int
    clip: tuple[int, int]

    @property
    def out_hw(self) -> tuple[int, int]:
        return window_out_hw(self)


@dataclass(frozen=True)
class GlobalSumShape:
    """Sum over all ``hw`` pixels of ``x[n, hw, cb, c]`` per channel."""

    n: int
    hw: int
    cb: int
    block: int
    output_zp: int
    clip: tuple[int, int]


@dataclass(frozen=True)
class EltwiseShape:
    """``rescale``: y = requant(x); ``add``: y = requant(a * a_mult + b * b_mult);
    ``scale``: y = requant(x * a_mult) (a per-channel constant addend rides in the
    output-stage bias); over ``p`` pixels of ``cb`` channel blocks."""

    kind: str                           # "rescale" | "add" | "scale"
    p: int
    cb: int
    block: int
    output_zp: int
    clip: tuple[int, int]
    a_mult: int = 1
    b_mult: int = 0


def _output_stage(acc: te.Tensor, params: te.Tensor, zp: int, clip: tuple[int, int],
                  widen: bool = False) -> te.Tensor:
    """The ``requant`` and ``y`` stages; ``params[cb, 3, c]`` holds bias, multiplier, shift
    and the channel block is the second-to-last axis of ``acc``."""
    lo, hi = clip

    def rq_value(*idx):
        ob, o = idx[-2], idx[-1]
        v = acc(*idx).astype("int32") if widen else acc(*idx)
        return tirx.call_pure_extern("int32", SCALAR_REQUANT, v, params[ob, 0, o],
                                     params[ob, 1, o], params[ob, 2, o], zp, lo, hi)

    rq = te.compute(acc.shape, rq_value, name="requant")
    return te.compute(acc.shape, lambda *i: rq(*i).astype("int8"), name="y")


def window(s: WindowShape) -> tirx.PrimFunc:
    """Depthwise conv (``acc = sum x * w[c]``), max pool (``acc = max x``) or average pool
    (``acc = sum x``) over every window of the padded input, then the output stage."""
    if s.kind not in WINDOW_KINDS:
        raise ValueError(f"window kind must be one of {WINDOW_KINDS}, got {s.kind!r}")
    b = s.block
    pt, pl, pb, pr = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    oh, ow = s.out_hw
    x = te.placeholder((s.n, s.h, s.w, s.cb, b), "int8", name="x")
    params = te.placeholder((s.cb, 3, b), "int32", name="params")
    border = tirx.const(s.pad_value, "int8")

    def pad_value(n, h, w_, c, i):
        inside = tirx.all(h >= pt, h < s.h + pt, w_ >= pl, w_ < s.w + pl)
        return tirx.if_then_else(inside, x[n, h - pt, w_ - pl, c, i], border)

    xp = te.compute((s.n, s.h + pt + pb, s.w + pl + pr, s.cb, b), pad_value, name="pad")
    rkh = te.reduce_axis((0, s.kh), "kh")
    rkw = te.reduce_axis((0, s.kw), "kw")

    def tap(n, y, x_, c, i):
        return xp[n, y * sh + rkh * dh, x_ * sw + rkw * dw, c, i].astype("int32")

    args = [x]
    if s.kind == "dw":
        wgt = te.placeholder((s.cb, s.kh, s.kw, b), "int8", name="w")
        args.append(wgt)
        acc = te.compute((s.n, oh, ow, s.cb, b), lambda n, y, x_, c, i: te.sum(
            tap(n, y, x_, c, i) * wgt[c, rkh, rkw, i].astype("int32"), axis=[rkh, rkw]),
            name="acc")
    else:
        reducer = te.max if s.kind == "max" else te.sum
        acc = te.compute((s.n, oh, ow, s.cb, b), lambda n, y, x_, c, i: reducer(
            tap(n, y, x_, c, i), axis=[rkh, rkw]), name="acc")
    out = _output_stage(acc, params, s.output_zp, s.clip)
    return te.create_prim_func(args + [params, out])


def global_sum(s: GlobalSumShape) -> tirx.PrimFunc:
    """``acc[n, cb, c] = sum over hw of x[n, hw, cb, c]``, then the output stage."""
    b = s.block
    x = te.placeholder((s.n, s.hw, s.cb, b), "int8", name="x")
    params = te.placeholder((s.cb, 3, b), "int32", name="params")
    r = te.reduce_axis((0, s.hw), "hw")
    acc = te.compute((s.n, s.cb, b), lambda n, c, i: te.sum(x[n, r, c, i].astype("int32"),
                                                            axis=r), name="acc")
    out = _output_stage(acc, params, s.output_zp, s.clip)
    return te.create_prim_func([x, params, out])


def eltwise(s: EltwiseShape) -> tirx.PrimFunc:
    """``rescale``: the output stage straight on the widened input; ``add``:
    ``acc = a * a_mult + b * b_mult`` first (both int8, widened)."""
    shape = (s.p, s.cb, s.block)
    params = te.placeholder((s.cb, 3, s.block), "int32", name="params")
    if s.kind == "rescale":
        x = te.placeholder(shape, "int8", name="x")
        return te.create_prim_func([x, params, _output_stage(x, params, s.output_zp, s.clip,
                                                             widen=True)])
    if s.kind == "scale":
        x = te.placeholder(shape, "int8", name="x")
        acc = te.compute(shape, lambda *i: x(*i).astype("int32") * tirx.IntImm("int32", s.a_mult),
                         name="acc")
        return te.create_prim_func([x, params, _output_stage(acc, params, s.output_zp, s.clip)])
    if s.kind != "add":
        raise ValueError(f"eltwise kind must be 'rescale', 'add' or 'scale', got {s.kind!r}")
    a = te.placeholder(shape, "int8", name="a")
    b = te.placeholder(shape, "int8", name="b")
    acc = te.compute(shape, lambda *i: tirx.call_pure_extern(
        "int32", SCALAR_AXPBY, a(*i).astype("int32"), b(*i).astype("int32"), s.a_mult, s.b_mult),
        name="acc")
    return te.create_prim_func([a, b, params, _output_stage(acc, params, s.output_zp, s.clip)])
