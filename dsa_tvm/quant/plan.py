"""Which nodes run in int8, which tensors get a QDQ pair, and which tensors share a scale.

Anchors carry weights (Conv, Gemm, MatMul with a constant 2-D weight) and always
quantize unless kept in FP32. Followers (Add and Mul of two activations, same shape or
broadcasting per channel, Mul by a per-channel constant, pooling and global means,
Concat, Relu/Clip, activation chains on one int8 tensor (``table_plan``: the DSA's
tables), and shape-only ops between quantized tensors) quantize when their inputs
already are quantized, so QDQ pairs never appear inside FP32-only parts of the graph. An op the
DSA does not run is simply not in any table: it stays FP32 and never breaks anything.

Scale sharing (union-find over tensor names): MaxPool, Concat and shape-only ops use
one scale for input and output (max and reshape commute with quantization, and
concatenated tensors must agree on one grid); residual Adds requantize each input
to the output scale, so they need no sharing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from ..frontend.onnx_graph import Graph
from ..layers.layouts import broadcast_dims
from .rope_plan import rope_chains
from .table_plan import TABLE_OPS, grow_chain

ACTIVATIONS = {"Relu", "Clip"}
POOLS = {"MaxPool", "AveragePool", "GlobalAveragePool"}
SHARED_SCALE_OPS = {"MaxPool", "Concat", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze",
                    "Resize", "Slice"}
SHAPE_OPS = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze"}
#: data movement the DSA runs as DMA copies (one scale in and out): nearest Resize and
#: Slice (a channel slice of an NCHW image; any other slice is still an exact int8 copy)
MOVEMENT_OPS = {"Resize", "Slice"}


def _is_copy(g: Graph, n: onnx.NodeProto) -> bool:
    """A Resize that copies elements (nearest): bilinear/cubic compute new values."""
    if n.op_type == "Slice":
        return True
    mode = g.attr(n, "mode", b"nearest")
    return (mode.decode() if isinstance(mode, bytes) else str(mode)) == "nearest"


#: the ONNX ops whose constant weights make them anchors (int8 weighted layers)
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class Anchor:
    """A weighted layer: its weight (and bias) initializers and the per-channel axis."""

    node: onnx.NodeProto
    weight: str
    axis: int
    bias: str | None = None
    bias_add: onnx.NodeProto | None = None  # MatMul + Add(bias) pairs
    act: onnx.NodeProto | None = None       # a Relu/Clip fused into the output


@dataclass
class Follower:
    """An op without weights that runs in int8 because its inputs already are."""

    node: onnx.NodeProto
    inputs: list[str]                      # activation inputs
    act: onnx.NodeProto | None = None      # Relu/Clip fused into a residual Add
    chain: list[onnx.NodeProto] = field(default_factory=list)  # an activation table's ops

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def output(self) -> str:
        return (self.act or self.node).output[0]


@dataclass
class Plan:
    anchors: dict[str, Anchor] = field(default_factory=dict)      # node name -> anchor
    followers: list[Follower] = field(default_factory=list)
    tensors: set[str] = field(default_factory=set)                 # activations to QDQ
    groups: dict[str, str] = field(default_factory=dict)           # tensor -> group root
    kept_fp32: dict[str, str] = field(default_factory=dict)        # node name -> why
    # quantized output of a fused Relu/Clip -> (pre-activation tensor, lower, upper bound):
    # calibration observes the pre-activation and clamps to the bounds (a ReLU6 output's
    # spike at 6 would otherwise mislead the histogram methods)
    pre_act: dict[str, tuple[str, float, float]] = field(default_factory=dict)
    #: FP32-looking nodes inside a norm chain whose ends are int8 (RMSNorm's Pow, Sqrt, ...)
    interior: set[str] = field(default_factory=set)
    # activation ops (table_plan.TABLE_OPS) on an int8 tensor left FP32: node name -> why
    table_fp32: dict[str, str] = field(default_factory=dict)

    @property
    def quantized_nodes(self) -> set[str]:
        """Names of every node that consumes int8 operands (anchors, followers, fused acts)."""
        out = set(self.anchors) | {f.name for f in self.followers} | self.interior
        out |= {a.act.name for a in self.anchors.values() if a.act} | \
               {a.bias_add.name for a in self.anchors.values() if a.bias_add} | \
               {f.act.name for f in self.followers if f.act} | \
               {n.name for f in self.followers for n in f.chain}
        return out

    def group_members(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for t in sorted(self.tensors):
            out.setdefault(self.root(t), []).append(t)
        return out

    def root(self, t: str) -> str:
        while self.groups.get(t, t) != t:
            t = self.groups[t]
        return t

    def union(self, a: str, b: str) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra != rb:
            self.groups[rb] = ra
            self.groups.setdefault(ra, ra)


def _single_consumer(g: Graph, t: str) -> onnx.NodeProto | None:
    cons = g.consumers.get(t, [])
    if len(cons) == 1 and t not in g.outputs:
        return cons[0]
    return None


def _fusable_act(g: Graph, t: str) -> onnx.NodeProto | None:
    """A Relu or a constant-bound Clip consuming ``t`` alone (folds into the requantize)."""
    c = _single_consumer(g, t)
    if c is None or c.op_type not in ACTIVATIONS:
        return None
    if c.op_type == "Clip" and any(i and not g.is_const(i) for i in c.input[1:]):
        return None
    return c


def _anchor(g: Graph, n: onnx.NodeProto) -> Anchor | str:
    """The Anchor for a weighted node, or the reason it cannot be one."""
    if n.op_type == "Conv":
        if not g.is_const(n.input[1]):
            return "weights are not a constant"
        if len(g.shape(n.input[1]) or ()) not in (3, 4):
            return "only 1-D and 2-D convolutions are quantized"
        bias = n.input[2] if len(n.input) > 2 and n.input[2] else None
        if bias is not None and not g.is_const(bias):
            return "bias is not a constant"
        a = Anchor(n, n.input[1], 0, bias)
    elif n.op_type == "ConvTranspose":
        if not g.is_const(n.input[1]):
            return "weights are not a constant"
        if len(g.shape(n.input[1]) or ()) != 4:
            return "only 2-D transposed convolutions are quantized"
        if int(g.attr(n, "group", 1)) != 1:
            return "grouped ConvTranspose (its output channels are not one weight axis)"
        bias = n.input[2] if len(n.input) > 2 and n.input[2] else None
        if bias is not None and not g.is_const(bias):
            return "bias is not a constant"
        a = Anchor(n, n.input[1], 1, bias)  # weight [C_in, C_out, kh, kw]: outputs on axis 1
    elif n.op_type == "Gemm":
        if g.attr(n, "transA", 0) or g.attr(n, "alpha", 1.0) != 1.0 or g.attr(n, "beta", 1.0) != 1.0:
            return "Gemm with transA or alpha/beta != 1"
        if not g.is_const(n.input[1]):
            return "weights are not a constant"
        bias = n.input[2] if len(n.input) > 2 and n.input[2] else None
        if bias is not None and (not g.is_const(bias) or len(g.shape(bias) or ()) != 1):
            return "bias is not a 1-D constant"
        a = Anchor(n, n.input[1], 0 if g.attr(n, "transB", 0) else 1, bias)
    elif n.op_type == "MatMul":
        if not g.is_const(n.input[1]) or len(g.shape(n.input[1]) or ()) != 2:
            return "second operand is not a constant 2-D weight (activation x activation stays FP32)"
        a = Anchor(n, n.input[1], 1)
        add = _single_consumer(g, n.output[0])
        if add is not None and add.op_type == "Add":
            other = add.input[1] if add.input[0] == n.output[0] else add.input[0]
            shape = g.shape(other)
            if g.is_const(other) and shape is not None and len(shape) == 1:
                a.bias, a.bias_add = other, add
    else:
        return "not a weighted layer"
    out = (a.bias_add or n).output[0]
    a.act = _fusable_act(g, out)
    return a


def _same_shape(g: Graph, a: str, b: str) -> bool:
    sa, sb = g.shape(a), g.shape(b)
    return sa is not None and sa == sb and -1 not in sa


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def binary_reason(g: Graph, n: onnx.NodeProto) -> str | None:
    """None if the DSA runs this two-operand Add/Mul in int8, else why not: two activations
    of one shape or one broadcasting per channel (``[N, C, 1, 1]`` against ``[N, C, H, W]``),
    or (Mul) an activation and a per-channel or scalar constant (a layer scale)."""
    out = g.shape(n.output[0])
    ins = [i for i in n.input if i and not g.is_const(i)]
    shapes = [g.shape(i) for i in n.input]
    if not (_static(out) and all(_static(s) for s in shapes)):
        return "shapes are not static"
    if n.op_type == "Div" and n.input[1] in ins:
        return "divides by an activation (only division by a constant is a product)"
    if len(ins) == 2:
        full = [i for i in ins if tuple(g.shape(i)) == tuple(out)]
        if not full:
            return f"neither operand has the output's shape {list(out)}"
        other = ins[1] if full[0] == ins[0] else ins[0]
        d = broadcast_dims(tuple(out), tuple(g.shape(other)))
        return d if isinstance(d, str) else None
    if len(ins) != 1 or n.op_type not in ("Mul", "Div"):
        return None if len(ins) == 1 else "computes from constants only"
    c = [i for i in n.input if i and g.is_const(i)][0]
    if n.op_type == "Div" and np.any(g.const(c) == 0):
        return "divides by zero"
    cs = tuple(g.shape(c))
    if tuple(g.shape(ins[0])) != tuple(out):
        return "the activation broadcasts to the output"
    rank = len(out)
    full = (1,) * (rank - len(cs)) + cs if len(cs) <= rank else None
    ch = 1 if rank == 4 else rank - 1
    if full is None or any(d != 1 for i, d in enumerate(full) if i != ch):
        return f"constant of shape {list(cs)} varies along more than the channel axis"
    return None


def _global_mean(g: Graph, n: onnx.NodeProto) -> bool:
    """ReduceMean over H and W of an NCHW tensor (a global average pool; without keepdims
    its (N, C) result is the same bytes as the pool's (N, C, 1, 1) on the DSA)."""
    shape = g.shape(n.input[0])
    axes = g.attr(n, "axes", None)
    if axes is None and len(n.input) > 1 and n.input[1] and g.is_const(n.input[1]):
        axes = [int(a) for a in g.const(n.input[1]).reshape(-1)]
    if shape is None or len(shape) != 4 or axes is None:
        return False
    return sorted(int(a) % 4 for a in axes) == [2, 3]


def anchor_output(a: Anchor) -> str:
    return ((a.act or a.bias_add) or a.node).output[0]


def make_plan(g: Graph, keep_fp32: set[str] = frozenset(), available: set[str] | None = None,
              quantize_adds: bool = True, quantize_matmuls: bool = True,
              quantize_norms: bool = False, wide: frozenset[str] = frozenset()) -> Plan:
    """Decide what to quantize. ``available``: tensors that have a calibrated range (None
    while planning calibration itself); a node whose tensors lack one stays FP32.
    ``quantize_norms``: Softmax, LayerNormalization and the RMSNorm chain get int8 in and
    out (:func:`norm_chain`), for a DSA with ``[norm]`` units. ``wide``: int16 tensors
    (a residual stream): their producers stay quantized even where only FP32 ops, or a
    norm chain's interior, read them."""
    p = Plan()

    def ok(t: str) -> bool:
        return available is None or t in available

    for name in keep_fp32:
        p.kept_fp32[name] = "kept in FP32 on request"
    for n in g.model.graph.node:
        if n.op_type not in WEIGHTED_OPS or n.name in keep_fp32:
            continue
        a = _anchor(g, n)
        if isinstance(a, str):
            if n.op_type != "MatMul" or g.is_const(n.input[1]):
                p.kept_fp32[n.name] = a
            continue
        if not (ok(n.input[0]) and ok(anchor_output(a))):
            p.kept_fp32[n.name] = "no calibrated range for its input or output"
            continue
        p.anchors[n.name] = a
    fused = {id(x) for a in p.anchors.values() for x in (a.act, a.bias_add) if x is not None}
    produced = {anchor_output(a) for a in p.anchors.values()}
    int8 = produced | {a.node.input[0] for a in p.anchors.values()}
    # rotary embeddings: one int8 op whose interior stays FP32 (kinds.rope on the DSA)
    ropes = {a: c for a, c in rope_chains(g).items()
             if a not in keep_fp32 and not set(c[1]) & set(keep_fp32)}
    rope_interior = {name for _, inner in ropes.values() for name in inner}
    rope_readers: set[str] = set()   # interior ops of planned chains: they read int8 x
    # followers, in topological order (the ONNX node order), so chains propagate
    for n in g.model.graph.node:
        if id(n) in fused or n.name in keep_fp32 or n.name in p.anchors \
                or n.name in rope_interior:
            continue
        ins = [i for i in n.input if i and not g.is_const(i)]
        if not ins:
            continue
        if n.name in ropes:
            x, inner = ropes[n.name]
            if x not in produced:
                continue
            f = Follower(n, [x])
            if all(ok(t) for t in f.inputs + [f.output]):
                p.interior.update(inner)
                rope_readers.update(inner)
        elif (f := _table_follower(g, p, n, ins, produced, keep_fp32)) is not None:
            if not all(ok(t) for t in f.inputs + [f.output]):
                continue
            fused.update(id(c) for c in f.chain)
        elif n.op_type == "Add" and quantize_adds:
            if len(ins) != 2 or not any(i in produced for i in ins) or (
                    not _same_shape(g, *ins) and binary_reason(g, n) is not None):
                continue
            act = _fusable_act(g, n.output[0])
            f = Follower(n, ins, act)
            if act is not None:
                fused.add(id(act))
        elif quantize_norms and (chain := norm_chain(g, n)) is not None:
            # like a matmul of two activations, it quantizes its input itself
            f = Follower(n, [chain[0]])
            if all(ok(t) for t in f.inputs + [f.output]):
                p.interior.update(chain[1])
        elif n.op_type in ("Mul", "Div") and quantize_adds:
            # x * gate (SE), x * sigmoid(x), x * layer_scale: both activations int8 already
            if not all(i in produced for i in ins) or binary_reason(g, n) is not None:
                continue
            act = _fusable_act(g, n.output[0])
            f = Follower(n, ins, act)
            if act is not None:
                fused.add(id(act))
        elif n.op_type == "ReduceMean":
            if not _global_mean(g, n) or not all(i in produced for i in ins[:1]):
                continue
            f = Follower(n, ins[:1])
        elif n.op_type == "MatMul" and quantize_matmuls:
            # two activations (attention's Q @ K^T, P @ V): the DSA's batch matmul runs it
            # whatever produced its inputs, so it quantizes them itself
            if len(ins) != 2 or g.is_const(n.input[1]):
                continue
            f = Follower(n, ins)
        elif n.op_type in POOLS | ACTIVATIONS | {"Concat"} | SHAPE_OPS | MOVEMENT_OPS:
            if not all(i in produced or _cache_input(g, n, i, produced) for i in ins):
                continue
            if n.op_type in MOVEMENT_OPS and (not _is_copy(g, n) or len(ins) != 1):
                continue
            if n.op_type == "Clip" and any(i and not g.is_const(i) for i in n.input[1:]):
                continue
            f = Follower(n, ins[:1] if n.op_type in ACTIVATIONS else ins)
        else:
            continue
        if not all(ok(t) for t in f.inputs + [f.output]):
            continue
        p.followers.append(f)
        produced.add(f.output)
        int8.update(f.inputs)
    _prune_followers(g, p, rope_readers, wide)
    for a in p.anchors.values():
        p.tensors.update([a.node.input[0], anchor_output(a)])
    for f in p.followers:
        p.tensors.update(f.inputs + [f.output])
        if f.node.op_type in SHARED_SCALE_OPS:
            for i in f.inputs:
                p.union(i, f.output)
    for t in p.tensors:
        p.groups.setdefault(t, t)
    for act in [a.act for a in p.anchors.values()] + [f.act for f in p.followers]:
        if act is not None and act.output[0] in p.tensors:
            p.pre_act[act.output[0]] = (act.input[0], *_act_bounds(g, act))
    return p


def _table_follower(g: Graph, p: Plan, n: onnx.NodeProto, ins: list[str], produced: set[str],
                    keep_fp32: set[str]) -> Follower | None:
    """An activation chain (``table_plan``) starting at ``n`` on one int8 tensor, as one
    follower whose output is the chain's end; None when ``n`` starts none (why, if it
    could have, goes to ``p.table_fp32``)."""
    if n.op_type not in TABLE_OPS or len(set(ins)) != 1 or ins[0] not in produced:
        return None
    got = grow_chain(g, n, ins[0])
    if got is None:
        return None
    if isinstance(got, str):
        p.table_fp32[n.name] = got
        return None
    nodes, end = got
    kept = [c.name for c in nodes if c.name in keep_fp32]
    if kept:
        p.table_fp32[n.name] = f"its chain holds {kept[0]}, kept in FP32 on request"
        return None
    last = next(c for c in nodes if end in c.output)
    return Follower(last, [ins[0]], chain=nodes)


def _act_bounds(g: Graph, act: onnx.NodeProto) -> tuple[float, float]:
    """The output interval of a Relu or a constant-bound Clip."""
    if act.op_type == "Relu":
        return 0.0, float("inf")
    lo = float(g.const(act.input[1])) if len(act.input) > 1 and act.input[1] else -float("inf")
    hi = float(g.const(act.input[2])) if len(act.input) > 2 and act.input[2] else float("inf")
    if not act.input[1:] or g.opset() < 11:
        lo, hi = float(g.attr(act, "min", -3.4e38)), float(g.attr(act, "max", 3.4e38))
    return lo, hi


NORM_OPS = ("Softmax", "LayerNormalization", "Mul", "Div")


def _last_axis(g: Graph, n: onnx.NodeProto, default: int) -> bool:
    shape = g.shape(n.input[0])
    axes = g.attr(n, "axes", None)
    axis = axes if axes is not None else [g.attr(n, "axis", default)]
    if n.op_type == "ReduceMean" and axes is None and len(n.input) > 1 and n.input[1]:
        axis = [int(v) for v in g.const(n.input[1]).reshape(-1)] if g.is_const(n.input[1]) else []
    return shape is not None and len(axis) == 1 and int(axis[0]) % len(shape) == len(shape) - 1


def norm_chain(g: Graph, n: onnx.NodeProto) -> tuple[str, list[str]] | None:
    """(input tensor, interior node names) when ``n`` ends a row op the [norm] units run:
    Softmax / LayerNormalization over the last axis, or RMSNorm as exported,
    ``Mul(Div(x, Sqrt(Add(ReduceMean(Pow(x, 2)), eps))), weight)`` or (``torch.rsqrt``, as
    Llama writes it) ``Mul(Mul(x, Div(1, Sqrt(...))), weight)``, the weight optional; else
    None."""
    if n.op_type == "Softmax":
        return (n.input[0], []) if _last_axis(g, n, -1) else None
    if n.op_type == "LayerNormalization":
        return (n.input[0], []) if _last_axis(g, n, -1) else None
    if n.op_type not in ("Mul", "Div"):
        return None
    prod = {o: m for m in g.model.graph.node for o in m.output}
    core = _rms_core(g, prod, n)
    top = n
    if core is None and n.op_type == "Mul" and any(g.is_const(i) for i in n.input):
        top = next((prod.get(i) for i in n.input if not g.is_const(i)), None)
        core = _rms_core(g, prod, top) if top is not None else None
    if core is None:
        return None
    x, inner = core
    if top is n and any(c.op_type == "Mul" and any(g.is_const(i) for i in c.input)
                        for c in g.consumers.get(n.output[0], [])):
        return None  # the weighted Mul after it ends the chain
    return x, inner + ([top.name] if top is not n else [])


def _rms_core(g: Graph, prod: dict, node: onnx.NodeProto) -> tuple[str, list[str]] | None:
    """(x, interior nodes) of ``Div(x, Sqrt(...))`` or ``Mul(x, Div(1, Sqrt(...)))`` whose
    ``...`` is ``Add(ReduceMean(Pow(x, 2)), eps)`` over the last axis."""
    extra: list[str] = []
    if node.op_type == "Div":
        x, sq = node.input[0], prod.get(node.input[1])
    elif node.op_type == "Mul" and not any(g.is_const(i) for i in node.input):
        for i in (1, 0):
            rd = prod.get(node.input[i])
            if rd is not None and rd.op_type == "Div" and g.is_const(rd.input[0]) \
                    and float(np.asarray(g.const(rd.input[0])).reshape(-1)[0]) == 1.0 \
                    and np.asarray(g.const(rd.input[0])).size == 1:
                x, sq, extra = node.input[1 - i], prod.get(rd.input[1]), [rd.name]
                break
        else:
            return None
    else:
        return None
    add = prod.get(sq.input[0]) if sq is not None and sq.op_type == "Sqrt" else None
    mean = prod.get(next((i for i in add.input if not g.is_const(i)), "")) \
        if add is not None and add.op_type == "Add" else None
    pw = prod.get(mean.input[0]) if mean is not None and mean.op_type == "ReduceMean" else None
    if pw is None or pw.op_type != "Pow" or pw.input[0] != x or not g.is_const(pw.input[1]) \
            or float(g.const(pw.input[1])) != 2.0 or not _last_axis(g, mean, -1):
        return None
    return x, [m.name for m in (pw, mean, add, sq)] + extra


def _cache_input(g: Graph, n: onnx.NodeProto, name: str, produced: set[str]) -> bool:
    """A graph input a Concat joins to int8 tensors (an LLM step's KV cache and the new
    rows): quantized at the boundary on the Concat's shared grid, so the concat is a copy
    (the DSA's movement room) and the new rows are requantized once, onto the cache's
    grid."""
    return (n.op_type == "Concat" and name in g.inputs
            and any(i in produced for i in n.input if i != name))


def _prune_followers(g: Graph, p: Plan, also_int8: set[str] = frozenset(),
                     wide: frozenset[str] = frozenset()) -> None:
    """Drop followers whose result no int8 op reads (repeat until stable): a residual Add
    feeding a LayerNorm, or a reshape before an FP32 op, would only add a quantization
    step to an FP32 path. Matmuls of two activations stay: their MACs run on the DSA, and
    so do the producers of ``wide`` (int16) tensors.
    ``also_int8``: interior nodes that read their chain's int8 input (a rotary chain's)."""
    while True:
        readers = set(p.anchors) | {f.name for f in p.followers} | set(also_int8)
        keep = [f for f in p.followers if f.node.op_type in ("MatMul", *NORM_OPS)
                or f.output in wide
                or any(c.name in readers for c in g.consumers.get(f.output, []))]
        if len(keep) == len(p.followers):
            return
        p.followers = keep


def fp32_reasons(g: Graph, p: Plan, quantize_adds: bool = True) -> dict[str, tuple[str, str]]:
    """Every node the plan leaves in FP32 that ``p.kept_fp32`` does not explain already:
    node name -> (op type, why)."""
    done = p.quantized_nodes | set(p.kept_fp32)
    out = {}
    for n in g.model.graph.node:
        if n.name in done:
            continue
        ins = [i for i in n.input if i and not g.is_const(i)]
        if n.op_type in ("Add", "Mul", "Div") and not quantize_adds:
            why = "residual adds stay FP32 (quantize_adds=False)"
        elif n.op_type in ("Add", "Mul", "Div") and (bad := binary_reason(g, n)) is not None:
            why = f"no int8 form: {bad}"
        elif n.name in p.table_fp32:
            why = p.table_fp32[n.name]
        elif n.op_type == "Resize" and ins and not _is_copy(g, n):
            why = "only nearest Resize is a copy; this one interpolates (FP32 on the CPU)"
        elif n.op_type in POOLS | ACTIVATIONS | SHAPE_OPS | MOVEMENT_OPS | {
                "Add", "Mul", "Div", "Concat", "MatMul", "ReduceMean"} and ins:
            if all(i in p.tensors for i in ins):
                why = "no int8 op reads its output (an int8 step would only add error)"
            else:
                why = "an input is not int8 (no int8 op produces it)"
        elif n.op_type in ("Softmax", "LayerNormalization") and ins:
            why = ("FP32 on the CPU; the DSA's [norm] units run it with quantize_norms=True "
                   "(dsa-tvm quantize --quantize-norms) when it normalizes the last axis")
        elif not ins:
            why = "computes from constants only"
        elif n.op_type in TABLE_OPS and all(i in p.tensors for i in ins):
            why = "no int8 op reads its chain's output (an int8 step would only add error)"
        elif n.op_type in TABLE_OPS:
            why = ("activation on an FP32 tensor (no int8 op produces its input, or it reads "
                   "two different tensors): stays FP32 on the CPU")
        else:
            why = ("no int8 form (the DSA runs conv/dense/matmul, adds, products, global "
                   "means, pooling, Relu/Clip, Concat, Slice, nearest Resize and reshapes); runs in "
                   "FP32 on the CPU")
        out[n.name] = (n.op_type, why)
    return out
