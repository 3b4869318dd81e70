"""TIR compute definitions of DSA layers, in the DSA's blocked DRAM layouts.

Activations are NHWC with channels padded to the array block and split into
blocks: ``x[n, h, w, cb, c]``; weights are packed
``w[ob, kh, kw, ib, o, i]`` (block_out x block_in tiles); the per-channel
output-stage table is ``params[ob, 3, o]`` (bias, multiplier, shift).

Each function returns a PrimFunc whose stages are named so the schedules can
find them: ``pad`` (the input with its zero-point border), ``conv`` (the int32
reduction), ``requant`` (the output stage) and ``y`` (the int8 result).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

from dsa_tvm import intmath

from .names import SCALAR_REQUANT


def window_out_hw(s) -> tuple[int, int]:
    """Output height and width of a sliding window (conv or pool) over ``s.h x s.w``
    with ``s.kh x s.kw``, ``s.strides``, ``s.padding`` (t, l, b, r) and ``s.dilation``."""
    return intmath.window_out_hw(s.h, s.w, (s.kh, s.kw), s.strides, s.padding, s.dilation)


@dataclass(frozen=True)
class ConvShape:
    """One image-batch conv2d (groups = 1) in blocked form."""

    n: int
    h: int
    w: int
    icb: int            # input channel blocks
    ocb: int            # output channel blocks
    kh: int
    kw: int
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    block_in: int
    block_out: int
    input_zp: int
    output_zp: int
    clip: tuple[int, int]
    #: depthwise on the array: input block ``ob`` only feeds output block ``ob`` through
    #: diagonal weight tiles (``icb`` = 1 block per group, the image has ``ocb`` blocks)
    depthwise: bool = False

    @property
    def out_hw(self) -> tuple[int, int]:
        return window_out_hw(self)


def conv2d(s: ConvShape) -> tirx.PrimFunc:
    """conv2d + output stage; a dense layer is the 1x1 case on an (M, 1) image, a
    depthwise conv (``s.depthwise``) one whose weight tiles are diagonal."""
    bi, bo = s.block_in, s.block_out
    pt, pl, pb, pr = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    oh, ow = s.out_hw
    in_blocks = s.ocb if s.depthwise else s.icb
    x = te.placeholder((s.n, s.h, s.w, in_blocks, bi), "int8", name="x")
    w = te.placeholder((s.ocb, s.kh, s.kw, s.icb, bo, bi), "int8", name="w")
    params = te.placeholder((s.ocb, 3, bo), "int32", name="params")
    zp = tirx.const(s.input_zp, "int8")

    def pad_value(n, h, w_, c, i):
        inside = tirx.all(h >= pt, h < s.h + pt, w_ >= pl, w_ < s.w + pl)
        return tirx.if_then_else(inside, x[n, h - pt, w_ - pl, c, i], zp)

    xp = te.compute((s.n, s.h + pt + pb, s.w + pl + pr, in_blocks, bi), pad_value, name="pad")
    rkh = te.reduce_axis((0, s.kh), "kh")
    rkw = te.reduce_axis((0, s.kw), "kw")
    ric = te.reduce_axis((0, s.icb), "icb")
    ri = te.reduce_axis((0, bi), "i")
    acc = te.compute(
        (s.n, oh, ow, s.ocb, bo),
        lambda n, y, x_, ob, o: te.sum(
            xp[n, y * sh + rkh * dh, x_ * sw + rkw * dw, ob + ric if s.depthwise else ric,
               ri].astype("int32")
            * w[ob, rkh, rkw, ric, o, ri].astype("int32"), axis=[rkh, rkw, ric, ri]),
        name="conv")
    lo, hi = s.clip
    rq = te.compute(
        (s.n, oh, ow, s.ocb, bo),
        lambda n, y, x_, ob, o: tirx.call_pure_extern(
            "int32", SCALAR_REQUANT, acc[n, y, x_, ob, o], params[ob, 0, o], params[ob, 1, o],
            params[ob, 2, o], s.output_zp, lo, hi),
        name="requant")
    out = te.compute((s.n, oh, ow, s.ocb, bo), lambda *i: rq(*i).astype("int8"), name="y")
    return te.create_prim_func([x, w, params, out])
