"""The tensors around a transformer's norms that need int16 grids when the norms run on the
DSA's [norm] units (``quantize_onnx(..., quantize_norms=True, wide_norms=True)``).

A norm's input is the residual stream: the sum of a branch's output and the previous
stream value, with outlier features hundreds of times the median. A norm's output in a
post-norm BERT is the next stream value itself (read by the projections and by the next
residual Add). On one int8 grid per tensor those outliers leave the other features a few
codes: all-MiniLM-L6-v2 with integer LayerNorm falls to 0.858 embedding cosine (PTQ), where
FP32 norms keep 0.9966 by splitting the outliers into FP32 side paths that an int8 norm
output cannot have. On int16 grids (the [norm] unit's ``in_wide``/``out_wide``, a dense's
byte planes, the DSA's int16 adds) it is 0.9975. Found by structure: every norm's input
and output, and the inputs of the residual Add that makes its input.
"""

from __future__ import annotations

from ..frontend.onnx_graph import Graph
from .plan import norm_chain


def norm_stream(g: Graph) -> set[str]:
    """Every norm chain's input and output, and both inputs of a two-activation Add that
    produces a norm's input."""
    prod = {o: n for n in g.model.graph.node for o in n.output}
    out: set[str] = set()
    for n in g.model.graph.node:
        chain = norm_chain(g, n)
        if chain is None or n.op_type == "Softmax":
            continue
        x = chain[0]
        out.update((x, n.output[0]))
        add = prod.get(x)
        if add is not None and add.op_type == "Add":
            ins = [i for i in add.input if i and not g.is_const(i)]
            if len(ins) == 2:
                out.update(ins)
    return out
