"""Relax DPL patterns for int8 QDQ graphs, and what a match means.

Every pattern runs from the ``dequantize`` of each int8 activation it consumes
to the ``quantize`` that produces its int8 result, so a matched composite maps
int8 tensors to an int8 tensor: exactly one DSA layer. Weights and biases are
``dequantize(int8/int32 constant)`` inside the pattern (FoldConstant must not
run first: it would turn them into float constants and lose the integers).

:func:`describe` reads a match back into a :class:`Match` (operands, quant
parameters, attributes). The check functions (``supported.py``), the
partition report and the lowering to layer descriptions (``to_layers.py``) all read
the graph through it, so they cannot disagree about what a pattern means.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir import Op
from tvm.ir.expr import GenericConst
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

# ----------------------------------------------------------------------------- patterns


def _dq(data: DFPattern | None = None) -> DFPattern:
    return is_op("relax.dequantize")(data if data is not None else wildcard(), is_const(), is_const())


def _act(body: DFPattern, act: str | None) -> DFPattern:
    if act == "relu":
        return is_op("relax.nn.relu")(body)
    if act == "clip":
        return is_op("relax.clip")(body, wildcard(), wildcard())
    return body


def _q(body: DFPattern) -> DFPattern:
    return is_op("relax.quantize")(body, is_const(), is_const())


ACTS: tuple[str | None, ...] = ("relu", "clip", None)

#: codegen of layers whose operands the host packs: regions of their own
HOST_PACKED = "dsa_hostpacked"
#: every codegen name a DSA region function carries
CODEGENS = ("dsa", HOST_PACKED)


def _conv(bias: bool, act: str | None) -> DFPattern:
    conv = is_op("relax.nn.conv2d")(_dq(), _dq(is_const()))
    if bias:
        b = _dq(is_const())
        conv = is_op("relax.add")(conv, b | is_op("relax.reshape")(b, wildcard()))
    return _q(_act(conv, act))


def _dense(bias: bool, act: str | None) -> DFPattern:
    w = _dq(is_const())
    mm = is_op("relax.matmul")(_dq(), w | is_op("relax.permute_dims")(w))
    if bias:
        mm = is_op("relax.add")(mm, _dq(is_const()))
    return _q(_act(mm, act))


def _unary(op: str) -> DFPattern:
    return _q(is_op(op)(_dq()))


@dataclass(frozen=True)
class PatternSpec:
    """One entry of the pattern table: composite name, DPL pattern, layer kind."""

    name: str
    pattern: DFPattern
    kind: str
    variant: str


def pattern_specs() -> list[PatternSpec]:
    """The DSA pattern table, larger patterns first (FuseOpsByPattern tries them in order)."""
    out: list[PatternSpec] = []
    for bias in (True, False):
        for act in ACTS:
            v = "+".join(["bias"] * bias + [act] * (act is not None)) or "plain"
            out.append(PatternSpec("dsa.conv2d", _conv(bias, act), "conv2d", v))
    for bias in (True, False):
        for act in ACTS:
            v = "+".join(["bias"] * bias + [act] * (act is not None)) or "plain"
            out.append(PatternSpec("dsa.dense", _dense(bias, act), "dense", v))
    # its own codegen name: MergeCompositeFunctions never merges it with "dsa" layers, so
    # both operands reach it from the host, which packs them (dsa_tvm.layers.host_pack)
    out.append(PatternSpec(f"{HOST_PACKED}.batch_matmul", _q(is_op("relax.matmul")(_dq(), _dq())),
                           "batch_matmul", "plain"))
    out.append(PatternSpec("dsa.max_pool2d", _unary("relax.nn.max_pool2d"), "max_pool2d", "plain"))
    out.append(PatternSpec("dsa.avg_pool2d", _unary("relax.nn.avg_pool2d"), "avg_pool2d", "plain"))
    out.append(PatternSpec("dsa.global_avg_pool", _unary("relax.mean"), "global_avg_pool", "plain"))
    for act in ACTS:
        out.append(PatternSpec("dsa.add", _q(_act(is_op("relax.add")(_dq(), _dq()), act)), "add",
                               act or "plain"))
    out.append(PatternSpec("dsa.relu", _unary("relax.nn.relu"), "relu", "plain"))
    out.append(PatternSpec("dsa.clip", _q(is_op("relax.clip")(_dq(), wildcard(), wildcard())),
                           "clip", "plain"))
    out.append(PatternSpec("dsa.rescale", _q(_dq()), "rescale", "plain"))
    return out


# ----------------------------------------------------------------------------- matches


@dataclass
class QParams:
    """Quantization parameters of one QDQ node, as numpy (scale float32, zero point int64)."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    dtype: str

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zero_point.size == 1


@dataclass
class Operand:
    """An input of a match: the int8 (or int32) expression fed to ``dequantize`` and its qparams."""

    expr: relax.Expr
    qp: QParams
    shape: tuple[int, ...]
    value: np.ndarray | None = None  # the integers, when the data is a constant


@dataclass
class Match:
    """What one matched pattern computes, read back from the graph."""

    kind: str
    op: relax.Call                  # the anchor op (conv2d, matmul, ...), the quantize for rescale
    inputs: list[Operand]           # int8 activations, in argument order
    out: QParams
    out_shape: tuple[int, ...]
    root: relax.Call                # the final quantize
    weight: Operand | None = None
    weight_transposed: bool = False  # dense: weight arrives as permute_dims([N, K]) (else [K, N])
    bias: Operand | None = None
    addend: Operand | None = None   # add: a constant second operand (then ``inputs`` is one)
    act: tuple[str, float, float] | None = None  # (relu|clip, lo, hi) in real units
    calls: list[relax.Call] = field(default_factory=list)  # every call of the match

    @property
    def op_name(self) -> str:
        return str(self.op.op.name)


class NotAMatch(ValueError):
    """The expression does not have the structure the pattern kind promises."""


class UnsupportedShape(NotAMatch):
    """A tensor of the match has a shape the DSA cannot take: symbolic (dynamic batch,
    data-dependent), unknown, or with a zero-size dimension. The match stays on the CPU."""


def shape_of(expr: relax.Expr) -> tuple[int, ...]:
    """Static shape of a tensor expression; UnsupportedShape when it has none.

    DSA programs are compiled for one shape, so a symbolic dimension (``N`` of a
    dynamic batch, a data-dependent size) or a zero-size one cannot be offloaded."""
    ty = expr.ty
    dims = getattr(ty, "shape", None)
    if not isinstance(ty, relax.TensorType) or dims is None:
        raise UnsupportedShape(f"tensor of unknown shape ({ty})")
    shape = []
    for d in dims:
        if not isinstance(d, tvm.tirx.IntImm):
            raise UnsupportedShape(f"symbolic dimension {d} in shape {list(dims)} (dynamic "
                                   "shape): DSA programs need static shapes")
        shape.append(int(d))
    if 0 in shape:
        raise UnsupportedShape(f"zero-size dimension in shape {shape}: nothing to compute")
    return tuple(shape)


def dtype_of(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def const_value(expr: relax.Expr) -> np.ndarray:
    if not isinstance(expr, GenericConst):
        raise NotAMatch(f"expected a constant, got {type(expr).__name__}")
    return expr.value.numpy()


def _prim_float(v) -> float:
    while hasattr(v, "value"):
        v = v.value
    return float(v)


class _Reader:
    """Follows vars to their bound values (``lookup``) and records every call seen."""

    def __init__(self, lookup: Callable[[relax.Var], relax.Expr | None]):
        self.lookup = lookup
        self.calls: list[relax.Call] = []

    def value(self, expr: relax.Expr) -> relax.Expr:
        seen = 0
        while isinstance(expr, relax.Var) and seen < 64:
            v = self.lookup(expr)
            if v is None:
                break
            expr, seen = v, seen + 1
        return expr

    def call(self, expr: relax.Expr, *ops: str) -> relax.Call | None:
        e = self.value(expr)
        if isinstance(e, relax.Call) and isinstance(e.op, Op) and e.op.name in ops:
            self.calls.append(e)
            return e
        return None

    def need(self, expr: relax.Expr, *ops: str) -> relax.Call:
        c = self.call(expr, *ops)
        if c is None:
            raise NotAMatch(f"expected one of {ops}")
        return c

    def qparams(self, call: relax.Call) -> QParams:
        scale = const_value(self.value(call.args[1])).astype(np.float32).reshape(-1)
        zp = const_value(self.value(call.args[2])).astype(np.int64).reshape(-1)
        dt = str(call.attrs.out_dtype) if call.op.name == "relax.quantize" else dtype_of(call.args[0])
        return QParams(scale, zp, int(call.attrs.axis), dt)

    def operand(self, dq_expr: relax.Expr) -> Operand:
        dq = self.need(dq_expr, "relax.dequantize")
        data = self.value(dq.args[0])
        value = data.value.numpy() if isinstance(data, GenericConst) else None
        src = data if value is not None else dq.args[0]
        return Operand(src, self.qparams(dq), shape_of(dq.args[0]), value)


def describe(kind: str, root: relax.Expr,
             lookup: Mapping[relax.Var, relax.Expr] | Callable[[relax.Var], relax.Expr | None]
             ) -> Match:
    """Read the match of pattern ``kind`` rooted at quantize ``root``; NotAMatch if it is not one."""
    get = lookup if callable(lookup) else (lambda v: lookup.get(v))
    r = _Reader(get)
    q = r.need(root, "relax.quantize")
    out, out_shape = r.qparams(q), shape_of(q)
    body = q.args[0]
    act = None
    if kind in ("conv2d", "dense", "add"):
        a = r.call(body, "relax.nn.relu", "relax.clip")
        if a is not None:
            if a.op.name == "relax.nn.relu":
                act = ("relu", 0.0, float("inf"))
            else:
                act = ("clip", _prim_float(a.args[1]), _prim_float(a.args[2]))
            body = a.args[0]
    m: Match
    if kind in ("conv2d", "dense"):
        bias = None
        add = r.call(body, "relax.add")
        if add is not None:
            b = add.args[1]
            rs = r.call(b, "relax.reshape")
            bias = r.operand(rs.args[0] if rs is not None else b)
            body = add.args[0]
        if kind == "conv2d":
            op = r.need(body, "relax.nn.conv2d")
            m = Match(kind, op, [r.operand(op.args[0])], out, out_shape, q,
                      weight=r.operand(op.args[1]), bias=bias)
        else:
            op = r.need(body, "relax.matmul")
            perm = r.call(op.args[1], "relax.permute_dims")
            w = r.operand(perm.args[0] if perm is not None else op.args[1])
            m = Match(kind, op, [r.operand(op.args[0])], out, out_shape, q, weight=w,
                      weight_transposed=perm is not None, bias=bias)
            if perm is not None:
                m.calls.append(perm)
    elif kind == "batch_matmul":
        op = r.need(body, "relax.matmul")
        m = Match(kind, op, [r.operand(op.args[0]), r.operand(op.args[1])], out, out_shape, q)
    elif kind == "add":
        op = r.need(body, "relax.add")
        ops = [r.operand(op.args[0]), r.operand(op.args[1])]
        consts = [o for o in ops if o.value is not None]
        if len(consts) == 1:  # activation + constant (a bias the exporter kept apart)
            m = Match(kind, op, [o for o in ops if o.value is None], out, out_shape, q,
                      addend=consts[0])
        else:
            m = Match(kind, op, ops, out, out_shape, q)
    elif kind in ("max_pool2d", "avg_pool2d", "global_avg_pool", "relu", "clip"):
        opname = {"max_pool2d": "relax.nn.max_pool2d", "avg_pool2d": "relax.nn.avg_pool2d",
                  "global_avg_pool": "relax.mean", "relu": "relax.nn.relu",
                  "clip": "relax.clip"}[kind]
        op = r.need(body, opname)
        m = Match(kind, op, [r.operand(op.args[0])], out, out_shape, q)
        if kind == "relu":
            m.act = ("relu", 0.0, float("inf"))
        elif kind == "clip":
            m.act = ("clip", _prim_float(op.args[1]), _prim_float(op.args[2]))
    elif kind == "rescale":
        m = Match(kind, q, [r.operand(body)], out, out_shape, q)
    else:
        raise ValueError(f"unknown pattern kind '{kind}'")
    if act is not None:
        m.act = act
    m.calls = list(dict.fromkeys(r.calls + m.calls))
    return m
