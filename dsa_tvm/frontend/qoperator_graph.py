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

from .onnx_graph import Graph


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


class _Shift:
    """State of one :func:`shift_uint8` run: the graph index, int8 twins, new nodes."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.g = Graph(model)
        self.outputs = set(self.g.outputs)
        self.twins: dict[str, str] = {}
        self.new_inits: list[onnx.TensorProto] = []
        self.used = set(self.g.inits) | set(self.g.producer) | set(self.g.inputs)
        self.counts: Counter = Counter()

    def name(self, base: str) -> str:
        name = base
        while name in self.used:
            name += "_"
        self.used.add(name)
        return name

    def int8_const(self, name: str) -> str:
        """The int8 twin (value - 128) of a uint8 constant, created once per name."""
        if name not in self.twins:
            v = (self.g.const(name).astype(np.int16) - 128).astype(np.int8)
            twin = self.name(f"{name}_s8")
            self.g.inits[twin] = numpy_helper.from_array(v, twin)
            self.new_inits.append(self.g.inits[twin])
            self.twins[name] = twin
        return self.twins[name]

    def zp_u8(self, node: onnx.NodeProto) -> str | None:
        """The uint8 zero point constant of a Q/DQ node (one is made when absent), else None."""
        if len(node.input) < 3 or not node.input[2]:
            to = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
            if node.op_type == "QuantizeLinear" and to not in (0, TensorProto.UINT8):
                return None
            name = self.name("zero_point_u8")
            self.g.inits[name] = numpy_helper.from_array(np.array(0, np.uint8), name)
            return name
        return node.input[2] if _dtype_of(self.g, node.input[2]) == TensorProto.UINT8 else None

    def dq_readers(self, t: str) -> list[onnx.NodeProto]:
        return [c for c in self.g.consumers.get(t, [])
                if c.op_type == "DequantizeLinear" and c.domain in ("", "ai.onnx") and c.input[0] == t
                and (len(c.input) < 3 or not c.input[2]
                     or _dtype_of(self.g, c.input[2]) == TensorProto.UINT8)]

    def only_dq_read(self, t: str, readers: list[onnx.NodeProto]) -> bool:
        return t not in self.outputs and len(readers) == len(self.g.consumers.get(t, []))

    def rewire(self, readers: list[onnx.NodeProto], t8: str) -> None:
        for c in readers:
            zp = self.zp_u8(c)
            while len(c.input) < 3:
                c.input.append("")
            c.input[0], c.input[2] = t8, self.int8_const(zp)


def _shift_nodes(sh: _Shift, src: str, dst: str, offset: int, to: int) -> list[onnx.NodeProto]:
    """dst = src + offset as ``to`` (uint8 <-> int8 codes), through int32."""
    i32, c, s = sh.name(f"{src}_i32"), sh.name(f"{src}_offset"), sh.name(f"{src}_shifted")
    sh.new_inits.append(numpy_helper.from_array(np.array(offset, np.int32), c))
    return [helper.make_node("Cast", [src], [i32], to=TensorProto.INT32),
            helper.make_node("Add", [i32, c], [s]),
            helper.make_node("Cast", [s], [dst], to=to)]


def shift_uint8(model: onnx.ModelProto) -> Counter:
    """Move uint8 tensors that DequantizeLinear reads to int8, in place; returns counts.

    ``q - 128`` with zero point ``z - 128`` dequantizes to the same values. Shifted: the
    outputs of QuantizeLinear with a constant (or absent) uint8 zero point, uint8
    constants and uint8 graph inputs, for their DequantizeLinear readers. A quantized
    tensor that something else also reads (a graph output, another op) is still
    quantized to int8 (where the DSA computes it) and shifted back (``q + 128``) on the CPU
    for those readers; a uint8 graph input is shifted (``x - 128``) on the CPU.
    """
    sh = _Shift(model)
    g = sh.g
    nodes: list[onnx.NodeProto] = []
    for inp in model.graph.input:
        readers = sh.dq_readers(inp.name)
        if inp.type.tensor_type.elem_type != TensorProto.UINT8 or inp.name in g.inits or not readers:
            continue
        t8 = sh.name(f"{inp.name}_s8")
        nodes += _shift_nodes(sh, inp.name, t8, -128, TensorProto.INT8)
        sh.rewire(readers, t8)
        sh.counts["graph input"] += 1
    for n in list(model.graph.node):
        zp = sh.zp_u8(n) if n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx") else None
        if zp is None:
            nodes.append(n)
            continue
        t, zp8 = n.output[0], sh.int8_const(zp)
        readers = sh.dq_readers(t)
        while len(n.input) < 3:
            n.input.append("")
        n.input[2] = zp8
        nodes.append(n)
        if sh.only_dq_read(t, readers):
            sh.rewire(readers, t)
        else:  # the int8 codes for the DQ readers, q + 128 back to uint8 for the others
            t8 = sh.name(f"{t}_s8")
            n.output[0] = t8
            nodes += _shift_nodes(sh, t8, t, +128, TensorProto.UINT8)
            sh.rewire(readers, t8)
        sh.counts["activation"] += 1
    for name in list(g.inits):
        if name in sh.twins.values() or g.inits[name].data_type != TensorProto.UINT8:
            continue
        readers = sh.dq_readers(name)
        if readers:
            sh.rewire(readers, sh.int8_const(name))
            sh.counts["constant"] += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(sh.new_inits)
    _drop_unused_initializers(model)
    return sh.counts


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
