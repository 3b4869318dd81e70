"""grouped 1x1 conv: ``quantize(act(conv2d(dq(x), W) [+ b]))`` with ``W`` a float (O, I, 1, 1)
constant on a per-group grid (a scale and an offset per group of input channels).

A 1x1 convolution with stride 1 and no padding is a dense over the image's pixels, and the
DSA keeps an NCHW image as exactly those rows (``layers.layouts``: one row of channel
blocks per pixel). So a pointwise conv whose weights the QAT export left on a group grid
(``qat.prepare(..., weight_group=16)``) runs as the grouped dense
(``layers.group_grid``) on the image itself, with no layout change on either side. Any
other float-weight convolution stays on the CPU, named.
"""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.group_grid import GRID_BITS, GRID_GROUPS, find_grid, grouped_dense
from dsa_tvm.layers.ir import GroupedDense, QTensor

from .common import Constraint, common_constraints
from .grouped_dense import float_const
from .match import Match, NotAMatch, Reader, Root, qtensor
from .scales import clip_bounds
from .spec import ACTS, Kind, act, dq, q, variant_name


def _pattern(bias: bool, act_name: str | None) -> DFPattern:
    conv = is_op("relax.nn.conv2d")(dq(), is_const())
    if bias:
        b = is_const()
        conv = is_op("relax.add")(conv, b | is_op("relax.reshape")(b, wildcard()))
    return q(act(conv, act_name))


def _variants() -> list[tuple[str, DFPattern]]:
    return [(variant_name(bias, a), _pattern(bias, a)) for bias in (True, False) for a in ACTS]


def _read(r: Reader, root: Root) -> Match:
    fused, body = r.activation(root.body)
    add = r.call(body, "relax.add")
    bias = None
    if add is not None:
        rs = r.call(add.args[1], "relax.reshape")
        bias = float_const(r, rs.args[0] if rs is not None else add.args[1], "the bias")
    op = r.need(add.args[0] if add is not None else body, "relax.nn.conv2d")
    return root.match("grouped_conv1x1", op, [r.operand(op.args[0])],
                      weight=float_const(r, op.args[1], "the weight"), bias=bias, act=fused)


def _weight_nk(m: Match) -> np.ndarray:
    w = m.weight.value
    return np.ascontiguousarray(w.reshape(w.shape[0], -1))


def _pointwise(m: Match, cfg: HardwareConfig) -> str | None:
    a, w = m.op.attrs, m.weight.value
    if w.ndim != 4 or w.shape[2:] != (1, 1):
        return f"a {tuple(w.shape)} kernel (the grouped dense takes a 1x1 one)"
    if (a.data_layout, a.kernel_layout) != ("NCHW", "OIHW"):
        return f"layouts {a.data_layout}/{a.kernel_layout} (NCHW/OIHW only)"
    if (int(a.groups), tuple(int(s) for s in a.strides)) != (1, (1, 1)):
        return f"groups={int(a.groups)}, strides {tuple(int(s) for s in a.strides)} (1 and 1x1 only)"
    if any(int(p) for p in a.padding):
        return f"padding {tuple(int(p) for p in a.padding)} (a padded 1x1 conv is no dense)"
    return None


def _on_grid(m: Match, cfg: HardwareConfig) -> str | None:
    if find_grid(_weight_nk(m)) is None:
        return (f"the float32 weight {tuple(m.weight.value.shape)} is on no per-group grid "
                f"({' or '.join(map(str, GRID_BITS))} bits, groups of "
                f"{'/'.join(map(str, GRID_GROUPS))} input channels): quantize it "
                f"(quantize_onnx, or qat.prepare(..., weight_group=16) then qat.export) or "
                f"it stays on the CPU")
    n = m.weight.value.shape[0]
    if m.bias is not None and m.bias.value.size != n:
        return f"bias of {m.bias.value.size} values for {n} output channels"
    return None


def _layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> GroupedDense:
    grid = find_grid(_weight_nk(m))
    if grid is None:                   # the grid constraint refuses these
        raise NotAMatch(f"{name}: the weight is on no per-group grid")
    bias = None if m.bias is None else m.bias.value.reshape(-1).astype(np.float64)
    made = grouped_dense(name, inputs[0], output, grid, bias, clip_bounds(m))
    if isinstance(made, tuple):        # the input_dtype constraint refuses these
        raise NotAMatch(f"{name}: an int16 image (byte planes are rows of a matrix)")
    return made


def _int8_input(m: Match, cfg: HardwareConfig) -> str | None:
    dtype = m.inputs[0].qp.dtype
    return None if dtype == "int8" else f"an {dtype} input (a 1x1 conv's image must be int8)"


def _factors(m: Match) -> np.ndarray:
    """The requantize factor of the layer the match becomes."""
    ly = _layer(m, "check", [qtensor("x", m.inputs[0].shape, m.inputs[0].qp)],
                qtensor("y", m.out_shape, m.out))
    mult, shift = ly.requant.per_channel(ly.weight.shape[0])
    return mult.astype(np.float64) * 2.0 ** -shift.astype(np.float64)


_CONSTRAINTS = [
    Constraint("pointwise", "a 1x1 kernel, stride 1, no padding, groups 1, NCHW/OIHW "
               "(a dense over the image's pixels)", _pointwise),
    Constraint("input_dtype", "an int8 input image", _int8_input),
    Constraint("grid", "a float32 weight on a per-group grid (4 or 8 bits, a scale and an "
               "offset per group of input channels; `layers.group_grid.find_grid`)", _on_grid),
    *common_constraints(_factors, wide_output=True),
]

KINDS = (
    Kind("grouped_conv1x1", 785, _variants, _read, _CONSTRAINTS, _layer,
         "1x1 Conv with a float32 constant weight on a per-group grid (int4 weights per "
         "group of input channels), run as the grouped dense over the image's pixels",
         "relax.nn.conv2d"),
)
