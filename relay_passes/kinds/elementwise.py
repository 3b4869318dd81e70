"""The one-input elementwise kinds, each one REQUANT of ``M = s_in / s_out``:

* relu ``quantize(relu(dq(x)))`` and clip ``quantize(clip(dq(x), lo, hi))``: ReLU / Clip
  become the REQUANT clip bounds (quantization is monotone);
* rescale ``quantize(dq(x))`` with new parameters. Its pattern is the tail of every
  other one, so it comes last in the table.
"""

from __future__ import annotations

from collections.abc import Callable

from tvm.relax.dpl import DFPattern, is_op, wildcard

from dsa_tvm.layers.ir import Layer, QTensor, Rescale

from .common import common_constraints
from .match import Match, Reader, Root, prim_float
from .scales import in_out_factor, requant
from .spec import Kind, dq, q, unary


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    return Rescale(name, inputs[0], output, requant(in_out_factor(m), m))


def _kind(name: str, priority: int, pattern: Callable[[], DFPattern],
          read: Callable[[Reader, Root], Match], onnx: str, anchor: str | None) -> Kind:
    return Kind(name, priority, lambda: [("plain", pattern())], read,
                common_constraints(in_out_factor), _to_layer, onnx, anchor)


def _read_relu(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.nn.relu")
    return root.match("relu", op, [r.operand(op.args[0])], act=("relu", 0.0, float("inf")))


def _read_clip(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.clip")
    return root.match("clip", op, [r.operand(op.args[0])],
                      act=("clip", prim_float(op.args[1]), prim_float(op.args[2])))


def _read_rescale(r: Reader, root: Root) -> Match:
    return root.match("rescale", root.q, [r.operand(root.body)])


KINDS = (
    _kind("relu", 300, lambda: unary("relax.nn.relu"), _read_relu, "Relu", "relax.nn.relu"),
    _kind("clip", 290, lambda: q(is_op("relax.clip")(dq(), wildcard(), wildcard())), _read_clip,
          "Clip (Relu6)", "relax.clip"),
    _kind("rescale", 0, lambda: q(dq()), _read_rescale,
          "QuantizeLinear(DequantizeLinear(x)) with new parameters", None),
)
