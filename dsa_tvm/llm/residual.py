"""A decoder's residual stream in its exported step graph: the tensors that go int16.

Rounding the residual stream to one int8 grid is the DSA's largest W8A8 error on
SmolLM2 (``benchmarks/llm_quant_study.py --dsa``: +971% perplexity against +5% with
int16 grids); int16 static grids there cost nothing measurable. The stream is found
by structure, not by name: from the hidden-state input ``x``, each residual Add takes
the stream and a branch (o_proj's or down_proj's output) and gives the next stream
value, which the next norm and the next Add read.
"""

from __future__ import annotations

import onnx

#: the step graph's hidden-state input (``llm.step``)
HIDDEN = "x"


def residual_stream(model: onnx.ModelProto, start: str = HIDDEN) -> set[str]:
    """Every residual Add's inputs and output, from ``start`` on (empty when the graph has
    no Add reading ``start``)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    stream, out = start, set()
    while True:
        adds = [n for n in readers.get(stream, []) if n.op_type == "Add"
                and len([i for i in n.input if i]) == 2]
        if len(adds) != 1:
            return out
        add = adds[0]
        out.update(i for i in add.input if i)
        out.add(add.output[0])
        stream = add.output[0]
