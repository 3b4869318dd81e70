"""Activation chains in the quantization plan: element-wise ops on one int8 tensor.

Sigmoid, SiLU (``x * sigmoid(x)``), HardSwish / HardSigmoid (as ONNX ops or as
add/clip/mul/div), GELU (erf or tanh form), LeakyRelu, Tanh, Exp, ... reading one int8
tensor and scalar constants compute a function of its 256 codes: the DSA applies it as a
table (``relay_passes.table_chains``). The plan quantizes such a chain's output only (its
inner tensors stay FP32 inside the chain, as the table computes them), so the chain sits
between the input's DequantizeLinear and one QuantizeLinear.

A chain grows from an op whose inputs are one int8 tensor: every consumer of its tensors
that is element-wise and reads only the chain, that tensor and scalar constants joins.
It must end in one tensor; one that does not, or that reads a per-channel constant,
stays FP32 with the reason.
"""

from __future__ import annotations

import onnx

from ..frontend.onnx_graph import Graph

#: element-wise ONNX ops a table can hold (with scalar constant operands)
TABLE_OPS = frozenset({
    "Sigmoid", "Tanh", "Exp", "Erf", "Gelu", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu",
    "Selu", "Celu", "Softplus", "Softsign", "Mish", "ThresholdedRelu", "Relu", "Clip", "Add",
    "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Sqrt", "Reciprocal", "Log", "Max", "Min",
})
#: chains of only these are the Relu/Clip followers' (folded into the producer's requantize)
PLAIN = frozenset({"Relu", "Clip"})


def _const_inputs_ok(g: Graph, n: onnx.NodeProto) -> str | None:
    for i in n.input:
        if i and g.is_const(i):
            shape = g.shape(i)
            size = 1
            for d in shape or ():
                size *= d
            if shape is None or size != 1:
                return f"{n.op_type} reads a constant of shape {shape} (a table needs scalars)"
    return None


def _reads_only(g: Graph, n: onnx.NodeProto, allowed: set[str]) -> bool:
    ins = [i for i in n.input if i and not g.is_const(i)]
    return bool(ins) and all(i in allowed for i in ins)


def grow_chain(g: Graph, start: onnx.NodeProto, src: str
               ) -> tuple[list[onnx.NodeProto], str] | str | None:
    """The chain that grows from ``start`` (which reads only ``src``): (nodes in graph order,
    the tensor it ends in); a reason when it cannot be a table; None for a plain Relu/Clip
    chain (the followers take those)."""
    why = _const_inputs_ok(g, start)
    if why:
        return why
    nodes = [start]
    allowed = {src, *start.output}
    changed = True
    while changed:
        changed = False
        for t in list(allowed - {src}):
            for c in g.consumers.get(t, []):
                if c in nodes or c.op_type not in TABLE_OPS or not _reads_only(g, c, allowed):
                    continue
                if _const_inputs_ok(g, c):
                    continue
                nodes.append(c)
                allowed.update(c.output)
                changed = True
    if {n.op_type for n in nodes} <= PLAIN:
        return None
    names = {id(n) for n in nodes}
    ends = [o for n in nodes for o in n.output
            if o in g.outputs or any(id(c) not in names for c in g.consumers.get(o, []))]
    if len(ends) != 1:
        return (f"element-wise chain on int8 '{src}' ends in {len(ends)} tensors "
                f"({', '.join(ends[:3])}); a table has one output")
    order = {id(n): k for k, n in enumerate(g.model.graph.node)}
    return sorted(nodes, key=lambda n: order[id(n)]), ends[0]
