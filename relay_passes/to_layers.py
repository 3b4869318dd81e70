"""Turn one merged DSA region function into a :class:`~dsa_tvm.layers.ir.Region`.

Each composite call inside the region is read back with ``patterns.describe``
and every real scale is folded into integer parameters here, once, with
``semantics.quantize_multiplier``; the codegen and the CPU reference then only
ever see integers. Quantization follows ``real = scale * (q - zero_point)``:

* conv / dense: ``M[c] = s_in * s_w[c] / s_out``; the int32 bias is used as is
  when its scale is ``s_in * s_w[c]`` (what quantizers emit), else rescaled to it.
* batch matmul: ``M = s_a * s_b / s_out``.
* pools: ``M = s_in / s_out``, divided by the window count (avg) or H*W (global).
* add: ``a_mult = round(s_a / s_y * 2**n)``, ``b_mult`` likewise, REQUANT ``(1, n)``.
* ReLU / Clip: ``q(clip(v, lo, hi)) = clip(q(v), q(lo), q(hi))`` because
  quantization is monotone, so they become the REQUANT clip bounds.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from tvm import relax

from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.ir import (
    Add,
    BatchMatmul,
    BiasAdd,
    Conv2d,
    Dense,
    GlobalAvgPool,
    Layer,
    Pool2d,
    QTensor,
    Region,
    Requant,
    Rescale,
    layer_inputs,
)

from .patterns import Match, QParams, describe
from .scales import ADD_MULT_BITS, accumulator_bias, channel_addend, rescale_factors


class LoweringError(ValueError):
    """A region function that does not have the shape partition_for_dsa produces."""


def _requant(factors: np.ndarray, m: Match) -> Requant:
    pairs = [sem.quantize_multiplier(float(f)) for f in np.asarray(factors, np.float64).reshape(-1)]
    mult = np.array([p[0] for p in pairs], np.int32)
    shift = np.array([p[1] for p in pairs], np.int32)
    return Requant(mult, shift, int(m.out.zero_point[0]), clip_bounds(m))


def _q(v: float, scale: float, zp: int) -> int:
    if math.isinf(v):
        return sem.INT8_MAX if v > 0 else sem.INT8_MIN
    return int(np.clip(np.round(np.float32(v) / np.float32(scale)) + zp, sem.INT8_MIN, sem.INT8_MAX))


def clip_bounds(m: Match) -> tuple[int, int]:
    """The fused activation as int8 bounds in the output's integer domain."""
    if m.act is None:
        return (sem.INT8_MIN, sem.INT8_MAX)
    _, lo, hi = m.act
    s, zp = float(m.out.scale[0]), int(m.out.zero_point[0])
    return (_q(lo, s, zp), _q(hi, s, zp))


def _bias(m: Match, channels: int) -> np.ndarray:
    if m.bias is None:
        return np.zeros(channels, np.int32)
    b = accumulator_bias(m, channels)  # the "bias" constraint checked that it fits int32
    if np.abs(b).max() > sem.INT32_MAX:
        raise LoweringError(f"bias {np.abs(b).max():.4g} does not fit int32 (unchecked region?)")
    return b.astype(np.int32)


def _add_params(m: Match) -> tuple[int, int, int]:
    ra, rb = (float(f) for f in rescale_factors(m))
    n = ADD_MULT_BITS - 1 - math.floor(math.log2(max(ra, rb)))
    n = min(max(n, 0), sem.REQUANT_SHIFT_RANGE[1])
    return int(round(ra * 2 ** n)), int(round(rb * 2 ** n)), n


def _batched(t: QTensor) -> QTensor:
    """(..., R, C) as (B, R, C); the runtime reshapes the graph's tensors to match."""
    lead = int(np.prod(t.shape[:-2], dtype=np.int64))
    return QTensor(t.name, (lead,) + tuple(t.shape[-2:]), t.scale, t.zero_point)


def _rows(t: QTensor) -> QTensor:
    """A 4-D tensor (..., C) as the matrix (rows, C) a dense layer reads. The DSA takes
    every 4-D tensor for an NCHW image; a dense layer over the last axis of one
    (channels-last Linear) must see it as rows of C, as ranks 2, 3 and 5 already are."""
    if len(t.shape) != 4:
        return t
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    return QTensor(t.name, (rows, int(t.shape[-1])), t.scale, t.zero_point)


def layer_from_match(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    """The integer layer description of one matched pattern."""
    k = m.kind
    if k == "conv2d":
        a = m.op.attrs
        w = m.weight.value.astype(np.int8)
        pads = tuple(int(p) for p in a.padding)
        return Conv2d(name, inputs[0], output, w, _bias(m, w.shape[0]),
                      tuple(int(s) for s in a.strides), pads,  # relax order: top, left, bottom, right
                      tuple(int(d) for d in a.dilation), int(a.groups),
                      _requant(rescale_factors(m), m))
    if k == "dense":
        w = m.weight.value.astype(np.int8)
        w = w if m.weight_transposed else np.ascontiguousarray(w.T)
        return Dense(name, _rows(inputs[0]), _rows(output), w, _bias(m, w.shape[0]),
                     _requant(rescale_factors(m), m))
    if k == "batch_matmul":  # the DSA sees (B, M, K): leading dimensions flattened
        a, b, y = (_batched(t) for t in (inputs[0], inputs[1], output))
        return BatchMatmul(name, a, b, y, _requant(rescale_factors(m), m))
    if k in ("max_pool2d", "avg_pool2d"):
        a = m.op.attrs
        return Pool2d(name, k[:3], inputs[0], output, tuple(int(v) for v in a.pool_size),
                      tuple(int(v) for v in a.strides), tuple(int(v) for v in a.padding),
                      _requant(rescale_factors(m), m))
    if k == "global_avg_pool":
        return GlobalAvgPool(name, inputs[0], output, _requant(rescale_factors(m), m))
    if k == "add":
        am, bm, n = _add_params(m)
        rq = Requant(np.array([1], np.int32), np.array([n], np.int32), int(m.out.zero_point[0]),
                     clip_bounds(m))
        if m.addend is not None:
            c = channel_addend(m.addend.value, tuple(m.out_shape)).astype(np.int64)
            bias = (c - int(m.addend.qp.zero_point[0])) * bm
            return BiasAdd(name, inputs[0], output, am, bias.astype(np.int32), rq)
        return Add(name, inputs[0], inputs[1], output, am, bm, rq)
    if k in ("relu", "clip", "rescale"):
        return Rescale(name, inputs[0], output, _requant(rescale_factors(m), m))
    raise LoweringError(f"no layer for pattern kind '{k}'")


def _qt(name: str, shape: tuple[int, ...], qp: QParams) -> QTensor:
    return QTensor(name, tuple(int(d) for d in shape), float(qp.scale[0]), int(qp.zero_point[0]))


def _bindings(body: relax.Expr) -> list[relax.Binding]:
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for blk in body.blocks for b in blk.bindings]


def region_from_function(func: relax.Function, name: str) -> Region:
    """The Region of a merged ``Codegen="dsa"`` function (layers in topological order)."""
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
            ins.append(_qt(tname(src), op.shape, op.qp))
        layer = layer_from_match(m, f"{name}.{len(layers)}:{m.kind}", ins,
                                 _qt(tname(b.var), m.out_shape, m.out))
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
    layers = _row_views(layers, name)
    inputs = {t.name: t for ly in layers for t in layer_inputs(ly) if t.name in params}
    tensors = {ly.output.name: ly.output for ly in layers}
    outs = [tensors[t.name] for t in outs]
    missing = [p.name for p in func.params if tname(p) not in inputs]
    if missing:
        raise LoweringError(f"region {name}: parameters {missing} are not used by any layer")
    return Region(name, [inputs[tname(p)] for p in func.params], outs, layers)


def _row_views(layers: list[Layer], region: str) -> list[Layer]:
    """Give every tensor of the region one view: element-wise layers (Add, Rescale) that
    touch a 4-D tensor a dense layer reads as rows read all their tensors as rows too
    (same element order, so the same result). A 4-D tensor that a conv, pool or
    per-channel add needs as an NCHW image and a dense layer as rows cannot be laid
    out for both: the region stays on the CPU, saying so."""
    rows = {t.name for ly in layers if isinstance(ly, Dense)
            for t in (ly.input, ly.output) if len(t.shape) == 2}
    out = list(layers)
    changed = True
    while changed:
        changed = False
        for i, ly in enumerate(out):
            if not isinstance(ly, (Add, Rescale)):
                continue
            ts = layer_inputs(ly) + [ly.output]
            if any(len(t.shape) == 4 for t in ts) and {t.name for t in ts} & rows:
                if isinstance(ly, Add):
                    out[i] = dataclasses.replace(ly, a=_rows(ly.a), b=_rows(ly.b),
                                                 output=_rows(ly.output))
                else:
                    out[i] = dataclasses.replace(ly, input=_rows(ly.input),
                                                 output=_rows(ly.output))
                rows |= {t.name for t in ts}
                changed = True
    seen: dict[str, tuple[tuple[int, ...], str]] = {}
    for ly in out:
        for t in layer_inputs(ly) + [ly.output]:
            shape, who = seen.setdefault(t.name, (tuple(t.shape), ly.name))
            if shape != tuple(t.shape):
                raise LoweringError(
                    f"region {region}: tensor '{t.name}' is read as {shape} by {who} and as "
                    f"{tuple(t.shape)} by {ly.name}: a dense layer reads a 4-D tensor as rows "
                    f"of its last axis, an image layer as NCHW, and one DSA layout cannot "
                    f"serve both (the region runs on the CPU)")
    return out
