"""Element-wise chains on one int8 (or int16) tensor, turned into exact table lookups.

In a QDQ graph, ``quantize(f(dequantize(x)))`` with ``f`` any chain of element-wise ops
(sigmoid, x * sigmoid(x), hardswish as add/clip/div/mul, GELU, tanh, exp, ...) on one
int8 tensor ``x`` and scalar constants, inner quantize/dequantize pairs included, is a
function of the 256 codes of ``x`` (of the 65,536 codes of an int16 ``x`` quantized to
int16: the same form with a 65,536-entry table, which the DSA interpolates from two
256-entry ones, ``layers.wide_table``). :func:`table_chains` finds every maximal such chain,
evaluates all of them on every input code with TVM's own llvm build of the chain (one build
for the whole module, so the table is the CPU path's result by construction, NaN and
infinity included), and rewrites each into its canonical form::

    quantize(take(T, astype(round(dequantize(x) / s), "int32") + (z + 128)), s_out, z_out)

``T[i] = (t_i - z_out) * s_out`` holds the real value of output code ``t_i``; every step
is exact (``(q - z) * s / s`` rounds back to ``q - z``, and so does quantizing ``T[i]``),
so the rewritten graph computes the same codes on the CPU (int16: ``z + 32768``). The
``table`` front-end kind matches the canonical form and the DSA applies it with ALU LUT. Chains the rewrite
cannot keep exact (scales outside the normal float32 range) are left alone, each with
the reason, in the module attribute ``SKIPPED_ATTR`` (the partition report's notes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.ir import Op
from tvm.ir.expr import GenericConst
from tvm.relax.expr_functor import PyExprMutator, mutator

from dsa_tvm.frontend.onnx_names import named, node_name

#: element-wise ops of one tensor (extra arguments are attributes or PrimValues)
UNARY = frozenset({
    "relax.sigmoid", "relax.tanh", "relax.exp", "relax.erf", "relax.nn.gelu",
    "relax.nn.gelu_tanh", "relax.nn.silu", "relax.nn.leakyrelu", "relax.nn.relu",
    "relax.clip", "relax.negative", "relax.abs", "relax.sqrt", "relax.rsqrt", "relax.log",
    "relax.square", "relax.sin", "relax.cos", "relax.floor", "relax.ceil", "relax.round",
    "relax.nn.softplus", "relax.nn.elu", "relax.nn.selu", "relax.sign", "relax.astype",
})
#: element-wise ops of two tensors (each the chain or a scalar constant)
BINARY = frozenset({
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power",
    "relax.maximum", "relax.minimum",
})
#: a chain of only these is left to the existing relu / clip / rescale kinds
PLAIN = frozenset({"relax.nn.relu", "relax.clip", "relax.astype"})
#: smallest scale the canonical form keeps exact (normal float32, with 8 bits of margin)
MIN_SCALE = 2.0 ** -118
MAX_SCALE = 2.0 ** 118

#: the codes of each source type a chain may read and write (source and result alike)
CODE_TYPES = {"int8": 256, "int16": 65536}

#: module attribute listing the chains left alone ("<var>: <why>")
SKIPPED_ATTR = "dsa_table_chains_skipped"


class _NotChain(Exception):
    pass


@dataclass
class Chain:
    """One maximal chain: its root quantize, the int8 or int16 source, the leaf
    dequantize."""

    var: relax.Var
    root: relax.Call
    source: relax.Var
    leaf: relax.Call           # a dequantize of ``source`` (its qparams index the table)
    ops: list[str]
    onnx_node: str = ""        # the ONNX node of the chain's last op, for the report

    @property
    def dtype(self) -> str:
        return _dtype(self.source)

    @property
    def codes(self) -> int:
        return CODE_TYPES[self.dtype]


def _is(e: relax.Expr, *names: str) -> bool:
    return isinstance(e, relax.Call) and isinstance(e.op, Op) and e.op.name in names


def _scalar(e: relax.Expr) -> float | None:
    if isinstance(e, GenericConst):
        v = e.value.numpy()
        if v.size == 1:
            return float(v.reshape(-1)[0])
    return None


def _dtype(e: relax.Expr) -> str:
    return str(getattr(e.ty, "dtype", ""))


class _Finder:
    """Walks back from a quantize through element-wise ops to the int8 (or int16)
    tensor(s) read."""

    def __init__(self, var2val: dict):
        self.var2val = var2val

    def value(self, e: relax.Expr) -> relax.Expr:
        while isinstance(e, relax.Var) and e in self.var2val:
            e = self.var2val[e]
        return e

    def _qparams_ok(self, call: relax.Call) -> bool:
        return all(_scalar(self.value(a)) is not None for a in call.args[1:3])

    def walk(self, e: relax.Expr, extend: bool, sources: dict, leaves: list, ops: list) -> None:
        """Add the int8 sources under ``e`` to ``sources`` (var -> None); _NotChain if an
        op is not element-wise."""
        v = self.value(e)
        if isinstance(v, GenericConst):
            if v.value.numpy().size != 1:
                raise _NotChain("a constant that is not a scalar")
            return
        if not isinstance(v, relax.Call) or not isinstance(v.op, Op):
            raise _NotChain("not an op")
        name = v.op.name
        if name == "relax.dequantize":
            data = v.args[0]
            if not isinstance(data, relax.Var) or _dtype(data) not in CODE_TYPES or \
                    not self._qparams_ok(v):
                raise _NotChain("dequantize of a per-channel tensor or of neither int8 nor "
                                "int16")
            inner = self.value(data)
            if extend and _is(inner, "relax.quantize") and self._qparams_ok(inner) \
                    and str(inner.attrs.out_dtype) in CODE_TYPES:
                sub: dict = {}
                sub_leaves: list = []
                sub_ops: list = []
                try:
                    self.walk(inner.args[0], extend, sub, sub_leaves, sub_ops)
                    if len(sub) == 1 and sub_ops:  # an inner Q/DQ pair of the same chain
                        sources.update(sub)
                        leaves += sub_leaves
                        ops += sub_ops + ["quantize/dequantize"]
                        return
                except _NotChain:
                    pass
            sources[data] = None
            leaves.append(v)
            return
        if name in UNARY:
            for a in v.args[1:]:
                if isinstance(self.value(a), (relax.Call,)) or (
                        isinstance(a, relax.Var) and not isinstance(self.value(a), GenericConst)):
                    raise _NotChain(f"{name} with a tensor attribute")
            ops.append(name)
            self.walk(v.args[0], extend, sources, leaves, ops)
            return
        if name in BINARY:
            ops.append(name)
            for a in v.args:
                self.walk(a, extend, sources, leaves, ops)
            return
        raise _NotChain(f"{name} is not element-wise")

    def chain(self, var: relax.Var, root: relax.Call) -> Chain | None:
        body = self.value(root.args[0])
        if not _is(root, "relax.quantize") or str(root.attrs.out_dtype) not in CODE_TYPES \
                or not self._qparams_ok(root) or not isinstance(body, relax.Call) \
                or _is(body, "relax.dequantize"):
            return None
        for extend in (True, False):
            sources: dict = {}
            leaves: list = []
            ops: list = []
            try:
                self.walk(root.args[0], extend, sources, leaves, ops)
            except _NotChain:
                return None
            if len(sources) == 1:
                break
        else:
            return None
        if not set(ops) - PLAIN - {"quantize/dequantize"}:
            return None  # ReLU / Clip: the relu, clip and rescale kinds' business
        src = next(iter(sources))
        if _dtype(src) != str(root.attrs.out_dtype):
            return None  # int8 -> int16 (or back): neither table form
        try:
            if tuple(src.ty.shape) != tuple(root.ty.shape) or not leaves:
                return None
        except (AttributeError, TypeError):
            return None
        return Chain(var, root, src, leaves[0], ops, node_name(body))


def find_chains(func: relax.Function) -> list[Chain]:
    """Every quantize of ``func`` that ends an element-wise chain on one int8 tensor (or
    int16 tensor, into int16)."""
    var2val = dict(relax.analysis.get_var2val(func).items())
    f = _Finder(var2val)
    out = []
    for var, val in var2val.items():
        if _is(val, "relax.quantize"):
            c = f.chain(var, val)
            if c is not None:
                out.append(c)
    return out


# ----------------------------------------------------------------------------- evaluation
def _rebuild(bb: relax.BlockBuilder, f: _Finder, e: relax.Expr, source: relax.Var,
             codes: relax.Expr, memo: dict) -> relax.Expr:
    """The chain under ``e`` again, on ``codes`` instead of ``source``."""
    v = f.value(e)
    if isinstance(v, GenericConst) or not isinstance(v, relax.Call):
        return v
    key = hash(v)
    if key in memo:
        return memo[key]
    if _is(v, "relax.dequantize") and f.value(v.args[0]) is not None and \
            v.args[0].same_as(source):
        new = bb.emit(relax.Call(v.op, [codes, *v.args[1:]], v.attrs, v.ty_args))
    else:
        args = [_rebuild(bb, f, a, source, codes, memo)
                if isinstance(a, (relax.Var, relax.Call)) else a for a in v.args]
        new = bb.emit(relax.Call(v.op, args, v.attrs, v.ty_args))
    memo[key] = new
    return new


def evaluate(func: relax.Function, chains: list[Chain]) -> list[np.ndarray]:
    """Each chain's output codes on every input code (entry i: input code i - 128, or
    i - 32768 for int16), from one llvm build of all of them (the CPU path's own
    arithmetic)."""
    f = _Finder(dict(relax.analysis.get_var2val(func).items()))
    bb = relax.BlockBuilder()
    params = {t: relax.Var(f"codes_{t}", relax.TensorType((n,), t)) for t, n in CODE_TYPES.items()}
    with bb.function("main", list(params.values())):
        with bb.dataflow():
            outs = []
            for c in chains:
                rank = len(c.source.ty.shape)
                codes = bb.emit(relax.op.reshape(params[c.dtype],
                                                 (1,) * (rank - 1) + (c.codes,)))
                res = _rebuild(bb, f, c.root, c.source, codes, {})
                outs.append(bb.emit(relax.op.reshape(res, (c.codes,))))
            gv = bb.emit_output(relax.Tuple(outs) if len(outs) != 1 else outs[0])
        bb.emit_func_output(gv)
    mod = bb.get()
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"](*(tvm.runtime.tensor(np.arange(-(n // 2), n // 2, dtype=t))
                       for t, n in CODE_TYPES.items()))
    if len(chains) == 1:
        res = [res]
    return [np.asarray(r.numpy(), dtype=c.dtype).reshape(c.codes) for r, c in zip(res, chains)]


# ----------------------------------------------------------------------------- rewrite
def _const(v, dtype: str) -> relax.Constant:
    return relax.const(np.asarray(v, dtype=dtype))


@mutator
class _Rewrite(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, plans: dict):
        super().__init__(mod)
        self.plans = plans  # hash(root call) -> (chain, real table)

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802
        plan = self.plans.get(hash(call))
        if plan is None or not plan[0].root.same_as(call):
            return super().visit_call_(call)
        c, real = plan
        leaf = c.leaf
        scale = _scalar(leaf.args[1]) if isinstance(leaf.args[1], GenericConst) else None
        zp = _scalar(leaf.args[2]) if isinstance(leaf.args[2], GenericConst) else None
        if scale is None or zp is None:
            return super().visit_call_(call)
        bb = self.builder_

        def emit(e: relax.Call) -> relax.Var:
            return bb.emit(named(bb, e, c.onnx_node))

        dq = emit(relax.Call(leaf.op, [self.visit_expr(c.source), leaf.args[1], leaf.args[2]],
                             leaf.attrs))
        idx = emit(relax.op.divide(dq, _const(np.float32(scale), "float32")))
        idx = emit(relax.op.astype(emit(relax.op.round(idx)), "int32"))
        idx = emit(relax.op.add(idx, _const(int(zp) + c.codes // 2, "int32")))
        look = emit(relax.op.take(_const(real, "float32"), idx, axis=0))
        return named(bb, relax.Call(call.op, [look, call.args[1], call.args[2]], call.attrs),
                     node_name(call) or c.onnx_node)


def _scale_problem(scale: float) -> str | None:
    if not (MIN_SCALE <= abs(scale) <= MAX_SCALE) or not np.isfinite(scale):
        return (f"scale {scale:g} is outside [{MIN_SCALE:g}, {MAX_SCALE:g}], where the "
                f"table's index and values stay exact in float32")
    return None


def table_chains(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite every maximal element-wise chain of ``main`` into its exact table form."""
    skipped: list[tuple[str, str]] = []
    func = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
    if not isinstance(func, relax.Function):
        return mod
    chains = []
    for c in find_chains(func):
        s_in, s_out = _scalar(c.leaf.args[1]), _scalar(c.root.args[1])
        why = _scale_problem(s_in) or _scale_problem(s_out)
        if why:
            skipped.append((c.var.name, why))
        else:
            chains.append(c)
    if not chains:
        return _noted(mod, skipped)
    try:
        tables = evaluate(func, chains)
    except Exception as e:  # noqa: BLE001 - the chains then run as they are, on the CPU
        skipped += [(c.var.name, f"evaluating the chain failed: {type(e).__name__}: {e}")
                    for c in chains]
        return _noted(mod, skipped)
    plans = {}
    for c, t in zip(chains, tables):
        s_out = np.float32(_scalar(c.root.args[1]))
        z_out = int(_scalar(c.root.args[2]))
        real = (t.astype(np.float32) - np.float32(z_out)) * s_out
        plans[hash(c.root)] = (c, real.astype(np.float32))
    mod = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    gv = mod.get_global_var("main")
    new = _Rewrite(mod, plans).visit_expr(func)
    mod[gv] = relax.analysis.remove_all_unused(new)
    return _noted(mod, skipped)


def _noted(mod: tvm.IRModule, skipped: list[tuple[str, str]]) -> tvm.IRModule:
    if not skipped:
        return mod
    return mod.with_attr(SKIPPED_ATTR, [f"{v}: {why}" for v, why in skipped])


def skipped_notes(mod: tvm.IRModule) -> list[str]:
    """The partition report's notes on chains :func:`table_chains` left alone."""
    attrs = mod.attrs
    got = attrs[SKIPPED_ATTR] if attrs is not None and SKIPPED_ATTR in attrs else None
    return [f"element-wise chain ending at {s} (not a DSA table; it runs on the CPU as "
            f"written)" for s in (got or [])]
