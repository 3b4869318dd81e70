"""Partition a QDQ Relax module into DSA regions and say why everything else stays on the CPU.

The stages, each a function here (``dsa_tvm.pipeline.compile_for_dsa`` runs them in
this order, ``partition_for_dsa`` runs them for the partition alone):

1. ``canonicalize.prepare``: the graph clean-ups that make QDQ graphs matchable;
2. :func:`pattern_decisions`: every quantize against the pattern table, in the order
   FuseOpsByPattern tries it, so each op left on the CPU carries the constraint that
   kept it there; the verdicts go into a :class:`~.match_memo.MatchMemo`;
3. :func:`fuse_and_merge`: ``FuseOpsByPattern`` with the same table (its check
   functions read the memo: a match is described and checked once per compile) ->
   ``MergeCompositeFunctions`` (consecutive DSA layers become one region, codegen
   ``"dsa"``);
4. :func:`read_regions`: each region function read into layers, once;
5. :func:`partition_report`: regions, CPU ops and whole-program notes.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.ir import Op
from tvm.relax.dpl import CallPattern, ExprPattern, OrPattern, WildcardPattern
from tvm.relax.transform import FusionPattern, PatternCheckContext

from dsa_tvm.frontend.onnx_names import node_name
from dsa_tvm.hw.config import HardwareConfig, load_config
from dsa_tvm.layers.ir import Region

from .canonicalize import prepare
from .kinds import ANCHOR_OPS
from .kinds.match import Match
from .kinds.spec import CODEGENS
from .match_memo import MatchMemo
from .table_chains import skipped_notes
from .to_layers import region_from_function
from .walkable import merge_blockers

CODEGEN = "dsa"


def _leaks(ctx: PatternCheckContext) -> bool:
    """A value made inside the match (an int8 move the pattern took in) that is also read
    outside it: the composite would return a tuple instead of one int8 tensor."""
    inside = list(ctx.matched_bindings.keys())
    root = ctx.value_to_bound_var.get(ctx.annotated_expr["root"])
    usages = ctx.var_usages
    for v in inside:
        if root is not None and v.same_as(root):
            continue
        if any(not any(u.same_as(w) for w in inside) for u in usages.get(v, [])):
            return True
    return False


def _make_check(index: int, memo: MatchMemo):
    def _check(ctx: PatternCheckContext) -> bool:
        if _leaks(ctx):
            return False
        bindings = dict(ctx.matched_bindings.items())
        verdict = memo.verdict(index, ctx.annotated_expr["root"], bindings)
        return verdict is not None and verdict.ok

    return _check


def fusion_patterns(memo: MatchMemo) -> list[FusionPattern]:
    """The pattern table as FuseOpsByPattern entries, their checks answered by ``memo``."""
    return [FusionPattern(s.name, s.pattern, {"root": s.pattern}, _make_check(i, memo))
            for i, s in enumerate(memo.specs)]


# ----------------------------------------------------------------------------- report


@dataclass
class CpuOp:
    var: str
    op: str
    reason: str
    macs: int = 0     # multiply-accumulates of a MAC_OPS op left on the CPU
    onnx_node: str = ""  # the ONNX node the op came from, when the importer kept its name


@dataclass
class RegionInfo:
    name: str
    layers: list[str]
    macs: int
    error: str = ""  # lowering to layer descriptions failed (the region then stays on the CPU)


@dataclass
class PartitionReport:
    config: str
    regions: list[RegionInfo] = field(default_factory=list)
    cpu_ops: list[CpuOp] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # whole-program findings (not quantized, no merging)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        lines = [f"DSA partition for '{self.config}': {len(self.regions)} region(s), "
                 f"{len(self.cpu_ops)} op(s) on the CPU"]
        lines += [f"  NOTE: {n}" for n in self.notes]
        for r in self.regions:
            lines.append(f"  region {r.name}: {len(r.layers)} layer(s), {r.macs} MACs"
                         + (f"  [lowering failed: {r.error}]" if r.error else ""))
            lines += [f"    {ly}" for ly in r.layers]
        for c in self.cpu_ops:
            node = f" (ONNX {c.onnx_node})" if c.onnx_node else ""
            lines.append(f"  CPU {c.var} = {c.op}{node}: {c.reason}")
        return "\n".join(lines)


def _op_name(call: relax.Call) -> str:
    if isinstance(call.op, Op):
        if call.op.name == "relax.call_tir":
            return f"call_tir({call.args[0].name_hint})"
        return call.op.name
    return getattr(call.op, "name_hint", str(call.op))


def _anchor_rank(call: relax.Call) -> int:
    """The op a pattern is named after ranks first (a rescale is its quantize)."""
    name = call.op.name
    return ANCHOR_OPS.index(name) if name in ANCHOR_OPS else len(ANCHOR_OPS)


def _top_ops(p) -> frozenset[str] | None:
    """The ops a pattern's top call can have; None when it may match something else."""
    if isinstance(p, OrPattern):
        a, b = _top_ops(p.left), _top_ops(p.right)
        return None if a is None or b is None else a | b
    if isinstance(p, CallPattern) and isinstance(p.op, ExprPattern) \
            and isinstance(p.op.expr, Op):
        return frozenset([p.op.expr.name])
    return None


def body_ops(pattern) -> frozenset[str] | None:
    """The ops the quantized body of a ``quantize(body, ...)`` pattern can be (None: any)."""
    if isinstance(pattern, CallPattern) and _top_ops(pattern) == {"relax.quantize"} \
            and len(pattern.args) >= 1:
        return _top_ops(pattern.args[0])
    return None


def _body_op(val: relax.Call, var2val: dict) -> str | None:
    """The op of a quantize's input (through its binding), or None when not an op call."""
    body = val.args[0]
    body = var2val.get(body, body) if isinstance(body, relax.Var) else body
    return body.op.name if isinstance(body, relax.Call) and isinstance(body.op, Op) else None


def pattern_decisions(mod: tvm.IRModule, memo: MatchMemo) -> dict[str, str]:
    """var name -> why the DSA does not take it, for every binding of a failed pattern match.

    Every verdict lands in ``memo``, where the FuseOpsByPattern checks find it. A pattern
    whose quantized body is another op is not tried (matching is most of the time a large
    model spends here: 35 of 130 s of a SmolLM2 step's compile)."""
    func = mod["main"]
    var2val = dict(relax.analysis.get_var2val(func).items())
    bound = {hash(v): k for k, v in var2val.items()}  # hash: the node, not the wrapper
    users = _users(var2val)
    reasons: dict[str, str] = {}
    bodies = [body_ops(s.pattern) for s in memo.specs]
    for var, val in var2val.items():
        if not (isinstance(val, relax.Call) and isinstance(val.op, Op)
                and val.op.name == "relax.quantize"):
            continue
        first_fail = None
        op = _body_op(val, var2val)
        for i, s in enumerate(memo.specs):
            if bodies[i] is not None and op not in bodies[i]:
                continue
            if not s.pattern.match(val, var2val):
                continue
            verdict = memo.verdict(i, val, var2val)
            if verdict is None:
                continue
            if verdict.bad_shape:
                if first_fail is None:
                    matched = s.pattern.extract_matched_expr(val, var2val) or {}
                    calls = [c for pat, c in matched.items() if isinstance(c, relax.Call)
                             and not isinstance(pat, WildcardPattern) and isinstance(c.op, Op)
                             and c.op.name != "relax.dequantize"]
                    anchor = min(calls, key=_anchor_rank, default=val)
                    first_fail = (s, Match(s.kind, anchor, [], None, (), val, calls=calls),
                                  verdict.why)
                continue
            if verdict.ok:
                matched = s.pattern.extract_matched_expr(val, var2val) or {}
                calls = [c for pat, c in matched.items() if isinstance(c, relax.Call)
                         and not isinstance(pat, WildcardPattern)]
                leak = _leaked(calls, val, bound, users)
                if leak is None:
                    first_fail = None
                    break
                if first_fail is None:  # FuseOpsByPattern refuses it too (``_leaks``)
                    first_fail = (s, Match(s.kind, val, [], None, (), val, calls=calls), leak)
                continue
            if first_fail is None:
                first_fail = (s, verdict.match, verdict.why)
        if first_fail is None:
            continue
        s, m, why = first_fail
        anchor = bound.get(hash(m.op))
        aname = anchor.name if anchor is not None else var.name
        for c in m.calls:
            v = bound.get(hash(c))
            if v is None:
                continue
            if v is anchor:
                reasons[v.name] = f"{s.name} ({s.variant}) not supported: {why}"
            else:
                reasons[v.name] = f"part of {s.name} {aname}, not supported: {why}"
    return reasons


def _users(var2val: dict) -> dict[relax.Var, list[relax.Var]]:
    """var -> the bindings that read it."""
    out: dict[relax.Var, list[relax.Var]] = {}
    for var, val in var2val.items():
        def visit(e: relax.Expr, var=var) -> None:
            if isinstance(e, relax.Var):
                out.setdefault(e, []).append(var)
        relax.analysis.post_order_visit(val, visit)
    return out


def _leaked(calls: list[relax.Call], root: relax.Call, bound: dict, users: dict) -> str | None:
    """Why a match cannot be fused: a value it computes inside (an int8 move it took in)
    is also read outside it; None when nothing leaks."""
    inside = {bound.get(hash(c)) for c in calls} - {None}
    root_var = bound.get(hash(root))
    for v in inside:
        if v is root_var:
            continue
        outside = [u.name for u in users.get(v, []) if u not in inside]
        if outside:
            return (f"'{v.name}', computed inside the match, is also read outside it (by "
                    f"{', '.join(outside[:3])}): a composite returns one int8 tensor")
    return None


#: why a float MAC layer stays on the CPU, and what to do about it
FLOAT_LAYER = ("not quantized: the DSA runs int8 QDQ layers; quantize the model with "
               "dsa_tvm.quantize(model, calibration_data) or `dsa-tvm quantize model.onnx "
               "--calib DATA -o model_int8.onnx`")
NOT_QUANTIZED = ("the model is not quantized (no quantize/dequantize ops): everything runs on "
                 "the CPU. The DSA runs int8 QDQ models; quantize it first with "
                 "dsa_tvm.quantize(model, calibration_data) or `dsa-tvm quantize model.onnx "
                 "--calib DATA -o model_int8.onnx`")


def _reads_dequantize(call: relax.Call, var2val) -> bool:
    """Whether the op's data operand comes straight from a dequantize (a QDQ layer)."""
    arg = call.args[0]
    if isinstance(arg, relax.Tuple):
        arg = arg.fields[0] if len(arg.fields) else arg
    src = var2val.get(arg) if isinstance(arg, relax.Var) else arg
    return isinstance(src, relax.Call) and isinstance(src.op, Op) and \
        src.op.name == "relax.dequantize"


def is_quantized(mod: tvm.IRModule) -> bool:
    """Whether ``main`` has any quantize or dequantize op (a QDQ model, even in part)."""
    qdq = {"relax.quantize", "relax.dequantize"}
    return any(isinstance(v, relax.Call) and isinstance(v.op, Op) and v.op.name in qdq
               for v in relax.analysis.get_var2val(mod["main"]).values())


def _cpu_ops(mod: tvm.IRModule, reasons: dict[str, str]) -> list[CpuOp]:
    out = []
    var2val = dict(relax.analysis.get_var2val(mod["main"]).items())
    for var, val in var2val.items():
        if not isinstance(val, relax.Call):
            continue
        if isinstance(val.op, tvm.ir.GlobalVar):
            f = mod[val.op]
            if f.attrs is not None and "Codegen" in f.attrs:
                continue
        name = _op_name(val)
        why = reasons.get(var.name)
        if why is None:
            if name == "relax.quantize" and str(val.args[0].ty.dtype).startswith("float"):
                why = "no DSA pattern for op relax.quantize of a float tensor (graph input or CPU op)"
            elif name == "relax.dequantize" and isinstance(val.args[0], relax.Var) and \
                    var.name not in reasons:
                why = "no DSA pattern for op relax.dequantize (graph output or feeds a CPU op)"
            elif name in MAC_OPS and not _reads_dequantize(val, var2val):
                why = f"no DSA pattern for op {name} on float data ({FLOAT_LAYER})"
            else:
                why = f"no DSA pattern for op {name}"
        out.append(CpuOp(var.name, name, why, _op_macs(val), node_name(val)))
    return out


def _shape(e: relax.Expr) -> list[int] | None:
    try:
        return [int(d) for d in e.ty.shape]
    except (AttributeError, TypeError, ValueError):
        return None


_CONVS = tuple(f"relax.nn.conv{d}d" for d in (1, 2, 3))
_CONV_TRANSPOSES = tuple(f"relax.nn.conv{d}d_transpose" for d in (1, 2, 3))
_ATTENTIONS = ("relax.nn.attention", "relax.nn.attention_bias")
#: the Relax ops that carry multiply-accumulates (the MAC share counts them wherever they run)
MAC_OPS = (*_CONVS, *_CONV_TRANSPOSES, "relax.matmul", "relax.einsum", *_ATTENTIONS)


def _einsum_macs(call: relax.Call) -> int:
    """A contraction does one MAC per point of its full index space (two operands or more)."""
    ops = call.args[0].fields if isinstance(call.args[0], relax.Tuple) else []
    shapes = [_shape(o) for o in ops]
    subs = str(call.attrs.subscripts).replace(" ", "").split("->")[0].split(",")
    if len(ops) < 2 or any(s is None for s in shapes) or "." in "".join(subs):
        return 0
    size: dict[str, int] = {}
    for letters, shp in zip(subs, shapes):
        size.update(zip(letters, shp))
    return int(np.prod(list(size.values()), dtype=np.int64))


def _op_macs(call: relax.Call) -> int:
    """MACs of a Relax op that carries them (``MAC_OPS``); 0 for others or unknown shapes."""
    if not isinstance(call.op, Op) or call.op.name not in MAC_OPS:
        return 0
    name = call.op.name
    if name == "relax.einsum":
        return _einsum_macs(call)
    out = _shape(call)
    a = _shape(call.args[0])
    if name in _ATTENTIONS:  # q (B, S, N, H), k (B, S_kv, N, H), v (B, S_kv, N, H_v)
        k, v = _shape(call.args[1]), _shape(call.args[2])
        if a and k and v:
            return a[0] * a[2] * a[1] * k[1] * (a[3] + v[3])
        return 0
    w = _shape(call.args[1])
    if not (out and a and w):
        return 0
    if name in _CONVS:  # weight [O, I/groups, k...]: every output reads I/groups * taps
        return int(np.prod(out, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))
    if name in _CONV_TRANSPOSES:  # weight [I, O/groups, k...]: every input feeds O/groups * taps
        return int(np.prod(a, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))
    return int(np.prod(out, dtype=np.int64)) * a[-1]  # matmul


def region_functions(mod: tvm.IRModule) -> list[tuple[tvm.ir.GlobalVar, relax.Function]]:
    """The DSA region functions of a partitioned module, in call order: ``main``'s first,
    then those called from the module's other functions (private ones, by name)."""
    callers = sorted((gv for gv, f in mod.functions.items() if isinstance(f, relax.Function)
                      and not (f.attrs is not None and ("Codegen" in f.attrs
                                                         or "Composite" in f.attrs))),
                     key=lambda gv: (gv.name_hint != "main", gv.name_hint))
    order: dict[tvm.ir.GlobalVar, relax.Function] = {}
    for caller in callers:
        for val in relax.analysis.get_var2val(mod[caller]).values():
            if isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.GlobalVar) \
                    and val.op not in order:
                f = mod[val.op]
                if f.attrs is not None and f.attrs.get("Codegen") in CODEGENS:
                    order[val.op] = f
    return list(order.items())


def _has_composites(mod: tvm.IRModule) -> bool:
    return any(isinstance(f, relax.Function) and f.attrs is not None and "Composite" in f.attrs
               for f in mod.functions.values())


def fuse_and_merge(mod: tvm.IRModule, memo: MatchMemo,
                   notes: list[str] | None = None) -> tvm.IRModule:
    """Fuse the DSA patterns of a prepared module, merge them into regions.

    ``annotate_codegen`` stays False: MergeCompositeFunctions only merges bare
    composites (with True every layer would become its own region). A program
    MergeCompositeFunctions cannot walk (``walkable.merge_blockers``: MatchCast, If,
    symbolic dimensions as values) keeps each DSA layer a region of its own
    instead; why goes to ``notes`` (the partition report's)."""
    fused = relax.transform.FuseOpsByPattern(fusion_patterns(memo), bind_constants=True,
                                             annotate_codegen=False)(mod)
    if not _has_composites(fused):
        return fused  # no DSA layer: nothing to merge
    blockers = merge_blockers(fused)
    if not blockers:
        return relax.transform.MergeCompositeFunctions()(fused)
    if notes is not None:
        shown = "; ".join(blockers[:3]) + (f"; and {len(blockers) - 3} more"
                                            if len(blockers) > 3 else "")
        notes.append("DSA layers not merged into multi-layer regions (each is a region of its "
                     f"own): MergeCompositeFunctions cannot walk {shown}")
    return relax.transform.FuseOpsByPattern(fusion_patterns(memo), bind_constants=True,
                                            annotate_codegen=True)(mod)


@dataclass
class RegionRead:
    """One region function of a partitioned module, read into layers (or why it is not)."""

    gv: tvm.ir.GlobalVar
    name: str                   # dsa_region<i>, in call order
    region: Region | None       # None: the function did not read back (``error`` says why)
    error: str = ""


def read_regions(part: tvm.IRModule, cfg: HardwareConfig | None = None) -> list[RegionRead]:
    """Every region function of ``part`` (call order) as layers, each read once (for
    ``cfg``: fused where it runs them fused, ``region_from_function``)."""
    out = []
    for i, (gv, f) in enumerate(region_functions(part)):
        name = f"dsa_region{i}"
        try:
            out.append(RegionRead(gv, name, region_from_function(f, name, cfg)))
        except Exception as e:  # reported, and the region stays on the CPU
            out.append(RegionRead(gv, name, None, f"{type(e).__name__}: {e}"))
    return out


def partition_report(cfg: HardwareConfig, prepared: tvm.IRModule, part: tvm.IRModule,
                     regions: list[RegionRead], reasons: dict[str, str],
                     notes: list[str]) -> PartitionReport:
    """The partition's report: its regions' layers, every op left on the CPU and why, notes."""
    report = PartitionReport(cfg.name, notes=list(notes) + skipped_notes(prepared))
    for r in regions:
        if r.region is None:
            report.regions.append(RegionInfo(r.name, [], 0, r.error))
        else:
            report.regions.append(RegionInfo(r.name, [describe_layer(ly) for ly in r.region.layers],
                                             r.region.macs))
    report.cpu_ops = _cpu_ops(part, reasons)
    if not is_quantized(prepared):
        report.notes.append(NOT_QUANTIZED)
        warnings.warn(f"DSA compile: {NOT_QUANTIZED}", UserWarning, stacklevel=3)
    return report


def partition_for_dsa(mod: tvm.IRModule, cfg: HardwareConfig | str | None = None
                      ) -> tuple[tvm.IRModule, PartitionReport]:
    """Partitioned module (regions are functions with ``Codegen="dsa"``) and its report:
    stages 1-5 of the module docstring (a DSA compile runs the same ones, once)."""
    cfg = load_config(cfg)
    prepared = prepare(mod)
    memo = MatchMemo(cfg)
    reasons = pattern_decisions(prepared, memo)
    notes: list[str] = []
    part = fuse_and_merge(prepared, memo, notes)
    return part, partition_report(cfg, prepared, part, read_regions(part, cfg), reasons,
                                  notes)


def describe_layer(ly) -> str:
    """One line per layer for the report: kind, name, shapes (its room's description)."""
    from tir_schedules.kinds import describe

    return describe(ly)
