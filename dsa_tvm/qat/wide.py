"""A transformer's norm stream on int16 grids in QAT (``prepare(..., quantize_norms=True,
wide_norms=True)``), as PTQ's ``wide_norms`` puts it (:mod:`dsa_tvm.quant.norm_stream`).

A post-norm BERT's LayerNorm output is the residual stream itself, with outlier features
hundreds of times the median; on one int8 grid the other features keep a few codes, and
all-MiniLM-L6-v2 with integer LayerNorm ends at 0.916 embedding cosine even after QAT.
The DSA carries that stream in int16: the [norm] unit's ``in_wide``/``out_wide``, int16
adds, and a dense reading int16 rows as two int8 byte planes joined in its accumulator
(``layers.WeightedLayer`` computes them so, :func:`.exact.plane_product`).

Widened, by structure: every integer norm's (LayerNorm's, RMSNorm's) input and output
grid, and both input grids of the integer add that makes a norm's input. A grid stays int8 where the DSA has
no int16 form for a layer writing or reading it (the reason goes in the report); a
per-group linear layer reading one goes back to per-channel weights (the grouped dense
reads int8 rows).
"""

from __future__ import annotations

from torch import fx

from .layernorm import LayerNormLayer
from .layers import AddLayer, Grid, SameGrid, WeightedLayer, _Integer


def _writers(module: fx.GraphModule) -> dict[int, _Integer]:
    """{id of a grid: the integer layer writing it}."""
    return {id(m.out): m for m in module.modules() if isinstance(m, _Integer)}


def stream(module: fx.GraphModule, made_by: dict[int, _Integer] | None = None
           ) -> dict[Grid, str]:
    """{grid: what it is} for the norm stream of a prepared module's integer norms
    (:class:`.rmsnorm.RMSNormLayer` is a LayerNormLayer); ``made_by``: :func:`_writers`."""
    made_by = _writers(module) if made_by is None else made_by
    out: dict[Grid, str] = {}
    for m in module.modules():
        if not isinstance(m, LayerNormLayer):
            continue
        g = m.inputs[0]
        out.setdefault(g, f"{m.name} input")
        out.setdefault(m.out, f"{m.name} output")
        add = made_by.get(id(g))
        if isinstance(add, AddLayer):
            for i, a in enumerate(add.inputs):
                out.setdefault(a, f"{add.name} input {i}")
    return out


def _writer_refuses(m: _Integer | None) -> str | None:
    """Why the layer writing a grid cannot write int16 codes (None: it can; no layer: an
    FP32 value quantized on the host)."""
    if m is None or (isinstance(m, (AddLayer, LayerNormLayer)) and m.act is None):
        return None
    if isinstance(m, WeightedLayer) and m.kind == "linear" and m.act is None and not m.group:
        return None
    return (f"written by {type(m).__name__} {m.name}: only a linear layer, an add or a "
            f"norm without a fused activation writes int16 codes")


def _reader_refuses(m: object) -> str | None:
    if isinstance(m, (AddLayer, LayerNormLayer)):
        return None
    if isinstance(m, WeightedLayer) and m.kind == "linear" and m.analog is None:
        return None
    name = getattr(m, "name", "") or type(m).__name__
    return (f"read by {type(m).__name__} {name}: only a linear layer, an add or a norm "
            f"reads int16 codes")


def widen_stream(module: fx.GraphModule) -> tuple[list[str], list[tuple[str, str]]]:
    """Put the norm stream's grids on int16 (before calibration). Returns (the grids
    widened, [(a grid kept int8, why)])."""
    made_by = _writers(module)
    readers: dict[int, list[object]] = {}
    for m in module.modules():
        if isinstance(m, _Integer):
            for g in m.inputs:
                readers.setdefault(id(g), []).append(m)
        elif isinstance(m, SameGrid):
            readers.setdefault(id(m.grid), []).append(m)
    widened, narrow = [], []
    for g, what in stream(module, made_by).items():
        why = _writer_refuses(made_by.get(id(g)))
        for r in readers.get(id(g), []):
            why = why or _reader_refuses(r)
        if why is not None:
            narrow.append((what, why))
            continue
        g.widen()
        widened.append(what)
        for r in readers.get(id(g), []):
            if isinstance(r, WeightedLayer):
                r.group = 0
    return widened, narrow
