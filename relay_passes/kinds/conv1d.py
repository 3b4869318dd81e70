"""conv1d as a conv2d of height 1: ``quantize(act(conv1d(dq(x), dq(W)) [+ dq(bias)]))``, NCW/OIW.

An NCW tensor is an NCHW tensor with H = 1, byte for byte, so the match is read
into the existing :class:`~dsa_tvm.layers.ir.Conv2d` layer with every activation
viewed as (N, C, 1, W) and the weight as (O, I/g, 1, K): strides (1, s), pads
(0, left, 0, right), dilation (1, d). The conv2d kind's constraints, REQUANT and
lowering then apply unchanged (groups 1 or depthwise, like conv2d).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from dsa_tvm.isa.formats import PAD_BITS
from dsa_tvm.layers.ir import Layer, QTensor

from . import conv2d, image
from .common import MAX_DMA, MAX_PAD, Constraint, common_constraints, layouts, viewed
from .match import Match, NotAMatch, Operand, Reader, Root
from .spec import Kind, conv_variants
from .weights import weight_constraints


def h1(shape: tuple[int, ...]) -> tuple[int, ...]:
    """(N, C, W) -> (N, C, 1, W); (O, I, K) -> (O, I, 1, K)."""
    if len(shape) != 3:
        raise NotAMatch(f"conv1d operand of shape {shape} is not 3-D")
    return (shape[0], shape[1], 1, shape[2])


def operand_h1(op: Operand) -> Operand:
    value = None if op.value is None else op.value.reshape(h1(op.value.shape))
    return dataclasses.replace(op, shape=h1(op.shape), value=value)


def _read(r: Reader, root: Root) -> Match:
    fused, body = r.activation(root.body)
    bias, body = r.bias_add(body)
    op = r.need(body, "relax.nn.conv1d")
    m = root.match("conv1d", op, [operand_h1(r.operand(op.args[0]))],
                   weight=operand_h1(r.operand(op.args[1])), bias=bias, act=fused)
    return dataclasses.replace(m, out_shape=h1(m.out_shape))


def attrs_2d(m: Match) -> SimpleNamespace:
    """The conv1d attributes as the conv2d (H = 1) attributes they mean."""
    a = m.op.attrs
    pl, pr = (int(p) for p in a.padding)
    return SimpleNamespace(
        strides=(1, int(a.strides[0])), padding=(0, pl, 0, pr), dilation=(1, int(a.dilation[0])),
        groups=int(a.groups), data_layout="NCHW" if str(a.data_layout) == "NCW" else str(a.data_layout),
        kernel_layout="OIHW" if str(a.kernel_layout) == "OIW" else str(a.kernel_layout),
        out_layout=("NCHW" if str(a.out_layout or a.data_layout) == "NCW"
                    else str(a.out_layout or a.data_layout)))


def as_conv2d(m: Match) -> Match:
    """The match with a stand-in anchor carrying conv2d attributes (what conv2d's tests read)."""
    return dataclasses.replace(m, op=SimpleNamespace(attrs=attrs_2d(m), op=m.op.op))


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    return conv2d.layer_2d(as_conv2d(m), name, inputs, output)


KINDS = (Kind(
    "conv1d", 950, conv_variants("relax.nn.conv1d"), _read,
    common_constraints(conv2d.rescale_factors) + weight_constraints(
        channel_axis=lambda m: 0, channels=lambda m: m.out_shape[1],
        rows=lambda m, w: w.reshape(w.shape[0], -1)) + [
        Constraint("layout", "NCW data, OIW kernel", layouts("NCW", "OIW")),
        Constraint("groups", "groups = 1 or depthwise (groups = C_in = C_out)",
                   viewed(as_conv2d, conv2d.groups)),
        Constraint("padding", f"padding <= {MAX_PAD} per side (LOAD pad fields, "
                   f"{PAD_BITS} bits)", viewed(as_conv2d, image.pads)),
        Constraint("strides", "stride < 2^(input address bits)", viewed(as_conv2d, image.strides)),
        Constraint("dma", f"W*ceil(C/block_in) <= {MAX_DMA} (16-bit DMA fields)", image.image_dma),
        Constraint("tile", "K <= {cfg.inp_depth} input rows and <= {cfg.wgt_depth} weight "
                   "tiles (one-pixel tile)", conv2d.tile),
    ],
    _to_layer, "Conv 1-D as 2-D with H = 1 (+ bias, + Relu/Clip)", "relax.nn.conv1d"),)
