"""max_pool1d and avg_pool1d as the 2-D pools of height 1: ``quantize(pool1d(dq(x)))``, NCW.

An NCW tensor is an NCHW tensor with H = 1, byte for byte (as for conv1d), so the
match is read with its activations viewed as (N, C, 1, W) and its attributes as the
2-D ones they mean: window (1, k), strides (1, s), padding (0, left, 0, right),
dilation (1, d). The 2-D pools' constraints, REQUANT factors and
:class:`~dsa_tvm.layers.ir.Pool2d` lowering then apply unchanged, and the layer
shares its tensors with the height-1 convs around it, so a 1-D CNN stays one region.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from tvm.relax.dpl import DFPattern

from dsa_tvm.layers.ir import Layer, QTensor

from . import pooling
from .common import Constraint, Factors, common_constraints, viewed
from .conv1d import h1, operand_h1
from .match import Match, Reader, Root
from .scales import in_out_factor
from .spec import Kind, unary


def _2d_layout(layout) -> str:
    return "NCHW" if str(layout) == "NCW" else str(layout)


def attrs_2d(m: Match) -> SimpleNamespace:
    """The pool1d attributes as the pool2d (H = 1) attributes they mean."""
    a = m.op.attrs
    pl, pr = (int(p) for p in a.padding)
    return SimpleNamespace(
        pool_size=(1, int(a.pool_size[0])), strides=(1, int(a.strides[0])),
        padding=(0, pl, 0, pr), dilation=(1, int(a.dilation[0])), ceil_mode=bool(a.ceil_mode),
        count_include_pad=bool(a.count_include_pad), layout=_2d_layout(a.layout),
        out_layout=_2d_layout(a.out_layout or a.layout))


def as_pool2d(m: Match) -> Match:
    """The match with a stand-in anchor carrying pool2d attributes (what the 2-D tests read)."""
    return dataclasses.replace(m, op=SimpleNamespace(attrs=attrs_2d(m), op=m.op.op))


def _kind(name: str, op: str, priority: int, factors: Factors, extra: list[Constraint],
          onnx: str) -> Kind:
    def variants() -> list[tuple[str, DFPattern]]:
        return [("plain", unary(op))]

    def read(r: Reader, root: Root) -> Match:
        call = r.need(root.body, op)
        m = root.match(name, call, [operand_h1(r.operand(call.args[0]))])
        return dataclasses.replace(m, out_shape=h1(m.out_shape))

    def to_layer(m: Match, layer: str, inputs: list[QTensor], output: QTensor) -> Layer:
        return pooling.pool_layer(name[:3], factors, as_pool2d(m), layer, inputs, output)

    def view(c: Constraint) -> Constraint:
        return dataclasses.replace(c, test=viewed(as_pool2d, c.test))

    constraints = common_constraints(lambda m: factors(as_pool2d(m))) + \
        [view(c) for c in pooling.WINDOW + extra]
    return Kind(name, priority, variants, read, constraints, to_layer, onnx, op)


KINDS = (
    _kind("max_pool1d", "relax.nn.max_pool1d", 565, in_out_factor, [], "MaxPool (1-D)"),
    _kind("avg_pool1d", "relax.nn.avg_pool1d", 562, pooling.avg_factors, [pooling.COUNT],
          "AveragePool (1-D)"),
)
