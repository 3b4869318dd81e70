"""What a matched pattern computes, and the reader that walks the graph to find out.

Every pattern runs from the ``dequantize`` of each int8 activation it consumes
to the ``quantize`` that produces its int8 result, so a matched composite maps
int8 tensors to an int8 tensor: exactly one DSA layer. Each kind reads its match
back into a :class:`Match` with a :class:`Reader`; its constraints, the partition
report and its conversion to a layer all read that Match, so they cannot
disagree about what the pattern means.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir import Op
from tvm.ir.expr import GenericConst

from dsa_tvm.layers.ir import QTensor


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
    #: int8 reshape/permute_dims between the region tensor and the dequantize, as
    #: (view, perm) steps (``layers.ir.Permute``); ``source_shape`` is the tensor's own
    moves: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    source_shape: tuple[int, ...] | None = None


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


class LoweringError(ValueError):
    """A region function (or a match in it) that does not have the shape partition_for_dsa produces."""


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


def prim_float(v) -> float:
    """A float attribute or argument (``PrimValue``, ``FloatImm``, ...) as a Python float."""
    while hasattr(v, "value"):
        v = v.value
    return float(v)


def qtensor(name: str, shape, qp: QParams) -> QTensor:
    """The layer IR's view of a per-tensor quantized tensor."""
    return QTensor(name, tuple(int(d) for d in shape), float(qp.scale[0]), int(qp.zero_point[0]),
                   qp.dtype if qp.dtype == "int16" else "int8")


class Reader:
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

    def ints(self, expr: relax.Expr) -> list[int]:
        """A tuple or shape argument (``strided_slice``'s axes, begin, end) as ints."""
        e = self.value(expr)
        return [int(prim_float(v)) for v in (e.fields if hasattr(e, "fields") else e.values)]

    def same_tensor(self, a: relax.Expr, b: relax.Expr,
                    what: str = "two operands are different tensors") -> None:
        """``a`` and ``b`` are one tensor, or dequantizes of one int8 tensor with one scale
        (the partitioner gives every reader its own dequantize); NotAMatch(``what``) if not."""
        if self.value(a).same_as(self.value(b)):
            return
        da, db = self.call(a, "relax.dequantize"), self.call(b, "relax.dequantize")
        if da is None or db is None or not self.value(da.args[0]).same_as(self.value(db.args[0])):
            raise NotAMatch(what)
        qa, qb = self.qparams(da), self.qparams(db)
        if not (np.array_equal(qa.scale, qb.scale)
                and np.array_equal(qa.zero_point, qb.zero_point)):
            raise NotAMatch("two dequantizes of one tensor with different parameters")

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

    def operand(self, dq_expr: relax.Expr, moves: bool = False) -> Operand:
        """The tensor a ``dequantize`` reads; ``moves``: through the int8 reshape and
        permute_dims chain the pattern took in (then ``Operand.moves`` says how)."""
        dq = self.need(dq_expr, "relax.dequantize")
        data = self.value(dq.args[0])
        value = data.value.numpy() if isinstance(data, GenericConst) else None
        src = data if value is not None else dq.args[0]
        op = Operand(src, self.qparams(dq), shape_of(dq.args[0]), value)
        if moves and value is None:
            op.expr, op.moves, op.source_shape = self._moves(dq.args[0])
        return op

    def _moves(self, expr: relax.Expr):
        """(source, (view, perm) steps, source shape) of an int8 move chain ending in expr."""
        chain = []
        while (c := self.call(expr, "relax.reshape", "relax.permute_dims")) is not None:
            chain.append(c)
            expr = c.args[0]
        steps: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        shape = shape_of(expr)
        for c in reversed(chain):
            out = shape_of(c)
            if c.op.name == "relax.reshape":
                steps.append((out, tuple(range(len(out)))))
            else:
                axes = c.attrs.axes
                perm = (tuple(int(a) for a in axes) if axes is not None
                        else tuple(reversed(range(len(shape)))))
                if steps and steps[-1][1] == tuple(range(len(steps[-1][0]))):
                    steps[-1] = (steps[-1][0], perm)   # a reshape then a transpose: one step
                else:
                    steps.append((shape, perm))
            shape = out
        return expr, tuple(steps), shape_of(expr)

    def activation(self, body: relax.Expr) -> tuple[tuple[str, float, float] | None, relax.Expr]:
        """A fused ReLU/Clip on top of ``body``: ((relu|clip, lo, hi) or None, what it wraps)."""
        a = self.call(body, "relax.nn.relu", "relax.clip")
        if a is None:
            return None, body
        if a.op.name == "relax.nn.relu":
            return ("relu", 0.0, float("inf")), a.args[0]
        return ("clip", prim_float(a.args[1]), prim_float(a.args[2])), a.args[0]

    def bias_add(self, body: relax.Expr) -> tuple[Operand | None, relax.Expr]:
        """A constant bias added to ``body`` (possibly reshaped, as ONNX Conv bias arrives):
        (the bias operand or None, what it is added to)."""
        add = self.call(body, "relax.add")
        if add is None:
            return None, body
        b = add.args[1]
        rs = self.call(b, "relax.reshape")
        return self.operand(rs.args[0] if rs is not None else b), add.args[0]


@dataclass(frozen=True)
class Root:
    """The end every match shares: the final quantize, its qparams and shape, what it quantizes."""

    q: relax.Call
    out: QParams
    out_shape: tuple[int, ...]
    body: relax.Expr

    def match(self, kind: str, op: relax.Call, inputs: list[Operand], **kw) -> Match:
        return Match(kind, op, inputs, self.out, self.out_shape, self.q, **kw)
