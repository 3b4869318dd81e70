"""Rotary position embedding chains in an FP32 ONNX graph, planned as one int8 op.

``Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, h:)), Slice(x, :h)), sin))`` (Llama's
``x * cos + rotate_half(x) * sin``, either operand order of the Adds and Muls) reads one
activation and two tables, constants or graph inputs (an LLM step's tables of its
positions): the quantizer gives it int8 at both ends and leaves the interior and the
tables FP32, so the DSA's ``rope`` kind runs it as integer tables (the front end checks
the slices and tables; anything else runs the same QDQ graph on the CPU).
"""

from __future__ import annotations

import onnx

from ..frontend.onnx_graph import Graph


def _is_table(g: Graph, name: str) -> bool:
    """A constant or a graph input: what the room can read as a rotary table."""
    return g.is_const(name) or name in g.inputs


def _times_const(g: Graph, n: onnx.NodeProto | None) -> str | None:
    """The activation a ``Mul`` by a table (constant or graph input) scales, or None."""
    if n is None or n.op_type != "Mul" or len(n.input) != 2:
        return None
    a, b = n.input
    if _is_table(g, b) and not _is_table(g, a):
        return a
    if _is_table(g, a) and not _is_table(g, b):
        return b
    return None


def rope_chain(g: Graph, n: onnx.NodeProto) -> tuple[str, list[str]] | None:
    """(x, interior node names) when ``n`` is the Add that ends a rotary embedding of x."""
    if n.op_type != "Add" or len(n.input) != 2:
        return None
    muls = [g.producer.get(i) for i in n.input]
    if any(m is None or not g.only_reader(m.output[0], n) for m in muls):
        return None
    for direct, rotated in (muls, muls[::-1]):
        x, r = _times_const(g, direct), _times_const(g, rotated)
        cat = g.producer.get(r) if r else None
        if x is None or cat is None or cat.op_type != "Concat" or len(cat.input) != 2:
            continue
        neg, low = (g.producer.get(i) for i in cat.input)
        high = g.producer.get(neg.input[0]) if neg is not None and neg.op_type == "Neg" else None
        if high is None or low is None or {high.op_type, low.op_type} != {"Slice"}:
            continue
        if high.input[0] != x or low.input[0] != x:
            continue
        inner = [(r, rotated), (neg.output[0], cat), (low.output[0], cat),
                 (high.output[0], neg)]
        if all(g.only_reader(t, reader) for t, reader in inner):
            return x, [direct.name, rotated.name, cat.name, neg.name, low.name, high.name]
    return None


def rope_chains(g: Graph) -> dict[str, tuple[str, list[str]]]:
    """Every rotary chain of the graph: its Add's name -> (x, interior node names)."""
    out = {}
    for n in g.model.graph.node:
        chain = rope_chain(g, n)
        if chain is not None:
            out[n.name] = chain
    return out
