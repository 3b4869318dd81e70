"""max_pool2d and avg_pool2d: ``quantize(pool(dq(x)))`` over NCHW windows.

REQUANT factor ``M = s_in / s_out``, divided by the window count for the average
(a constant: no padding, or padding counted).
"""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import DFPattern

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.ir import Layer, Pool2d, QTensor

from . import image
from .common import MAX_DMA, MAX_PAD, Constraint, Factors, common_constraints
from .match import Match, Reader, Root
from .scales import in_out_factor, requant
from .spec import Kind, unary


def avg_factors(m: Match) -> np.ndarray:
    s_in, s_out = float(m.inputs[0].qp.scale[0]), float(m.out.scale[0])
    kh, kw = (int(v) for v in m.op.attrs.pool_size)
    return np.array([s_in / (s_out * kh * kw)])


def _attrs(m: Match, cfg: HardwareConfig) -> str | None:
    a = m.op.attrs
    if str(a.layout) != "NCHW" or str(a.out_layout or a.layout) != "NCHW":
        return f"layout must be NCHW, got {a.layout}"
    if bool(a.ceil_mode):
        return "ceil_mode=True (windows would hang over the padded input)"
    d = [int(v) for v in a.dilation]
    if d != [1, 1]:
        return f"dilation {d}: pooling windows must be dense"
    return None


def _tile(m: Match, cfg: HardwareConfig) -> str | None:
    kh, kw = (int(v) for v in m.op.attrs.pool_size)
    if kh * kw + 2 > cfg.acc_depth:
        return (f"a {kh}x{kw} window needs {kh * kw + 2} accumulator rows; "
                f"the accumulator holds {cfg.acc_depth}")
    return None


def count(m: Match, cfg: HardwareConfig) -> str | None:
    a = m.op.attrs
    pads = [int(p) for p in a.padding]
    if any(pads) and not bool(a.count_include_pad):
        return (f"padding {pads} with count_include_pad=False: the window count varies at the "
                "borders (1/count must be a constant folded into REQUANT)")
    return None


#: the window constraints every pool kind shares (2-D attributes)
WINDOW = [
    Constraint("attrs", "NCHW, ceil_mode=False, dilation 1", _attrs),
    Constraint("padding", f"padding <= {MAX_PAD} per side", image.pads),
    Constraint("strides", "strides < 2^(input address bits)", image.strides),
    Constraint("dma", f"W*ceil(C/block_in) and H <= {MAX_DMA}", image.image_dma),
    Constraint("tile", "KH*KW + 2 <= {cfg.acc_depth} accumulator rows (one window)", _tile),
]


def _kind(name: str, op: str, priority: int, factors: Factors, extra: list[Constraint],
          onnx: str) -> Kind:
    def variants() -> list[tuple[str, DFPattern]]:
        return [("plain", unary(op))]

    def read(r: Reader, root: Root) -> Match:
        call = r.need(root.body, op)
        return root.match(name, call, [r.operand(call.args[0])])

    def to_layer(m: Match, layer: str, inputs: list[QTensor], output: QTensor) -> Layer:
        return pool_layer(name[:3], factors, m, layer, inputs, output)

    return Kind(name, priority, variants, read, common_constraints(factors) + WINDOW + extra,
                to_layer, onnx, op)


def pool_layer(mode: str, factors: Factors, m: Match, layer: str, inputs: list[QTensor],
               output: QTensor) -> Pool2d:
    """The Pool2d layer of a match whose anchor carries 2-D pool attributes (``mode``:
    max or avg); shared with the 1-D pools, which pass a height-1 view."""
    a = m.op.attrs
    return Pool2d(layer, mode, inputs[0], output, tuple(int(v) for v in a.pool_size),
                  tuple(int(v) for v in a.strides), tuple(int(v) for v in a.padding),
                  requant(factors(m), m))


COUNT = Constraint("count", "no padding or count_include_pad=True (constant window count)",
                   count)

KINDS = (
    _kind("max_pool2d", "relax.nn.max_pool2d", 600, in_out_factor, [], "MaxPool"),
    _kind("avg_pool2d", "relax.nn.avg_pool2d", 590, avg_factors, [COUNT], "AveragePool"),
)
