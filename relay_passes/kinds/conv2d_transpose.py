"""conv2d_transpose: ``quantize(act(conv2d_transpose(dq(x), dq(W)) [+ dq(bias)]))``, NCHW/IOHW.

A transposed conv (stride s, padding p, output_padding a, dilation 1, groups 1) is a
stride-1 conv over its input with ``s - 1`` zero-point pixels inserted between
neighbours, padded by ``k - 1 - p`` before and ``k - 1 - p + a`` after, with the kernel
flipped in both spatial axes and its two channel axes swapped. So a match becomes two
layers of the region: a :class:`~dsa_tvm.layers.ir.Dilate` (data movement: strided
stores into a zero-point buffer, ``tir_schedules.kinds.dilate``; none at stride 1) and
a :class:`~dsa_tvm.layers.ir.Conv2d` that the conv room runs as any other. The weight
transform happens here, at compile time. The conv's array also multiplies the inserted
zero points (about ``s*s`` times the useful products): the layer reports the transposed
conv's own MACs (``Conv2d.useful_macs``), so its roofline bound is the useful one.

When the kernel equals the stride and nothing is padded (a UNet's 2x2/2 up-sampling),
the output's phases do not overlap: phase ``(a, b)`` is a 1x1 conv with kernel tap
``(a, b)``, and an :class:`~dsa_tvm.layers.ir.Interleave` (strided stores,
``tir_schedules.kinds.interleave``) weaves the ``s*s`` phases together; no zero products.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa.formats import PAD_BITS
from dsa_tvm.layers.ir import Conv2d, Dilate, Interleave, QTensor

from . import conv2d, image
from .common import MAX_DMA, MAX_PAD, Constraint, common_constraints, layouts, viewed
from .match import Match, Reader, Root
from .scales import int32_bias, requant
from .spec import Kind, conv_variants
from .weights import weight_constraints

#: the name suffixes of the zero-inserted tensor a transposed conv reads, of its phases
DILATED, PHASE = ".dilated", ".phase"


def _read(r: Reader, root: Root) -> Match:
    fused, body = r.activation(root.body)
    bias, body = r.bias_add(body)
    op = r.need(body, "relax.nn.conv2d_transpose")
    return root.match("conv2d_transpose", op, [r.operand(op.args[0])],
                      weight=r.operand(op.args[1]), bias=bias, act=fused)


def _ints(v) -> tuple[int, ...]:
    return tuple(int(x) for x in v)


def equivalent(m: Match) -> SimpleNamespace:
    """The stride-1 conv2d the match is, over the zero-inserted input: its attributes,
    its input shape and the zero-insertion factor."""
    a = m.op.attrs
    s = _ints(a.strides)
    pt, pl, pb, pr = _ints(a.padding)
    oph, opw = _ints(a.output_padding)
    kh, kw = m.weight.shape[2:]
    n, c, h, w = m.inputs[0].shape
    return SimpleNamespace(
        strides=(1, 1), dilation=(1, 1), groups=int(a.groups),
        padding=(kh - 1 - pt, kw - 1 - pl, kh - 1 - pb + oph, kw - 1 - pr + opw),
        factor=s, dilated=(n, c, (h - 1) * s[0] + 1, (w - 1) * s[1] + 1))


def _as_conv(m: Match) -> Match:
    """The match as the conv2d it becomes (what conv2d's constraints read)."""
    e = equivalent(m)
    x = dataclasses.replace(m.inputs[0], shape=e.dilated)
    return dataclasses.replace(m, inputs=[x], op=SimpleNamespace(attrs=e, op=m.op.op))


def _groups_dilation(m: Match, cfg: HardwareConfig) -> str | None:
    a = m.op.attrs
    if int(a.groups) != 1:
        return f"groups={int(a.groups)}: only groups=1 transposed convs run on the DSA"
    if _ints(a.dilation) != (1, 1):
        return f"dilation {list(_ints(a.dilation))}: only dilation 1 transposed convs run on the DSA"
    return None


def _padding(m: Match, cfg: HardwareConfig) -> str | None:
    a = m.op.attrs
    s, op, p = _ints(a.strides), _ints(a.output_padding), _ints(a.padding)
    if any(o >= st for o, st in zip(op, s)):
        return f"output_padding {list(op)} must be below the strides {list(s)}"
    kh, kw = m.weight.shape[2:]
    if max(p[0], p[2]) > kh - 1 or max(p[1], p[3]) > kw - 1:
        return (f"padding {list(p)} exceeds kernel - 1 ({kh - 1}, {kw - 1}): the equivalent conv "
                f"would crop its zero-inserted input")
    return None


def _rows(m: Match, w: np.ndarray) -> np.ndarray:
    """[C_in, C_out, kh, kw] as one row per output channel."""
    return np.moveaxis(w, 1, 0).reshape(w.shape[1], -1)


def conv_weight(w: np.ndarray) -> np.ndarray:
    """[C_in, C_out, kh, kw] -> the equivalent conv's [C_out, C_in, kh, kw], flipped."""
    return np.ascontiguousarray(np.transpose(w, (1, 0, 2, 3))[:, :, ::-1, ::-1])


def useful_macs(m: Match) -> int:
    """Every input pixel feeds C_out x taps outputs (pads and crops included, as the
    partition's MAC count has it)."""
    return int(np.prod(m.inputs[0].shape, dtype=np.int64)) * int(np.prod(m.weight.shape[1:]))


def _phased(m: Match) -> bool:
    """Kernel = stride > 1, no padding: the output's stride phases do not overlap."""
    a = m.op.attrs
    s = _ints(a.strides)
    return (s == tuple(m.weight.shape[2:]) and max(s) > 1 and not any(_ints(a.padding))
            and not any(_ints(a.output_padding)))


def _phase_layers(m: Match, name: str, x: QTensor, output: QTensor) -> tuple:
    """One 1x1 conv per output phase (a, b) with the kernel tap (a, b), then an
    Interleave: no product with an inserted zero."""
    sh, sw = _ints(m.op.attrs.strides)
    w = m.weight.value.astype(np.int8)
    bias, rq = int32_bias(m, w.shape[1]), requant(conv2d.rescale_factors(m), m)
    phases, layers = [], []
    for a in range(sh):
        for b in range(sw):
            t = dataclasses.replace(output, name=f"{output.name}{PHASE}{a}{b}",
                                    shape=(*output.shape[:2], *x.shape[2:]))
            wt = np.ascontiguousarray(w[:, :, a, b].T)[:, :, None, None]
            layers.append(Conv2d(f"{name}{PHASE}{a}{b}", x, t, wt, bias, (1, 1), (0, 0, 0, 0),
                                 (1, 1), 1, rq))
            phases.append(t)
    return (*layers, Interleave(name, tuple(phases), output, (sh, sw)))


def _to_layers(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> tuple:
    if _phased(m):
        return _phase_layers(m, name, inputs[0], output)
    e = equivalent(m)
    w = conv_weight(m.weight.value.astype(np.int8))
    x = inputs[0]
    layers: list = []
    if e.factor != (1, 1):
        dil = dataclasses.replace(x, name=output.name + DILATED, shape=e.dilated)
        layers.append(Dilate(name + ".zeros", x, dil, e.factor))
        x = dil
    layers.append(Conv2d(name, x, output, w, int32_bias(m, w.shape[0]), e.strides, e.padding,
                         e.dilation, 1, requant(conv2d.rescale_factors(m), m),
                         useful_macs=useful_macs(m)))
    return tuple(layers)


KINDS = (Kind(
    "conv2d_transpose", 940, conv_variants("relax.nn.conv2d_transpose"), _read,
    common_constraints(conv2d.rescale_factors) + weight_constraints(
        channel_axis=lambda m: 1, channels=lambda m: m.out_shape[1], rows=_rows) + [
        Constraint("layout", "NCHW data, IOHW kernel", layouts("NCHW", "IOHW")),
        Constraint("groups", "groups = 1, dilation = 1", _groups_dilation),
        Constraint("padding", "output_padding < strides, padding <= kernel - 1", _padding),
        Constraint("conv padding", f"kernel - 1 - padding (+ output_padding) <= {MAX_PAD} "
                   f"(LOAD pad fields, {PAD_BITS} bits)", viewed(_as_conv, image.pads)),
        Constraint("dma", f"zero-inserted W*ceil(C/block_in) and H <= {MAX_DMA} "
                   f"(16-bit DMA fields)", viewed(_as_conv, image.image_dma)),
        Constraint("tile", "KH*KW <= {cfg.inp_depth} input rows and <= {cfg.wgt_depth} weight "
                   "tiles (one-pixel tile)", conv2d.tile),
    ],
    _to_layers, "ConvTranspose (2-D, + bias, + Relu/Clip) as zero insertion + conv",
    "relax.nn.conv2d_transpose"),)
