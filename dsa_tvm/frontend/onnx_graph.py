"""A small read/modify view of an ONNX graph: producers, consumers, constants, shapes.

The quantizer works on the ONNX graph because that is where tensor names exist: the
FP32 statistics (onnxruntime as the execution engine), the QDQ model and the per-layer
accuracy report all refer to the same names, and TVM's ONNX importer turns the QDQ
graph into exactly the relax ``dequantize -> op -> quantize`` form the DSA patterns match.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

#: first opset with per-axis QuantizeLinear/DequantizeLinear
MIN_OPSET = 13


class Graph:
    """Index of ``model.graph``; rebuild after structural edits with :meth:`reindex`."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.reindex()

    def reindex(self) -> None:
        g = self.model.graph
        self.inits: dict[str, onnx.TensorProto] = {i.name: i for i in g.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        for n in g.node:  # Constant nodes count as constants
            if n.op_type == "Constant" and n.output[0] not in self.inits:
                for a in n.attribute:
                    if a.name == "value":
                        t = onnx.TensorProto()
                        t.CopyFrom(a.t)
                        t.name = n.output[0]
                        self.inits[t.name] = t
        self.inputs = [i.name for i in g.input if i.name not in self.inits]
        self.outputs = [o.name for o in g.output]
        self.shapes: dict[str, tuple[int, ...] | None] = {}
        for vi in list(g.value_info) + list(g.input) + list(g.output):
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
                self.shapes[vi.name] = dims

    def only_reader(self, tensor: str, node: onnx.NodeProto) -> bool:
        """``node`` is the one reader of ``tensor`` and it is no graph output (a fold or a
        fused chain may then rename or drop it)."""
        return [c.name for c in self.consumers[tensor]] == [node.name] \
            and tensor not in self.outputs

    def is_const(self, name: str) -> bool:
        return name in self.inits

    def const(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name])

    def shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.inits:
            return tuple(self.inits[name].dims)
        return self.shapes.get(name)

    def attr(self, node: onnx.NodeProto, name: str, default=None):
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def opset(self) -> int:
        for o in self.model.opset_import:
            if o.domain in ("", "ai.onnx"):
                return int(o.version)
        return 0


def load(model: onnx.ModelProto | str) -> onnx.ModelProto:
    """A private copy of ``model`` (a path or a ModelProto)."""
    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m
    return onnx.load(str(model))


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node a stable name (``<OpType>_<index>``) so users can refer to
    layers in ``keep_fp32`` and the report."""
    used = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in used:
                name += "_"
            n.name = name
            used.add(name)


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape-inferred copy (ranks/shapes guide weight axes and add checks)."""
    try:
        return shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - shapes are a hint; an uninferable model still quantizes
        return model


def is_qdq(model: onnx.ModelProto) -> bool:
    """True if the model already carries QuantizeLinear/DequantizeLinear (or QLinear) nodes."""
    ops = {n.op_type for n in model.graph.node}
    return bool(ops & {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                       "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"})


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Initializers no node or output reads any more, and the graph inputs that only
    declared one of them (older exporters list initializers as inputs too)."""
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    inits = {i.name for i in model.graph.initializer}
    keep = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    inputs = [i for i in model.graph.input if i.name in used or i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(inputs)


def constants_to_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Constant`` nodes holding a tensor -> initializers (a copy of the model when any is
    moved): onnx2torch reads a convolution's or a Gemm's weight from the initializers
    only, and the quantizer's planner a ReduceMean's axes (which onnx.version_converter
    writes as a ``Constant`` node)."""
    outputs = {o.name for o in model.graph.output}

    def held(n: onnx.NodeProto) -> bool:
        return n.op_type == "Constant" and len(n.attribute) == 1 and \
            n.attribute[0].name == "value" and n.output[0] not in outputs

    if not any(held(n) for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = []
    for n in out.graph.node:
        if not held(n):
            keep.append(n)
            continue
        t = onnx.TensorProto()
        t.CopyFrom(n.attribute[0].t)
        t.name = n.output[0]
        out.graph.initializer.append(t)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out
