"""Replace DSA region calls by launches of compiled programs; inline the rest back for LLVM.

``offload_regions(mod, launch)`` takes a partitioned module (``partition.fuse_and_merge``)
and the decisions already made (``launch``: region function -> program bytes; the
compiler decides, see ``dsa_tvm.pipeline.compile_for_dsa``):

* a region in ``launch``: its call becomes ``R.call_dps_packed("dsa.launch",
  [program_u8_const, *int8_args], out_ty)`` (a tuple type for several outputs) and
  the region function is deleted (dead-code elimination keeps ``Codegen`` functions
  and the build then fails);
* every other region: its composite functions are inlined back into the caller as
  plain Relax, which LLVM builds like any other op.

The packed function gets ``(program, *inputs, *outputs)`` in region order.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from dsa_tvm.isa.program import LAUNCH

from .partition import region_functions

__all__ = ["LAUNCH", "offload_regions"]


def _bindings(body: relax.Expr) -> list[relax.Binding]:
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for blk in body.blocks for b in blk.bindings]


@mutator
class _Subst(PyExprMutator):
    """Replace vars by expressions (a region's params by its call arguments, and so on)."""

    def __init__(self, env: dict[relax.Var, relax.Expr]):
        super().__init__()
        self.env = env

    def visit_var_(self, var: relax.Var) -> relax.Expr:  # noqa: N802
        return self.env.get(var, var)

    def visit_dataflow_var_(self, var: relax.Var) -> relax.Expr:  # noqa: N802
        return self.env.get(var, var)


def _bind(expr: relax.Expr, env: dict[relax.Var, relax.Expr]) -> relax.Expr:
    return _Subst(env).visit_expr(expr) if env else expr


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, launch: dict, inline: set):
        super().__init__(mod)
        self.mod_, self.launch, self.inline = mod, launch, inline

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM visitor name)
        op = call.op
        if isinstance(op, tvm.ir.GlobalVar) and op in self.launch:
            args = [self.visit_expr(a) for a in call.args]
            program = relax.const(np.frombuffer(self.launch[op], dtype=np.uint8).copy(), "uint8")
            ty = call.ty
            out_ty = list(ty.fields) if isinstance(ty, relax.TupleType) else ty
            return relax.call_dps_packed(LAUNCH, [program, *args], out_ty=out_ty)
        if isinstance(op, tvm.ir.GlobalVar) and op in self.inline:
            args = [self.visit_expr(a) for a in call.args]
            return self._inline(self.mod_[op], args)
        return super().visit_call_(call)

    def _inline(self, func: relax.Function, args: list[relax.Expr]) -> relax.Expr:
        """Emit ``func``'s bindings with params bound to ``args``; local functions inline too."""
        env: dict[relax.Var, relax.Expr] = dict(zip(func.params, args))
        local: dict[relax.Var, relax.Function] = {}
        for b in _bindings(func.body):
            val = b.value
            if isinstance(val, relax.Function):
                local[b.var] = val
                continue
            if isinstance(val, relax.Call) and val.op in local:
                new_args = [_bind(a, env) for a in val.args]
                env[b.var] = self._inline(local[val.op], new_args)
                continue
            env[b.var] = self.builder_.emit(_bind(val, env), name_hint=b.var.name)
        ret = func.body.body if isinstance(func.body, relax.SeqExpr) else func.body
        return _bind(ret, env)


def offload_regions(mod: tvm.IRModule, launch: Mapping[tvm.ir.GlobalVar, bytes]) -> tvm.IRModule:
    """Launch the regions in ``launch`` with their program bytes, inline every other
    region back; the region functions are dropped."""
    launch = {gv: bytes(program) for gv, program in launch.items()}
    inline = {gv for gv, _ in region_functions(mod) if gv not in launch}
    rewriter = _Rewriter(mod, launch, inline)
    out = tvm.IRModule({}, attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if gv in launch or gv in inline:
            continue
        if isinstance(func, relax.Function):
            func = relax.analysis.remove_all_unused(rewriter.visit_expr(func))
        out[gv] = func
    return out
