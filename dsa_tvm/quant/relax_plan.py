"""Which tensors of an FP32 Relax graph to quantize, and how they group.

The plan walks ``main``'s bindings once and forms *chains*: an anchor op the DSA
runs (conv2d and dense with constant weights, a matmul of two activations, a
residual add, max/avg/global pooling) with the ops it absorbs (a per-channel
constant bias add after conv/dense, then ReLU or Clip). A chain gets int8
inputs and one int8 output: exactly the dequantize -> op -> quantize shape the
partitioner's patterns match. Everything else stays FP32 and reads the
dequantized tensors.

Scale groups: a max pool and pure data movement (reshape, transpose) change no
value, so their output shares its input's scale and zero point; the observer of
a group sees every member.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax
from tvm.ir import Op
from tvm.ir.expr import GenericConst

from dsa_tvm.layers.layouts import broadcast_dims
from relay_passes.kinds.match import prim_float
from relay_passes.kinds.scales import channel_addend

ANCHORS = ("relax.nn.conv2d", "relax.matmul", "relax.add", "relax.nn.max_pool2d",
           "relax.nn.avg_pool2d", "relax.mean", "relax.multiply", "relax.divide")
ACTIVATIONS = ("relax.nn.relu", "relax.clip")
MOVEMENT = ("relax.reshape", "relax.permute_dims", "relax.flatten", "relax.squeeze",
            "relax.expand_dims")
#: why a multiply or divide stays FP32 (:func:`_binary` says which cases run int8)
_PRODUCT_WHY = ("no int8 form on the DSA: an operand is FP32 (no int8 op produces it), the "
                "divisor is not a constant, or a constant or operand varies along more than "
                "the channel axis")


@dataclass
class Chain:
    """An anchor op and what it absorbs; ``output`` is the var that gets quantized."""

    kind: str                       # conv2d | dense | batch_matmul | add | max_pool2d | ...
    anchor: relax.Var
    inputs: list[relax.Var]         # float activations that get int8 (quantize -> dequantize)
    output: relax.Var
    weight: np.ndarray | None = None
    bias_var: relax.Var | None = None   # the last absorbed per-channel op (becomes the bias add)
    bias: np.ndarray | None = None      # y = anchor * fold_scale + bias, per output channel
    fold_scale: np.ndarray | None = None
    folded: list[relax.Var] = field(default_factory=list)  # absorbed ops before bias_var
    pre_activation: relax.Var | None = None  # the var before the absorbed ReLU/Clip
    act: tuple[float, float] | None = None    # its bounds in real units
    groups: int = 1
    members: list[relax.Var] = field(default_factory=list)  # a table chain's inner ops


@dataclass
class Plan:
    chains: list[Chain] = field(default_factory=list)
    #: var -> the var whose group it belongs to (union-find parent)
    parent: dict[relax.Var, relax.Var] = field(default_factory=dict)
    kept_fp32: dict[str, str] = field(default_factory=dict)  # anchor name -> why
    #: (op, why) -> bindings left FP32, filled by ``quantize_relax`` (:meth:`fp32_ops`)
    fp32: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: products by a scalar constant left to the table chains (``make_plan``)
    deferred: frozenset = frozenset()

    def root(self, v: relax.Var) -> relax.Var:
        while self.parent.get(v, v) is not v:
            v = self.parent[v]
        return v

    def union(self, a: relax.Var, b: relax.Var) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra is not rb:
            self.parent[rb] = ra

    @property
    def points(self) -> list[relax.Var]:
        """Every var that gets quantize -> dequantize, in first-seen order."""
        out: dict[relax.Var, None] = {}
        for c in self.chains:
            for v in c.inputs + [c.output]:
                out[v] = None
        return list(out)

    def fp32_ops(self, func: relax.Function) -> dict[tuple[str, str], list[str]]:
        """(op, why) -> the bindings of ``func`` (the function the plan was made on) that
        stay FP32: every op no chain quantizes or absorbs, so the summary hides none."""
        absorbed: set[relax.Var] = set()
        for c in self.chains:
            absorbed |= {c.anchor, c.output, *c.folded, *c.members}
            absorbed |= {v for v in (c.bias_var, c.pre_activation) if v is not None}
        out: dict[tuple[str, str], list[str]] = {}
        for blk in func.body.blocks:
            for b in blk.bindings:
                op = _op(b.value)
                if not op or b.var in absorbed:
                    continue
                why = self.kept_fp32.get(b.var.name) or (
                    _PRODUCT_WHY if op in ("relax.multiply", "relax.divide")
                    else "an anchor no int8 chain could take" if op in ANCHORS
                    else "no int8 form on the DSA (conv/dense/matmul, adds, products, pooling, "
                    "ReLU/Clip)")
                out.setdefault((op, why), []).append(b.var.name)
        return out

    def observed(self, v: relax.Var) -> relax.Var:
        """What calibration records for ``v``: the pre-activation of a fused ReLU/Clip
        (histogram methods need the values the activation cuts, see the observers)."""
        for c in self.chains:
            if c.output is v and c.pre_activation is not None:
                return c.pre_activation
        return v


def _op(e: relax.Expr) -> str:
    return e.op.name if isinstance(e, relax.Call) and isinstance(e.op, Op) else ""


def _const(e: relax.Expr, var2val: dict) -> np.ndarray | None:
    while isinstance(e, relax.Var) and e in var2val:
        e = var2val[e]
    if isinstance(e, GenericConst):
        return e.value.numpy()
    return None


def _float_tensor(e: relax.Expr) -> bool:
    try:
        return str(e.ty.dtype).startswith("float")
    except AttributeError:
        return False


def _shape(e: relax.Expr) -> tuple[int, ...]:
    return tuple(int(d) for d in e.ty.shape)


AFFINE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def _absorb_affine(ch: Chain, axis: int, var2val: dict, only_user, absorbed: set) -> None:
    """Fold the per-channel constant adds, subtracts, multiplies and divides after a conv
    or dense layer (its bias; a batch norm as DecomposeOpsForInference leaves it) into
    ``y = anchor * fold_scale + bias``: the weights take the scale, the bias the rest."""
    out_c = ch.weight.shape[0] if ch.kind == "conv2d" else ch.weight.shape[1]
    scale, offset = np.ones(out_c), np.zeros(out_c)
    cur, chain = ch.anchor, []
    while True:
        nxt = only_user(cur)
        call = var2val.get(nxt) if nxt is not None else None
        if call is None or _op(call) not in AFFINE:
            break
        first = call.args[0].same_as(cur)
        other = call.args[1] if first else call.args[0]
        c = _const(other, var2val)
        vec = None if c is None else channel_addend(c, _shape(call), axis)
        op = _op(call)
        if vec is None or vec.shape != (out_c,) or (not first and op in ("relax.subtract",
                                                                         "relax.divide")):
            break
        if op == "relax.add":
            offset = offset + vec
        elif op == "relax.subtract":
            offset = offset - vec
        elif op == "relax.multiply":
            scale, offset = scale * vec, offset * vec
        else:
            scale, offset = scale / vec, offset / vec
        chain.append(nxt)
        cur = nxt
    if chain:
        ch.folded, ch.bias_var, ch.output = chain[:-1], chain[-1], chain[-1]
        ch.bias, ch.fold_scale = offset, scale
        absorbed.update(chain)


def _table_source(e: relax.Expr, var2val: dict, produced: set[relax.Var],
                  absorbed: set[relax.Var]) -> relax.Var | None:
    """The one int8 tensor (a chain's output, of ``e``'s shape) that ``e`` is an element-wise
    function of, through ops a DSA table computes and scalar constants, at least one of
    them more than ReLU/Clip: ``e`` then gets int8 from a table chain (a squeeze-excite
    gate's sigmoid or hardsigmoid after its conv). None otherwise."""
    from relay_passes.table_chains import BINARY, PLAIN, UNARY

    sources: set[relax.Var] = set()
    ops: set[str] = set()

    def walk(x: relax.Expr) -> bool:
        if isinstance(x, relax.Var) and x in produced:
            sources.add(x)
            return True
        c = _const(x, var2val)
        if c is not None:
            return c.size == 1
        call = var2val.get(x) if isinstance(x, relax.Var) else None
        op = _op(call) if call is not None else ""
        if op not in UNARY | BINARY or x in absorbed or not _float_tensor(call):
            return False
        ops.add(op)
        return all(walk(a) for a in (call.args if op in BINARY else call.args[:1]))

    if not walk(e) or len(sources) != 1 or ops <= PLAIN:
        return None
    src = next(iter(sources))
    return src if _shape(src) == _shape(e) else None


def _int8_operands(args: list, var2val: dict, produced: set[relax.Var],
                   absorbed: set[relax.Var]) -> bool:
    """Whether both operands of a product are int8 without a quantize step of their own:
    chain outputs, or table functions of two different ones (``x * sigmoid(x)`` is a
    function of one tensor: a table chain takes it whole)."""
    if all(a in produced for a in args):
        return True
    srcs = [a if a in produced else _table_source(a, var2val, produced, absorbed) for a in args]
    return all(s is not None for s in srcs) and not srcs[0].same_as(srcs[1])


def _binary(v: relax.Var, call: relax.Call, var2val: dict,
            produced: set[relax.Var], absorbed: set[relax.Var] = frozenset()) -> Chain | None:
    """An add or multiply the DSA runs int8: two activations of one shape, or one
    broadcasting per channel (``[N, C, 1, 1]``), or (multiply) an activation times a
    per-channel constant (or divided by one). A product needs both activations int8 already
    (an SE gate from a conv, or a sigmoid/hardsigmoid table of one: :func:`_table_source`),
    or it would only add a quantize step."""
    args, kind = list(call.args), "add" if _op(call) == "relax.add" else "mul"
    consts = [_const(a, var2val) for a in args]
    out = _shape(call)
    if _op(call) == "relax.divide" and (consts[1] is None or np.any(consts[1] == 0)):
        return None  # only a division by a (non-zero) constant is a product
    if all(c is None for c in consts):
        if not all(_float_tensor(a) for a in args):
            return None
        shapes = [_shape(a) for a in args]
        if shapes[0] == shapes[1] == out:
            pass
        elif out not in shapes or isinstance(broadcast_dims(out, shapes[1 - shapes.index(out)]),
                                             str):
            return None
        if kind == "mul" and not _int8_operands(args, var2val, produced, absorbed):
            return None
        return Chain(kind, v, args[:2], v)
    if kind != "mul" or sum(c is None for c in consts) != 1:
        return None
    x = args[0] if consts[0] is None else args[1]
    c = consts[1] if consts[0] is None else consts[0]
    if x not in produced or _shape(x) != out or channel_addend(c, out) is None:
        return None
    return Chain("mul", v, [x], v)


def _scalar_product(call: relax.Call, var2val: dict) -> bool:
    consts = [_const(a, var2val) for a in call.args[:2]]
    return any(c is not None and c.size == 1 for c in consts)


def _feeds_a_table(v: relax.Var, var2val: dict, users: dict) -> bool:
    """Whether ``v`` flows, through element-wise ops of ``v`` alone and scalar constants,
    into an op only a table computes (erf, sigmoid, tanh, ...): then a product by a scalar
    constant at ``v`` is the head of a table chain (GELU's ``x / sqrt(2)``, hardsigmoid's
    ``x / 6``), not a mul chain of its own."""
    from relay_passes.table_chains import BINARY, PLAIN, UNARY

    seen, todo = {v}, [v]
    while todo:
        for u in users.get(todo.pop(), []):
            call = var2val.get(u)
            op = _op(call) if call is not None else ""
            if u in seen or op not in UNARY | BINARY:
                continue
            tensors = call.args if op in BINARY else call.args[:1]
            if not all(a in seen or _const(a, var2val) is not None for a in tensors):
                continue
            if op in UNARY - PLAIN - {"relax.astype"}:
                return True
            seen.add(u)
            todo.append(u)
    return False


def anchor_names(func: relax.Function) -> list[str]:
    """Names of the bindings ``keep_fp32`` may name (the ops a plan can quantize)."""
    return [b.var.name for blk in func.body.blocks for b in blk.bindings if _op(b.value) in ANCHORS]


def make_plan(func: relax.Function, keep_fp32: frozenset[str] = frozenset()) -> Plan:
    """Chains and scale groups of ``func``. Table chains grow first: a product by a scalar
    constant that feeds a table op is left to them; if no table chain takes it after all
    (its ends are not both int8), the plan is made again with it a mul chain."""
    plan = _make_plan(func, keep_fp32, None)
    taken = {m for c in plan.chains if c.kind == "table" for m in (c.anchor, *c.members)}
    if plan.deferred <= taken:
        return plan
    return _make_plan(func, keep_fp32, plan.deferred & taken)


def _make_plan(func: relax.Function, keep_fp32: frozenset[str],
               deferred: frozenset | None) -> Plan:
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    var2val = {b.var: b.value for b in bindings}
    users: dict[relax.Var, list[relax.Var]] = {}
    for b in bindings:
        def visit(e, user=b.var):
            if isinstance(e, relax.Var):
                users.setdefault(e, []).append(user)
        relax.analysis.post_order_visit(b.value, visit)
    plan = Plan()
    absorbed: set[relax.Var] = set()

    def only_user(v: relax.Var) -> relax.Var | None:
        us = users.get(v, [])
        return us[0] if len(us) == 1 else None

    def activation(ch: Chain) -> None:
        nxt = only_user(ch.output)
        if nxt is None or _op(var2val[nxt]) not in ACTIVATIONS:
            return
        call = var2val[nxt]
        if _op(call) == "relax.nn.relu":
            ch.act = (0.0, float("inf"))
        else:
            ch.act = (prim_float(call.args[1]), prim_float(call.args[2]))
        ch.pre_activation, ch.output = ch.output, nxt
        absorbed.add(nxt)

    for b in bindings:
        v, call = b.var, b.value
        op = _op(call)
        if v in absorbed or op not in ANCHORS or not _float_tensor(call):
            continue
        if v.name in keep_fp32:
            plan.kept_fp32[v.name] = "kept in FP32 on request"
            continue
        args = list(call.args)
        ch: Chain | None = None
        if op == "relax.nn.conv2d":
            w = _const(args[1], var2val)
            if w is not None and _float_tensor(args[0]):
                ch = Chain("conv2d", v, [args[0]], v, weight=w, groups=int(call.attrs.groups))
                axis = 1
        elif op == "relax.matmul":
            w = _const(args[1], var2val)
            if w is not None and w.ndim == 2 and _float_tensor(args[0]):
                ch = Chain("dense", v, [args[0]], v, weight=w)
                axis = -1
            elif w is None and all(_float_tensor(a) for a in args):
                ch = Chain("batch_matmul", v, args[:2], v)
        elif op in ("relax.add", "relax.multiply", "relax.divide"):
            ch = _binary(v, call, var2val, {c.output for c in plan.chains}, absorbed)
            if ch is not None and _scalar_product(call, var2val) and (
                    v in deferred if deferred is not None
                    else _feeds_a_table(v, var2val, users)):
                plan.deferred |= {v}  # GELU's / sqrt(2), hardsigmoid's / 6: the table's
                continue
        else:
            ch = Chain(op.split(".")[-1], v, [args[0]], v)
            if op == "relax.nn.max_pool2d":
                plan.union(args[0], v)  # a max changes no value: one scale
        if ch is None:
            continue
        if ch.kind in ("conv2d", "dense"):
            _absorb_affine(ch, axis, var2val, only_user, absorbed)
        if ch.kind in ("conv2d", "dense", "add", "mul"):
            activation(ch)
        plan.chains.append(ch)
    _table_chains(bindings, var2val, plan, absorbed)
    # data movement between a quantized tensor and an anchor input keeps its scale
    points = set(plan.points)
    for b in bindings:
        if _op(b.value) in MOVEMENT and b.var in points:
            src = b.value.args[0]
            if isinstance(src, relax.Var) and src in points:
                plan.union(src, b.var)
    return plan


def _table_chains(bindings: list, var2val: dict, plan: Plan, absorbed: set) -> None:
    """Element-wise chains (sigmoid, SiLU, hardswish, GELU, ...) from one quantized tensor
    to one that an int8 op reads: chains of kind ``table`` (the DSA's activation tables,
    ``relay_passes.table_chains``). Both ends are quantized already (they are anchor
    inputs or outputs); the chain records the ops so the summary does not list them as
    FP32, and its end's QDQ pair is what makes the chain a table."""
    from relay_passes.table_chains import BINARY, PLAIN, UNARY

    points = set(plan.points)
    taken = {c.anchor for c in plan.chains}

    def walk(e, sources: set, members: list, ops: list, end: bool = False) -> bool:
        if isinstance(e, relax.Var) and e in points and not end:
            sources.add(e)
            return True
        if _const(e, var2val) is not None:
            return _const(e, var2val).size == 1
        call = var2val.get(e) if isinstance(e, relax.Var) else None
        op = _op(call) if call is not None else ""
        if op not in UNARY | BINARY or e in absorbed or not _float_tensor(call):
            return False
        members.append(e)
        ops.append(op)
        tensors = call.args if op in BINARY else call.args[:1]
        return all(walk(a, sources, members, ops) for a in tensors)

    for b in bindings:
        v = b.var
        if v not in points or v in taken or v in absorbed or _op(b.value) not in UNARY | BINARY:
            continue
        sources: set = set()
        members: list = []
        ops: list = []
        if not walk(v, sources, members, ops, end=True) or len(sources) != 1 or set(ops) <= PLAIN:
            continue
        src = next(iter(sources))
        if _shape(src) != _shape(v):
            continue
        plan.chains.append(Chain("table", v, [src], v,
                                 members=[m for m in dict.fromkeys(members) if m is not v]))
