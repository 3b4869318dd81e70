"""Building blocks for the QOperator -> QDQ rewrite: a node emitter and the uint8 -> int8 shift.

The per-op rewrites (``qoperator_ops``) write plain ONNX through :class:`Emitter`:
fresh names, constants, ``DequantizeLinear``/``QuantizeLinear`` with the right axis.
:func:`shift_uint8` then moves every uint8 tensor that only ``DequantizeLinear``
reads to int8: ``q - 128`` with zero point ``z - 128`` dequantizes to the same
values, so the shift is exact, and the DSA's patterns (int8 only) then match.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..quant.onnx_graph import Graph


class QOperatorError(ValueError):
    """A QOperator model the rewrite cannot read (missing scale, unknown quantized op, ...)."""


class Emitter:
    """Writes the replacement nodes of one model: names, constants, Q/DQ nodes."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.nodes: list[onnx.NodeProto] = []
        self.new_inits: list[onnx.TensorProto] = []
        self._used = set(graph.inits) | set(graph.producer) | set(graph.inputs)
        self._used |= {n.name for n in graph.model.graph.node}
        self._n = 0

    # -- names and constants
    def fresh(self, base: str) -> str:
        while True:
            self._n += 1
            name = f"{base}__qdq{self._n}"
            if name not in self._used:
                self._used.add(name)
                return name

    def const(self, value: np.ndarray, base: str) -> str:
        name = self.fresh(base)
        t = numpy_helper.from_array(np.asarray(value), name)
        self.new_inits.append(t)
        self.g.inits[name] = t
        return name

    def value(self, name: str) -> np.ndarray | None:
        """The constant behind ``name`` (initializer or Constant node), else None."""
        return self.g.const(name) if name and self.g.is_const(name) else None

    def size(self, name: str) -> int:
        """Element count of a scale/zero point (1 when not a constant: runtime scales are scalars)."""
        v = self.value(name)
        return 1 if v is None else int(v.size)

    # -- nodes
    def node(self, op: str, inputs: list[str], base: str, n_out: int = 1,
             outputs: list[str] | None = None, attrs: list[onnx.AttributeProto] | None = None,
             **kw) -> list[str]:
        outs = outputs if outputs is not None else [self.fresh(base) for _ in range(n_out)]
        nd = helper.make_node(op, inputs, outs, name=self.fresh(base), **kw)
        if attrs:
            nd.attribute.extend(attrs)
        self.nodes.append(nd)
        return outs

    def dq(self, x: str, scale: str, zp: str, base: str, axis: int | None = None) -> str:
        """DequantizeLinear; per-axis when the scale has more than one element."""
        kw = {"axis": axis} if axis is not None and self.size(scale) > 1 else {}
        ins = [x, scale] + ([zp] if zp else [])
        return self.node("DequantizeLinear", ins, base + "_dq", **kw)[0]

    def q(self, x: str, scale: str, zp: str, out: str, axis: int | None = None) -> str:
        kw = {"axis": axis} if axis is not None and self.size(scale) > 1 else {}
        ins = [x, scale] + ([zp] if zp else [])
        return self.node("QuantizeLinear", ins, out, outputs=[out], **kw)[0]

    def mul(self, a: str, b: str, base: str) -> str:
        """a * b: folded to a float32 constant when both are constants."""
        va, vb = self.value(a), self.value(b)
        if va is not None and vb is not None:
            return self.const((va.astype(np.float32) * vb.astype(np.float32)).astype(np.float32), base)
        return self.node("Mul", [a, b], base)[0]


# ----------------------------------------------------------------------------- uint8 -> int8


def _dtype_of(g: Graph, name: str) -> int | None:
    if g.is_const(name):
        return g.inits[name].data_type
    return None


def _to_int8(g: Graph, name: str, cache: dict[str, str], new_inits: list, em_used: set) -> str:
    """The int8 twin (value - 128) of a uint8 constant, created once per name."""
    if name not in cache:
        v = g.const(name).astype(np.int16) - 128
        twin = f"{name}_s8"
        while twin in em_used:
            twin += "_"
        em_used.add(twin)
        t = numpy_helper.from_array(v.astype(np.int8), twin)
        new_inits.append(t)
        g.inits[twin] = t
        cache[name] = twin
    return cache[name]


def shift_uint8(model: onnx.ModelProto) -> Counter:
    """Move uint8 tensors read only by DequantizeLinear to int8, in place; returns counts.

    A tensor qualifies when it is a uint8 constant or the output of a QuantizeLinear with
    a uint8 constant zero point, is not a graph output, and every consumer is a
    DequantizeLinear with a constant (or absent) zero point. Each such DequantizeLinear
    gets zero point ``z - 128``: ``(q - 128) - (z - 128) = q - z``, the same values.
    """
    g = Graph(model)
    outputs = set(g.outputs)
    cache: dict[str, str] = {}
    new_inits: list[onnx.TensorProto] = []
    used = set(g.inits) | set(g.producer) | set(g.inputs)
    zero_u8 = None
    counts: Counter = Counter()

    def readers_ok(t: str) -> bool:
        cons = g.consumers.get(t, [])
        return bool(cons) and t not in outputs and all(
            c.op_type == "DequantizeLinear" and c.domain in ("", "ai.onnx") and c.input[0] == t
            and (len(c.input) < 3 or not c.input[2] or _dtype_of(g, c.input[2]) == TensorProto.UINT8)
            for c in cons)

    def shift_readers(t: str) -> None:
        nonlocal zero_u8
        for c in g.consumers[t]:
            if len(c.input) < 3 or not c.input[2]:
                if zero_u8 is None:
                    zero_u8 = f"{t}_zero_point_u8"
                    g.inits[zero_u8] = numpy_helper.from_array(np.array(0, np.uint8), zero_u8)
                    new_inits.append(g.inits[zero_u8])
                while len(c.input) < 3:
                    c.input.append("")
                c.input[2] = zero_u8
            c.input[2] = _to_int8(g, c.input[2], cache, new_inits, used)

    for n in list(model.graph.node):
        if n.op_type != "QuantizeLinear" or n.domain not in ("", "ai.onnx") or len(n.input) < 3:
            continue
        t = n.output[0]
        if _dtype_of(g, n.input[2]) != TensorProto.UINT8 or not readers_ok(t):
            continue
        n.input[2] = _to_int8(g, n.input[2], cache, new_inits, used)
        shift_readers(t)
        counts["activation"] += 1
    for name in list(g.inits):
        t = g.inits[name]
        if (t.data_type == TensorProto.UINT8 and name not in cache.values() and name != zero_u8
                and name in g.consumers and readers_ok(name)):
            twin = _to_int8(g, name, cache, new_inits, used)
            for c in g.consumers[name]:
                c.input[0] = twin
            shift_readers(name)
            counts["constant"] += 1
    model.graph.initializer.extend(new_inits)
    _drop_unused_initializers(model)
    return counts


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
