"""conv2d: ``quantize(act(conv2d(dq(x), dq(W)) [+ dq(bias)]))``, NCHW/OIHW, groups 1 or depthwise.

The REQUANT factor is ``M[c] = s_in * s_w[c] / s_out``; the int32 bias is used as is
when its scale is ``s_in * s_w[c]`` (what quantizers emit), else rescaled to it.
"""

from __future__ import annotations

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa.formats import PAD_BITS
from dsa_tvm.layers.ir import Conv2d, Layer, QTensor

from . import image
from .common import MAX_DMA, MAX_PAD, Constraint, common_constraints, layouts
from .match import Match, Reader, Root
from .scales import int32_bias, requant
from .spec import Kind, conv_variants
from .weights import weight_constraints


def _read(r: Reader, root: Root) -> Match:
    fused, body = r.activation(root.body)
    bias, body = r.bias_add(body)
    op = r.need(body, "relax.nn.conv2d")
    return root.match("conv2d", op, [r.operand(op.args[0])], weight=r.operand(op.args[1]),
                      bias=bias, act=fused)


def rescale_factors(m: Match) -> np.ndarray:
    s_in, s_out = float(m.inputs[0].qp.scale[0]), float(m.out.scale[0])
    return s_in * m.weight.qp.scale.astype(np.float64) / s_out


def groups(m: Match, cfg: HardwareConfig) -> str | None:
    g = int(m.op.attrs.groups)
    cin, cout = m.inputs[0].shape[1], m.out_shape[1]
    if g == 1 or (g == cin == cout):
        return None
    return f"groups={g} with {cin}->{cout} channels: only groups=1 or depthwise (groups=C_in=C_out)"


def tile(m: Match, cfg: HardwareConfig) -> str | None:
    kh, kw = m.weight.shape[2], m.weight.shape[3]
    if kh * kw > cfg.inp_depth or kh * kw > cfg.wgt_depth:
        return (f"a one-pixel tile of the {kh}x{kw} kernel needs {kh * kw} input rows and weight "
                f"tiles; the scratchpads hold {cfg.inp_depth} rows / {cfg.wgt_depth} tiles")
    return None


def layer_2d(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    """The Conv2d layer of a match whose ``op.attrs`` are conv2d's (conv1d passes a stand-in)."""
    a = m.op.attrs
    w = m.weight.value.astype(np.int8)
    pads = tuple(int(p) for p in a.padding)
    return Conv2d(name, inputs[0], output, w, int32_bias(m, w.shape[0]),
                  tuple(int(s) for s in a.strides), pads,  # relax order: top, left, bottom, right
                  tuple(int(d) for d in a.dilation), int(a.groups), requant(rescale_factors(m), m))


_to_layer = layer_2d


KINDS = (Kind(
    "conv2d", 900, conv_variants("relax.nn.conv2d"), _read,
    common_constraints(rescale_factors) + weight_constraints(
        channel_axis=lambda m: 0, channels=lambda m: m.out_shape[1],
        rows=lambda m, w: w.reshape(w.shape[0], -1)) + [
        Constraint("layout", "NCHW data, OIHW kernel", layouts("NCHW", "OIHW")),
        Constraint("groups", "groups = 1 or depthwise (groups = C_in = C_out)", groups),
        Constraint("padding", f"padding <= {MAX_PAD} per side (LOAD pad fields, "
                   f"{PAD_BITS} bits)", image.pads),
        Constraint("strides", "strides < 2^(input address bits)", image.strides),
        Constraint("dma", f"W*ceil(C/block_in) and H <= {MAX_DMA} (16-bit DMA fields)",
                   image.image_dma),
        Constraint("tile", "KH*KW <= {cfg.inp_depth} input rows and <= {cfg.wgt_depth} weight "
                   "tiles (one-pixel tile)", tile),
    ],
    _to_layer, "Conv (+ bias, + Relu/Clip)", "relax.nn.conv2d"),)
