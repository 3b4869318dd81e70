"""What TVM's ``MergeCompositeFunctions`` cannot walk, found before it is run.

TVM 0.27's ``MergeCompositeFunctions`` builds its groups from plain variable
bindings of dataflow values and raises on anything else, even where no DSA
layer is near: ``relax.MatchCast`` (every shape the importer computes at run
time: Squeeze/Unsqueeze with axes as inputs, Expand, Tile, Range, NonZero,
Unique), ``relax.If`` (ONNX If), and a symbolic dimension passed as a value
(``R.arange(0, n)`` for a zero-size or dynamic dimension), a call into another
function outside a dataflow block (a private function's caller). The partitioner
asks :func:`merge_blockers` first and, for a program that has one, keeps every
DSA layer a region of its own instead of merging them (``partition.fuse_and_merge``),
with the blocker named in the partition report.
"""

from __future__ import annotations

import tvm
from tvm import relax


def _defined(func: relax.Function) -> set[relax.Var]:
    """The Relax variables ``func`` defines: its parameters and every bound variable."""
    out: set[relax.Var] = set(func.params)

    def visit(body: relax.Expr) -> None:
        if not isinstance(body, relax.SeqExpr):
            return
        for blk in body.blocks:
            for b in blk.bindings:
                out.add(b.var)
                if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.If):
                    visit(b.value.true_branch)
                    visit(b.value.false_branch)

    visit(func.body)
    return out


def _args(e: relax.Expr) -> list[relax.Expr]:
    if isinstance(e, relax.Call):
        return [x for a in e.args for x in ([a] if not isinstance(a, relax.Tuple) else a.fields)]
    if isinstance(e, relax.Tuple):
        return list(e.fields)
    return []


def function_blockers(name: str, func: relax.Function) -> list[str]:
    """Every binding of ``func`` that MergeCompositeFunctions would raise on, as a sentence."""
    defined = _defined(func)
    found: list[str] = []

    def visit(body: relax.Expr) -> None:
        if not isinstance(body, relax.SeqExpr):
            return
        for blk in body.blocks:
            for b in blk.bindings:
                v = b.var.name
                if not isinstance(blk, relax.DataflowBlock) and isinstance(b.value, relax.Call) \
                        and isinstance(b.value.op, tvm.ir.GlobalVar):
                    found.append(f"{name}: {v} = {b.value.op.name_hint}(...) outside a dataflow "
                                 "block (a call into another function)")
                    continue
                if isinstance(b, relax.MatchCast):
                    found.append(f"{name}: {v} = relax.MatchCast (a shape known only at run time)")
                    continue
                if isinstance(b.value, relax.If):
                    found.append(f"{name}: {v} = relax.If (control flow)")
                    visit(b.value.true_branch)
                    visit(b.value.false_branch)
                    continue
                for a in _args(b.value):
                    if isinstance(a, relax.Var) and a not in defined:
                        found.append(f"{name}: {v} uses symbolic dimension {a.name} as a value")
                        break

    visit(func.body)
    return found


def merge_blockers(mod: tvm.IRModule) -> list[str]:
    """The constructs in ``mod``'s Relax functions (not the composites) MergeCompositeFunctions
    cannot walk; empty when it can merge the module."""
    out: list[str] = []
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        attrs = func.attrs
        if attrs is not None and ("Composite" in attrs or "Codegen" in attrs):
            continue
        out += function_blockers(gv.name_hint, func)
    return out
