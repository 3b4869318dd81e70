"""Graph clean-ups that make imported QDQ graphs matchable, without losing int8 weights.

* ``dedup_dequantize``: ONNX QDQ graphs share one DequantizeLinear between all
  consumers of a tensor (a residual input feeds a conv and an add). Each
  pattern owns the dequantize of its inputs, so every consumer gets its own copy.
* ``int8_data_movement``: Flatten/Reshape/Transpose between QDQ pairs with the same
  parameters run on the int8 tensor instead of dequantize -> op -> quantize.
* ``dedup_moves``: a dequantize feeding only the function's outputs gets its own copy of
  the int8 reshape/permute_dims chain it reads when others read that chain too (an LLM's
  new V rows: the cache concat takes its copy in, ``spec.moved``).
* ``table_chains`` (``table_chains.py``): element-wise chains on one int8 tensor
  (sigmoid, SiLU, GELU, hardswish, ...) become exact 256-entry table lookups.
* ``canonicalize_clip``: TVM's ONNX importer turns Clip (opset >= 11) into
  ``call_tir(maximum/minimum)`` against ``where(isnan(c), -inf, c)`` bounds;
  constant bounds become one ``R.clip`` (``R.nn.relu`` for [0, inf)) that the
  patterns and the LLVM build both understand.

FoldConstant is not used: it would fold ``dequantize(int8 weight)`` into a float
constant and the DSA needs the integers.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.ir import Op
from tvm.ir.expr import GenericConst
from tvm.relax.expr_functor import PyExprMutator, mutator

from dsa_tvm.layers.layouts import layout_permute

from .table_chains import table_chains


def _var2val(func: relax.Function) -> dict[relax.Var, relax.Expr]:
    return dict(relax.analysis.get_var2val(func).items())


def _use_counts(func: relax.Function) -> dict[relax.Var, int]:
    counts: dict[relax.Var, int] = {}

    def visit(e: relax.Expr) -> None:
        if isinstance(e, relax.Var):
            counts[e] = counts.get(e, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def _is_op(e: relax.Expr, name: str) -> bool:
    return isinstance(e, relax.Call) and isinstance(e.op, Op) and e.op.name == name


@mutator
class _DedupDequantize(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, shared: dict[relax.Var, relax.Call]):
        super().__init__(mod)
        self.shared = shared
        self.copies: dict[relax.Var, int] = {}
        self.in_dataflow = False

    # Copies go only into dataflow blocks (where the patterns fuse): a consumer outside
    # one (an If branch) keeps the shared dequantize, which stays a block output.
    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:  # noqa: N802
        outer, self.in_dataflow = self.in_dataflow, True
        try:
            return super().visit_dataflow_block_(block)
        finally:
            self.in_dataflow = outer

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:  # noqa: N802
        outer, self.in_dataflow = self.in_dataflow, False
        try:
            return super().visit_binding_block_(block)
        finally:
            self.in_dataflow = outer

    def _shared(self, a: relax.Expr) -> bool:
        return isinstance(a, relax.Var) and a in self.shared

    def _copy(self, a: relax.Var) -> relax.Var:
        dq = self.shared[a]
        self.copies[a] = self.copies.get(a, 0) + 1
        return self.builder_.emit(relax.op.dequantize(
            self.visit_expr(dq.args[0]), dq.args[1], dq.args[2], int(dq.attrs.axis),
            str(dq.attrs.out_dtype)), name_hint=f"{a.name}_{self.copies[a]}")

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM visitor name)
        new = super().visit_call_(call)
        # a concat's operands are fields of an inline tuple: they get copies too
        if not self.in_dataflow or not any(
                self._shared(a) or (isinstance(a, relax.Tuple)
                                    and any(map(self._shared, a.fields)))
                for a in call.args):
            return new
        args = []
        for a in call.args:
            if self._shared(a):
                args.append(self._copy(a))
            elif isinstance(a, relax.Tuple) and any(map(self._shared, a.fields)):
                args.append(relax.Tuple([self._copy(f) if self._shared(f)
                                         else self.visit_expr(f) for f in a.fields]))
            else:
                args.append(self.visit_expr(a))
        return relax.Call(new.op, args, new.attrs, new.ty_args, new.span)


def dedup_dequantize(mod: tvm.IRModule) -> tvm.IRModule:
    """Give every consumer of a shared ``dequantize`` its own copy."""
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        counts = _use_counts(func)
        shared = {v: val for v, val in _var2val(func).items()
                  if _is_op(val, "relax.dequantize") and counts.get(v, 0) > 1}
        if shared:
            new = _DedupDequantize(mod, shared).visit_expr(func)
            mod[gv] = relax.analysis.remove_all_unused(new)
    return mod


_MOVES = ("relax.reshape", "relax.permute_dims")


@mutator
class _DedupMoves(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, targets: list[relax.Call], var2val: dict):
        super().__init__(mod)
        self.targets, self.var2val = targets, var2val

    def _chain_copy(self, v: relax.Var) -> relax.Expr:
        """A fresh copy of the int8 move chain ending in ``v``."""
        val = self.var2val.get(v)
        if not (isinstance(val, relax.Call) and any(_is_op(val, m) for m in _MOVES)):
            return self.visit_expr(v)
        src = val.args[0]
        arg = self._chain_copy(src) if isinstance(src, relax.Var) else self.visit_expr(src)
        return self.builder_.emit(relax.Call(val.op, [arg, *val.args[1:]], val.attrs,
                                             val.ty_args), name_hint=f"{v.name}_c")

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM visitor name)
        new = super().visit_call_(call)
        if not any(call.same_as(t) for t in self.targets):
            return new
        return relax.Call(new.op, [self._chain_copy(call.args[0]), *new.args[1:]], new.attrs,
                          new.ty_args, new.span)


def _call_read(func: relax.Function) -> set[relax.Var]:
    """Vars some call reads (directly or as a field of an inline tuple argument)."""
    out: set[relax.Var] = set()

    def visit(e: relax.Expr) -> None:
        if isinstance(e, relax.Call):
            for a in e.args:
                if isinstance(a, relax.Var):
                    out.add(a)
                elif isinstance(a, relax.Tuple):
                    out.update(f for f in a.fields if isinstance(f, relax.Var))

    relax.analysis.post_order_visit(func.body, visit)
    return out


def dedup_moves(mod: tvm.IRModule) -> tvm.IRModule:
    """A dequantize that only feeds the function's outputs (an LLM step's new V rows)
    gets its own copy of the int8 (or int16) move chain it reads when other readers share
    that chain (the cache concat takes its copy in)."""
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        var2val, read = _var2val(func), _call_read(func)
        counts = _use_counts(func)
        targets = [val for v, val in var2val.items()
                   if _is_op(val, "relax.dequantize") and v not in read
                   and isinstance(val.args[0], relax.Var)
                   and counts.get(val.args[0], 0) > 1
                   and any(_is_op(var2val.get(val.args[0]), m) for m in _MOVES)
                   and str(val.args[0].ty.dtype) in ("int8", "int16")]
        if targets:
            new = _DedupMoves(mod, targets, var2val).visit_expr(func)
            mod[gv] = relax.analysis.remove_all_unused(new)
    return mod


def _scalar_const(e: relax.Expr, var2val: dict) -> float | None:
    """The value of a scalar float constant, seen through the importer's NaN guard."""
    while isinstance(e, relax.Var) and e in var2val:
        e = var2val[e]
    if isinstance(e, GenericConst) and e.value.numpy().size == 1:
        return float(e.value.numpy().reshape(-1)[0])
    if _is_op(e, "relax.where"):  # where(isnan(c), +-inf, c)
        c = _scalar_const(e.args[2], var2val)
        return c if c is not None and not math.isnan(c) else None
    return None


def _minmax(e: relax.Expr, mod: tvm.IRModule, var2val: dict) -> tuple[str, relax.Expr, float] | None:
    """('max'|'min', x, bound) for ``call_tir(maximum|minimum, (x, scalar const))``."""
    while isinstance(e, relax.Var) and e in var2val:
        e = var2val[e]
    if not _is_op(e, "relax.call_tir"):
        return None
    gv, args = e.args[0], e.args[1]
    name = gv.name_hint if isinstance(gv, tvm.ir.GlobalVar) else ""
    kind = "max" if name.startswith("maximum") else "min" if name.startswith("minimum") else None
    if kind is None or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
        return None
    x, b = args.fields
    bound = _scalar_const(b, var2val)
    if bound is None or tuple(x.ty.shape) != tuple(e.ty.shape) or str(x.ty.dtype) != "float32":
        return None
    return kind, x, bound


@mutator
class _Clip(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, var2val: dict):
        super().__init__(mod)
        self.mod, self.var2val = mod, var2val

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802
        mm = _minmax(call, self.mod, self.var2val)
        if mm is None:
            return super().visit_call_(call)
        kind, x, bound = mm
        lo, hi = (bound, math.inf) if kind == "max" else (-math.inf, bound)
        inner = _minmax(x, self.mod, self.var2val) if kind == "min" else None
        if inner is not None and inner[0] == "max":
            x, lo = inner[1], inner[2]
        x = self.visit_expr(x)
        if lo == 0.0 and hi == math.inf:
            return relax.op.nn.relu(x)
        return relax.op.clip(x, float(np.float32(lo)), float(np.float32(hi)))


def canonicalize_clip(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite the importer's Clip (``call_tir`` max/min) into ``R.clip`` / ``R.nn.relu``."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            new = _Clip(mod, _var2val(func)).visit_expr(func)
            mod[gv] = relax.analysis.remove_all_unused(new)
    return mod


_MOVES = ("relax.reshape", "relax.permute_dims")


def _same_qparams(a: relax.Call, b: relax.Call) -> bool:
    try:
        return all(np.array_equal(_const(x), _const(y)) for x, y in zip(a.args[1:], b.args[1:])) \
            and _const(a.args[1]).size == 1 and str(a.attrs.out_dtype) == str(b.args[0].ty.dtype)
    except TypeError:
        return False


def _const(e: relax.Expr) -> np.ndarray:
    if not isinstance(e, GenericConst):
        raise TypeError("not a constant")
    return e.value.numpy()


def _layout_permute(call: relax.Call) -> bool:
    """An NCHW <-> NHWC permute_dims (ConvNeXt's channels-last blocks)."""
    if call.op.name != "relax.permute_dims" or call.attrs.axes is None:
        return False
    return len(call.args[0].ty.shape) == 4 and \
        layout_permute(tuple(int(a) for a in call.attrs.axes))


def _constant_operand(matmul: relax.Call, var2val: dict) -> bool:
    """A dense layer: the matmul's second operand is a (dequantized) constant."""
    b = var2val.get(matmul.args[1], matmul.args[1])
    if _is_op(b, "relax.dequantize"):
        b = var2val.get(b.args[0], b.args[0])
    return isinstance(b, GenericConst)


class _MatmulReach:
    """Whether a quantize's int8 result reaches a matmul of two activations through
    dequantize and moves: attention's ``K^T`` (a head split then a transpose, which an
    exporter may fuse into one (0, 2, 3, 1) permute) is taken into the matmul pattern as
    int8 moves. Asked only of layout permutes; the use lists are built on the first."""

    #: ops a K^T operand passes through between the quantize and its matmul
    PASS = (*_MOVES, "relax.dequantize", "relax.quantize")

    def __init__(self, var2val: dict):
        self.var2val = var2val
        self.users: dict | None = None
        self.bound: dict = {}

    def _index(self) -> None:
        self.users = {}
        for var, val in self.var2val.items():
            if isinstance(val, relax.Call):
                self.bound[val] = var
                for a in val.args:
                    if isinstance(a, relax.Var):
                        self.users.setdefault(a, []).append(var)

    def __call__(self, quantize: relax.Call, limit: int = 64) -> bool:
        if self.users is None:
            self._index()
        todo = [self.bound.get(quantize)]
        for _ in range(limit):
            if not todo:
                return False
            for u in self.users.get(todo.pop(), ()):
                uv = self.var2val[u]
                if _is_op(uv, "relax.matmul") and not _constant_operand(uv, self.var2val):
                    return True
                if isinstance(uv.op, Op) and uv.op.name in self.PASS:
                    todo.append(u)
        return False


@mutator
class _Moves(PyExprMutator):
    """quantize(move(dequantize(x))) -> move(x) on int8, except an NCHW <-> NHWC permute no
    matmul reads: that one stays in QDQ form for the DSA's layout-permute kind (a block
    copy inside a region, ``kinds.movement``)."""

    def __init__(self, mod: tvm.IRModule, var2val: dict):
        super().__init__(mod)
        self.var2val = var2val
        self.reaches_matmul = _MatmulReach(var2val)

    def _val(self, e: relax.Expr) -> relax.Expr:
        return self.var2val.get(e, e) if isinstance(e, relax.Var) else e

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802
        if _is_op(call, "relax.quantize"):
            mv = self._val(call.args[0])
            keep = (isinstance(mv, relax.Call) and _layout_permute(mv)
                    and not self.reaches_matmul(call))
            if (isinstance(mv, relax.Call) and isinstance(mv.op, Op) and mv.op.name in _MOVES
                    and not keep):
                dq = self._val(mv.args[0])
                if _is_op(dq, "relax.dequantize") and _same_qparams(call, dq):
                    x = self.visit_expr(dq.args[0])
                    return relax.Call(mv.op, [x, *mv.args[1:]], mv.attrs)
        return super().visit_call_(call)


def int8_data_movement(mod: tvm.IRModule) -> tvm.IRModule:
    """``quantize(reshape|permute_dims(dequantize(x)))`` with unchanged parameters -> the op on int8.

    Exact (dequantize then quantize with the same scale and zero point is the
    identity on int8), and the CPU then moves bytes instead of doing float math."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            new = _Moves(mod, _var2val(func)).visit_expr(func)
            mod[gv] = relax.analysis.remove_all_unused(new)
    return mod


def prepare(mod: tvm.IRModule) -> tvm.IRModule:
    """The clean-ups, in order, on a copy of ``mod``."""
    mod = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    # the importer emits no dataflow block around control flow (ONNX If), and the
    # patterns only fuse inside dataflow blocks: regroup the pure bindings into them
    mod = relax.transform.ConvertToDataflow()(mod)
    return dedup_moves(dedup_dequantize(table_chains(int8_data_movement(
        canonicalize_clip(mod)))))
