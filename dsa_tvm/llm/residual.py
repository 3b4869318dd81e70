"""A decoder's residual stream, its SiLU-gate products, its attention probabilities and its
logits in its exported step graph: the tensors that go int16.

Rounding the residual stream to one int8 grid is the DSA's largest W8A8 error on
SmolLM2 (``benchmarks/llm_quant_study.py --dsa``: +971% perplexity against +5% with
int16 grids); int16 static grids there cost nothing measurable. The stream is found
by structure, not by name: from the hidden-state input ``x``, each residual Add takes
the stream and a branch (o_proj's or down_proj's output) and gives the next stream
value, which the next norm and the next Add read.

down_proj's input, the SiLU-gate product, is the one linear input whose int8 static grid
costs measurably more than finer ones (``benchmarks/llm_qdq_proxy.py``: int16 there, or
per-token int8, halves the W8A8 step's KL divergence from FP32 on SmolLM2). It goes int16
too; the compiler runs its dense as two int8 byte planes
(``relay_passes.kinds.dense_planes``). Found by structure: a MatMul's input that is the
product of two activations.

The gated MLP's interior (gate's and up's outputs, the SiLU's sigmoid and product) on int8
grids is a seventh of the W8A8 step's KL divergence from FP32 on SmolLM2 (the proxy,
docs/llm.md): the SiLU reads the gate's coarse int8 codes. On int16 grids the gate and up
denses write int16 (REQUANT's wide mode), the SiLU runs as an interpolated int16 table
(``layers.wide_table``) and the product reads int16 operands. Found by structure: the
factors of each gate product.

Q, K and V with their cache (``attention_operands``) on int16 grids: the attention's
operands, which the compiler runs as byte planes; found by structure from the cache concat.

The attention's probabilities (the softmax's output, P of P @ V) on their int8 grid, steps
of 1/256, round a long row's small weights (near 1 / context) to 0 or 1/256; an int16 grid
there cuts the step's KL divergence by 29% on SmolLM2 (the proxy, docs/llm.md). The
softmax writes int16 codes (NORM's ``out_wide``) and P @ V runs as two byte planes
(``relay_passes.kinds.matmul_planes``).
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


def gate_products(model: onnx.ModelProto) -> set[str]:
    """Inputs of MatMul nodes that a Mul of two activations produces, one of them a
    MatMul's output (up_proj's): the gated MLP's products that feed down_proj (not a norm's
    own product, whose factors come from the stream and its scale)."""
    made = {o: n for n in model.graph.node for o in n.output}
    out = set()
    for n in model.graph.node:
        prod = made.get(n.input[0]) if n.op_type == "MatMul" and n.input else None
        if prod is None or prod.op_type != "Mul":
            continue
        factors = [made.get(i) for i in prod.input]
        if all(f is not None for f in factors) and any(f.op_type == "MatMul" for f in factors):
            out.add(n.input[0])
    return out


def mlp_interior(model: onnx.ModelProto) -> set[str]:
    """The tensors between the gate and up projections and their product (``gate_products``):
    both projections' outputs, and the SiLU's ops' outputs on the gate (``x * sigmoid(x)``,
    its sigmoid), found as the element-wise nodes between the gate and the product."""
    made = {o: n for n in model.graph.node for o in n.output}
    out: set[str] = set()
    for product in gate_products(model):
        node = made[product]
        ends = {f for f in node.input if getattr(made.get(f), "op_type", "") == "MatMul"}
        for f in node.input:
            out |= _silu_ops(made, f, ends)
        out |= ends                    # up's output, and the gate's under the SiLU
    return out


def mlp_inputs(model: onnx.ModelProto) -> set[str]:
    """The inputs of the gate and up projections (the MatMuls whose outputs the gated
    MLP's products are made from): of the linear layers' inputs, the one whose int16 grid
    moves SmolLM2's perplexity (the proxy beside Q, K and V on int16: +3.2% -> +2.6%, where
    q/k/v's and o's inputs move nothing, docs/llm.md)."""
    made = {o: n for n in model.graph.node for o in n.output}
    ends: set[str] = set()
    for product in gate_products(model):
        for f in made[product].input:
            _silu_ops(made, f, ends)
    return {made[t].input[0] for t in ends}


def _silu_ops(made: dict, t: str, ends: set[str]) -> set[str]:
    """``t`` and the outputs of the element-wise nodes under it down to a MatMul's output
    (the gate projection's, added to ``ends``); empty if ``t`` is not such a chain."""
    node = made.get(t)
    if node is None or node.op_type == "MatMul":
        if node is not None:
            ends.add(t)
        return set()
    if node.op_type not in ("Mul", "Sigmoid"):
        return set()
    found = {t}
    for i in node.input:
        found |= _silu_ops(made, i, ends)
    return found


def attention_probabilities(model: onnx.ModelProto) -> set[str]:
    """Outputs of every Softmax that a MatMul reads (attention's P of P @ V)."""
    made = {o: n for n in model.graph.node for o in n.output}
    return {n.input[0] for n in model.graph.node if n.op_type == "MatMul" and n.input
            and getattr(made.get(n.input[0]), "op_type", None) == "Softmax"}


def attention_operands(model: onnx.ModelProto) -> set[str]:
    """Q, K and V with their cache: for each MatMul whose second operand is, through head
    moves (Transpose, Reshape), a Concat of a graph input (the cache) and the new rows,
    that operand, the moves, the concat, the cache input and the new rows back through
    their head split and rotary chain to the projection's output, and the first operand
    (Q) back the same way. On int16 grids they take the W8A8 step's KL divergence from
    FP32 a fifth lower on SmolLM2 (the proxy, docs/llm.md); the attention runs each as
    byte planes, the host keeping the cache's int16 codes (``lowering.cache_planes``)."""
    made = {o: n for n in model.graph.node for o in n.output}
    graph_inputs = {i.name for i in model.graph.input}
    out: set[str] = set()
    for n in model.graph.node:
        if n.op_type != "MatMul" or len(n.input) != 2:
            continue
        moves, t = set(), n.input[1]
        while getattr(made.get(t), "op_type", None) in ("Transpose", "Reshape"):
            moves.add(t)
            t = made[t].input[0]
        cat = made.get(t)
        if cat is None or cat.op_type != "Concat" or len(cat.input) != 2 \
                or cat.input[0] not in graph_inputs:
            continue
        out |= moves | {t, cat.input[0]} | _made_from_projection(made, cat.input[1])
        if getattr(made.get(n.input[0]), "op_type", None) != "Softmax":    # Q, not P
            out |= _made_from_projection(made, n.input[0])
    return out


def _made_from_projection(made: dict, t: str) -> set[str]:
    """``t`` and the outputs of the nodes that make it from activations, back to a MatMul's
    output (included; its inputs not): the new rows' head split and rotary chain."""
    node = made.get(t)
    if node is None or node.op_type == "Constant":
        return set()
    found = {t}
    if node.op_type != "MatMul":
        for i in node.input:
            if i:
                found |= _made_from_projection(made, i)
    return found


def linear_inputs(model: onnx.ModelProto) -> set[str]:
    """The first input of every MatMul with a constant weight but the head's: the linear
    layers' inputs, which int16 grids take from KL 0.031 to 0.027 beside int16 outputs
    (the proxy, docs/llm.md); the compiler runs each such dense as two byte planes."""
    consts = {i.name for i in model.graph.initializer}
    made = {o: n for n in model.graph.node for o in n.output}

    def constant(t: str) -> bool:   # an initializer, or a node of initializers only
        n = made.get(t)
        return t in consts or (n is not None and all(constant(i) for i in n.input if i))

    return {n.input[0] for n in model.graph.node if n.op_type == "MatMul"
            and len(n.input) == 2 and constant(n.input[1]) and LOGITS not in n.output}


#: the step graph's logits output (``llm.step``)
LOGITS = "logits"


def logits(model: onnx.ModelProto) -> set[str]:
    """The logits, when a node makes them: the head's output, whose int8 grid spans the
    whole calibrated range (SmolLM2: the head in FP32 takes the proxy's KL from 0.046 to
    0.042, int16 logits to 0.043)."""
    return {LOGITS} & {o for n in model.graph.node for o in n.output}


def head_matmuls(model: onnx.ModelProto) -> set[str]:
    """The MatMul nodes that make the logits (the head): a per-group quantization gives
    their weights 8 bits (the token embedding the head shares is on no Q4_1 grid; at 8
    bits the proxy's W4A8 KL falls from 0.097 to 0.0446, docs/llm.md)."""
    return {n.name for n in model.graph.node if n.op_type == "MatMul" and LOGITS in n.output}
