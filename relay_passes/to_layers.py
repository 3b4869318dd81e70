"""Turn one merged DSA region function into a :class:`~dsa_tvm.layers.ir.Region`.

Each composite call inside the region is read back with ``kinds.describe`` and
converted by its kind (``kinds.layer_from_match``), which folds every real scale
into integer parameters; this module wires the layers' tensors together and gives
each tensor one view (row views).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from tvm import relax

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.ir import (
    Add,
    AddConst,
    BatchMatmul,
    Concat,
    Conv2d,
    Dense,
    Layer,
    LayerNorm,
    Permute,
    QTensor,
    Region,
    Rescale,
    RMSNorm,
    Softmax,
    Table,
    WideTable,
    layer_inputs,
)
from dsa_tvm.layers.layouts import same_bytes

from .kinds import describe, layer_from_match
from .kinds.dense import as_rows
from .kinds.match import LoweringError, qtensor
from .kinds.matmul_planes import fuse_plane_matmuls


def _bindings(body: relax.Expr) -> list[relax.Binding]:
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for blk in body.blocks for b in blk.bindings]


def region_from_function(func: relax.Function, name: str,
                         cfg: HardwareConfig | None = None) -> Region:
    """The Region of a merged ``Codegen="dsa"`` function (layers in topological order);
    with ``cfg``, layers that hardware runs better fused are fused (a softmax and the
    byte planes of the matmul it feeds: ``matmul_planes.fuse_plane_matmuls``)."""
    names: dict[relax.Var, str] = {}
    used: set[str] = set()

    def tname(v: relax.Var) -> str:
        if v not in names:
            base = n = v.name
            i = 1
            while n in used:
                n, i = f"{base}_{i}", i + 1
            names[v] = n
            used.add(n)
        return names[v]

    params = {tname(p) for p in func.params}
    local_funcs: dict[relax.Var, relax.Function] = {}
    tensors: dict[str, QTensor] = {}
    inputs: dict[str, QTensor] = {}
    layers: list[Layer] = []
    for b in _bindings(func.body):
        val = b.value
        if isinstance(val, relax.Function):
            local_funcs[b.var] = val
            continue
        if not (isinstance(val, relax.Call) and val.op in local_funcs):
            raise LoweringError(f"region {name}: unexpected binding {b.var.name} (not a composite call)")
        comp = local_funcs[val.op]
        kind = str(comp.attrs["Composite"]).split(".", 1)[1]
        var2val = {cb.var: cb.value for cb in _bindings(comp.body)}
        m = describe(kind, comp.body.body, var2val)
        arg_of = {p: a for p, a in zip(comp.params, val.args)}
        ins = []
        for op in m.inputs:
            src = arg_of.get(op.expr)
            if not isinstance(src, relax.Var):
                raise LoweringError(f"region {name}: input of {b.var.name} is not a region tensor")
            ins.append(qtensor(tname(src), op.source_shape or op.shape, op.qp))
        for expr, shape in getattr(m, "float_inputs", ()):   # read as floats (rope tables)
            src = arg_of.get(expr)
            if not isinstance(src, relax.Var):
                raise LoweringError(f"region {name}: a float input of {b.var.name} is not a "
                                    f"region tensor")
            ins.append(QTensor(tname(src), tuple(shape), 1.0, 0))
        made = layer_from_match(m, f"{name}.{len(layers)}:{m.kind}", ins,
                                qtensor(tname(b.var), m.out_shape, m.out))
        # a kind may make several layers (a transposed conv: zero insertion, then a conv)
        for layer in made if isinstance(made, tuple) else (made,):
            for t in layer_inputs(layer):  # the layer's own view (a batch matmul flattens)
                if t.name in params:
                    inputs.setdefault(t.name, t)
            tensors[layer.output.name] = layer.output
            layers.append(layer)
    ret = func.body.body if isinstance(func.body, relax.SeqExpr) else func.body
    rets = list(ret.fields) if isinstance(ret, relax.Tuple) else [ret]
    outs = []
    for r in rets:
        if not isinstance(r, relax.Var) or tname(r) not in tensors:
            raise LoweringError(f"region {name}: output is not produced by a layer")
        outs.append(tensors[tname(r)])
    layers = _row_views(_height1_views(layers), name)
    if cfg is not None:
        layers = fuse_plane_matmuls(layers, {t.name for t in outs}, cfg)
    inputs = {t.name: t for ly in layers for t in layer_inputs(ly) if t.name in params}
    tensors = {ly.output.name: ly.output for ly in layers}
    outs = [tensors[t.name] for t in outs]
    missing = [p.name for p in func.params if tname(p) not in inputs]
    if missing:
        raise LoweringError(f"region {name}: parameters {missing} are not used by any layer")
    return Region(name, [inputs[tname(p)] for p in func.params], outs, layers)


def _as_height1(t: QTensor) -> QTensor:
    return dataclasses.replace(t, shape=(t.shape[0], t.shape[1], 1, t.shape[2]))


def _viewed(ly: Layer, view: Callable[[QTensor], QTensor]) -> Layer:
    """An element-wise layer (Add, Concat, or one with ``input``) with ``view`` applied to
    every tensor it reads and writes: the same elements in the same order, another shape."""
    if isinstance(ly, Concat):
        return dataclasses.replace(ly, inputs=tuple(map(view, ly.inputs)), output=view(ly.output))
    if isinstance(ly, Add):
        return dataclasses.replace(ly, a=view(ly.a), b=view(ly.b), output=view(ly.output))
    return dataclasses.replace(ly, input=view(ly.input), output=view(ly.output))


def _height1_views(layers: list[Layer]) -> list[Layer]:
    """A conv1d runs as a conv2d of height 1 and sees its (N, C, W) tensors as
    (N, C, 1, W) (the same bytes); element-wise layers (Add, Rescale) that touch such a
    tensor as 3-D take the same view of all their 3-D tensors, so a 1-D residual add
    stays in the region; a 3-D concat on axis 1 that touches one is a channel concat of
    those images (not a concat of rows)."""
    h1 = {t.name for ly in layers if isinstance(ly, Conv2d)
          for t in (ly.input, ly.output) if t.shape[2] == 1}
    out = list(layers)
    changed = True
    while changed:
        changed = False
        for i, ly in enumerate(out):
            if not isinstance(ly, (Add, Rescale, Concat)):
                continue
            ts = layer_inputs(ly) + [ly.output]
            if not (all(len(t.shape) == 3 for t in ts) and {t.name for t in ts} & h1):
                continue
            out[i] = _viewed(ly, _as_height1)
            h1 |= {t.name for t in ts}
            changed = True
    return out


_NORMS = (Softmax, LayerNorm, RMSNorm)



def _per_tensor(rq):
    """The requant with one multiplier and shift when all its channels share them (a
    rows view changes which axis is the channel axis), else None."""
    m, s = np.asarray(rq.multiplier).reshape(-1), np.asarray(rq.shift).reshape(-1)
    if np.all(m == m[0]) and np.all(s == s[0]):
        return dataclasses.replace(rq, multiplier=m[:1].copy(), shift=s[:1].copy())
    return None


def _norm_views(layers: list[Layer]) -> list[Layer]:
    """A row norm reads its tensors as rows of the last axis, which every non-image view
    keeps ((B, T, D), (B*H, T, T), (rows, D) are the same bytes): it takes the view the
    region's other layers give a tensor (a batch matmul's (B*H, T, T), a dense layer's
    (1, T, D)), so that one DRAM layout serves both."""
    views: dict[str, QTensor] = {}
    for ly in layers:
        if not isinstance(ly, _NORMS):
            for t in layer_inputs(ly) + [ly.output]:
                if len(t.shape) != 4:
                    views.setdefault(t.name, t)
    out = []
    for ly in layers:
        if isinstance(ly, _NORMS):
            def pick(t: QTensor) -> QTensor:
                v = views.get(t.name)
                if v is None or v.shape[-1] != t.shape[-1]:
                    return t
                return dataclasses.replace(t, shape=tuple(v.shape))
            ly = dataclasses.replace(ly, input=pick(ly.input), output=pick(ly.output))
        out.append(ly)
    return out


def _row_views(layers: list[Layer], region: str) -> list[Layer]:
    """Give every tensor of the region one view: element-wise layers (Add, Rescale) that
    touch a 4-D tensor a dense layer reads as rows read all their tensors as rows too
    (same element order, so the same result). A 4-D tensor that a conv, pool or
    per-channel add needs as an NCHW image and a dense layer as rows cannot be laid
    out for both: the region stays on the CPU, saying so."""
    rows = {t.name for ly in layers if isinstance(ly, (Dense, *_NORMS))
            for t in (ly.input, ly.output) if len(t.shape) == 2}
    # batch matmuls and data movements read every tensor as rows of its last axis
    rows |= {t.name for ly in layers if isinstance(ly, (BatchMatmul, Permute))
             for t in layer_inputs(ly) + [ly.output] if len(t.shape) != 4}
    out = list(layers)
    changed = True
    while changed:
        changed = False
        for i, ly in enumerate(out):
            if not isinstance(ly, (Add, AddConst, Rescale, Table, WideTable)):
                continue
            ts = layer_inputs(ly) + [ly.output]
            names = {t.name for t in ts}
            if not names & rows:
                continue
            if all(len(t.shape) != 4 for t in ts):
                # already rows (a join of two byte planes' products): its output is rows
                # for a 4-D reader too
                if not names <= rows:
                    rows |= names
                    changed = True
                continue
            if isinstance(ly, Rescale):
                rq = _per_tensor(ly.requant)
                if rq is None:  # per-channel over NCHW channels: no rows view of it
                    continue
                ly = dataclasses.replace(ly, requant=rq)
            out[i] = _viewed(ly, as_rows)
            rows |= names
            changed = True
    out = _norm_views(out)
    seen: dict[str, tuple[tuple[int, ...], str]] = {}
    for ly in out:
        for t in layer_inputs(ly) + [ly.output]:
            shape, who = seen.setdefault(t.name, (tuple(t.shape), ly.name))
            if not same_bytes(shape, tuple(t.shape)):
                raise LoweringError(
                    f"region {region}: tensor '{t.name}' is read as {shape} by {who} and as "
                    f"{tuple(t.shape)} by {ly.name}: a dense layer reads a 4-D tensor as rows "
                    f"of its last axis, an image layer as NCHW, and one DSA layout cannot "
                    f"serve both (the region runs on the CPU)")
    return out
