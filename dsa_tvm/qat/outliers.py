"""PTQ's outlier split for QAT: a linear layer's outlier output channels in FP32 beside it.

BERT-family models have a few hidden channels ~100x the rest (one FFN output channel of
all-MiniLM-L6-v2 reaches 164 where 99.9% of its values stay below 2). One per-tensor
int8 output grid over them leaves the ordinary channels a code or two. PTQ
(``dsa_tvm.quant.outliers``) computes those channels in a tiny FP32 side path on the host
and keeps the rest of the layer on the DSA with a narrow grid; this does the same on a
prepared module, choosing the channels with PTQ's own predicate
(``quant.outliers.outlier_channels``) from the FP32 outputs over the calibration data.
The side path is ``layers.side_path``; the integer layer's weights are zero there.

PTQ also splits a linear layer's outlier *input* features where its input is made in
FP32 (a LayerNorm's or GELU's output): the grid holds the input with those features
zeroed (``Grid.mask``) and ``layers.input_side_path`` adds ``x[..., I] @ W[:, I].T`` from
the unquantized input. On all-MiniLM-L6-v2 one to three features of every FFN layer's
input (LayerNorm gain outliers, and GELU outputs of the outlier channels). A linear layer
reading the int16 norm stream (``wide_norms``) is split the same way, onto an int8 grid of
its own, as PTQ plans it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import fx, nn

from ..quant.outliers import OutlierOptions, outlier_channels
from .layers import Grid, SameGrid, WeightedLayer, _Integer


def channel_absmax(module: nn.Module, batches: Sequence[Sequence[torch.Tensor]],
                   inputs_of: Sequence[nn.Module] = (), outputs_of: Sequence[nn.Module] = (),
                   ) -> tuple[dict[nn.Module, np.ndarray], dict[nn.Module, np.ndarray]]:
    """max |value| per last-axis channel of the first input of each of ``inputs_of`` and
    of the output of each of ``outputs_of``, over one pass of ``module`` on ``batches``."""
    seen_in: dict[nn.Module, np.ndarray] = {}
    seen_out: dict[nn.Module, np.ndarray] = {}

    def recorder(seen: dict[nn.Module, np.ndarray], inputs: bool):
        def record(m: nn.Module, args, y: torch.Tensor | None = None) -> None:
            v = (args[0] if inputs else y).detach()
            a = v.abs().reshape(-1, v.shape[-1]).amax(0).numpy()
            seen[m] = a if m not in seen else np.maximum(seen[m], a)
        return record

    hooks = ([m.register_forward_pre_hook(recorder(seen_in, True)) for m in inputs_of]
             + [m.register_forward_hook(recorder(seen_out, False)) for m in outputs_of])
    try:
        with torch.no_grad():
            for args in batches:
                module(*args)
    finally:
        for h in hooks:
            h.remove()
    return seen_in, seen_out


def split_all(module: fx.GraphModule, batches: Sequence[Sequence[torch.Tensor]],
              opts: OutlierOptions | None = None) -> tuple[dict[str, list[int]],
                                                           dict[str, list[int]]]:
    """Both splits (:func:`split_input_outliers`, then :func:`split_outliers`) from one
    FP32 pass over ``batches``: ({layer: input features}, {layer: output channels}). The
    module must be in ``float`` mode. Neither split changes an FP32 value, so one pass
    serves both; the output plan is taken again after the input split, which can only
    shrink it (a split reader also reads its grid's FP32 input, as integers).

    A linear layer writing the int16 norm stream (``wide_norms``) may be split too, as PTQ
    splits it: then its integer part writes an int8 grid of its own and the FP32 sum is
    requantized onto the stream's int16 grid (:func:`_regrid`)."""
    opts = opts or OutlierOptions()
    regrid = _wide_output_plan(module)
    inputs, wide = _input_plan(module, set(regrid)), _wide_input_plan(module)
    seen_in, seen_out = channel_absmax(module, batches, list(inputs) + list(wide),
                                       _output_plan(module, set(regrid)))
    for layer, n in regrid.items():
        if _finds(seen_out.get(layer), opts) or any(
                layer in readers and _finds(seen_in.get(g), opts)
                for g, (_, readers) in inputs.items()):
            _regrid(module, layer, n)
        else:   # written as int16 directly: a split's FP32 sum has nowhere to go
            inputs = {g: v for g, v in inputs.items() if layer not in v[1]}
    split_in = _apply_input_split(module, inputs, seen_in, opts)
    split_in.update(_apply_wide_input_split(module, wide, seen_in, opts))
    return split_in, _apply_output_split(_output_plan(module), seen_out, opts)


def _free_name(module: nn.Module, base: str) -> str:
    name, i = base, 0
    while hasattr(module, name):
        i += 1
        name = f"{base}_{i}"
    return name


def _int8_grid(module: fx.GraphModule, layer: WeightedLayer) -> Grid:
    """A fresh int8 grid beside ``layer``, calibrated as prepare calibrates activations."""
    return Grid(layer.out.method, getattr(module, "qat_symmetric", False))


def _finds(absmax: np.ndarray | None, opts: OutlierOptions) -> bool:
    return absmax is not None and outlier_channels(absmax, opts).size > 0


def _wide_output_plan(module: fx.GraphModule) -> dict[WeightedLayer, fx.Node]:
    """{linear layer: its node} for the unsplit linear layers writing an int16 grid."""
    mods = dict(module.named_modules())
    return {m: n for n in module.graph.nodes
            if n.op == "call_module" and isinstance(m := mods.get(n.target), WeightedLayer)
            and m.kind == "linear" and m.out.wide and m.side_rows is None
            and m.side_cols is None}


def _regrid(module: fx.GraphModule, layer: WeightedLayer, n: fx.Node) -> None:
    """``layer`` writes an int8 grid of its own; its int16 grid becomes a node after it
    (quantizing the sum of the integer part and its side paths), read where it was read:
    PTQ's ``main`` tensor and the int16 Q/DQ of the split layer's sum."""
    wide = layer.out
    layer.out = _int8_grid(module, layer)
    name = _free_name(module, f"{n.name}_sum")
    module.add_submodule(name, wide)
    with module.graph.inserting_after(n):
        q = module.graph.call_module(name, (n,))
    n.replace_all_uses_with(q, delete_user_cb=lambda u: u is not q)
    module.recompile()


def split_outliers(module: fx.GraphModule, batches: Sequence[Sequence[torch.Tensor]],
                   opts: OutlierOptions | None = None) -> dict[str, list[int]]:
    """Give every linear layer without a side path yet one for its outlier output
    channels (measured in FP32 over ``batches``), unless its output is read as integers;
    returns {layer: channels} for those that got one. The module must be in ``float``
    mode."""
    todo = _output_plan(module)
    return _apply_output_split(todo, channel_absmax(module, batches, outputs_of=todo)[1],
                               opts or OutlierOptions())


def _output_plan(module: fx.GraphModule, regrid: set[WeightedLayer] = frozenset()
                 ) -> list[WeightedLayer]:
    """The linear layers an output split may touch (no side path yet, output not read as
    integers unless the layer is in ``regrid``)."""
    mods = dict(module.named_modules())
    read_as_integers = {mods[n.target] for n in module.graph.nodes
                        if n.op == "call_module" and _integer_readers(n, mods)} - regrid
    return [m for m in module.modules() if isinstance(m, WeightedLayer) and m.kind == "linear"
            and m.side_rows is None and m not in read_as_integers]


def _apply_output_split(todo: list[WeightedLayer], seen: dict[nn.Module, np.ndarray],
                        opts: OutlierOptions) -> dict[str, list[int]]:
    out = {}
    for layer in todo:
        rows = outlier_channels(seen[layer], opts) if layer in seen else np.zeros(0, np.int64)
        if rows.size:
            layer.side_rows = torch.from_numpy(rows)
            out[layer.name] = rows.tolist()
    return out


def _integer_readers(n: fx.Node, mods: dict[str, nn.Module]) -> bool:
    """Whether an integer layer (or a grid-keeping op) reads ``n``'s output as codes: a
    side path's FP32 sum there would be rounded back onto the grid it escaped."""
    return any(u.op == "call_module" and isinstance(mods.get(u.target), (_Integer, SameGrid))
               for u in n.users)


def _splittable(q: fx.Node, mods: dict[str, nn.Module],
                regrid: set[WeightedLayer] = frozenset()) -> list[WeightedLayer]:
    """The linear layers reading grid node ``q``, when its input may be split: every
    reader is such a layer without an input split yet, and none of their outputs is read
    as integers (the side path's FP32 sum is no grid value), unless it is in ``regrid``."""
    layers = []
    for u in q.users:
        m = mods.get(u.target) if u.op == "call_module" else None
        if not (isinstance(m, WeightedLayer) and m.kind == "linear" and m.side_cols is None
                and len(u.args) == 1 and u.args[0] is q):
            return []
        if _integer_readers(u, mods) and m not in regrid:
            return []
        layers.append(m)
    return layers


def split_input_outliers(module: fx.GraphModule, batches: Sequence[Sequence[torch.Tensor]],
                         opts: OutlierOptions | None = None) -> dict[str, list[int]]:
    """PTQ's input split: for every grid that quantizes an FP32 value read only by linear
    layers, the value's outlier features (PTQ's predicate over its FP32 magnitudes on
    ``batches``) move to FP32 side paths beside each reader. Returns {layer: features}.
    The module must be in ``float`` mode."""
    todo = _input_plan(module)
    return _apply_input_split(module, todo, channel_absmax(module, batches, list(todo))[0],
                              opts or OutlierOptions())


def _input_plan(module: fx.GraphModule, regrid: set[WeightedLayer] = frozenset()
                ) -> dict[Grid, tuple[fx.Node, list[WeightedLayer]]]:
    """{grid: (its node, its linear readers)} for every grid an input split may touch."""
    mods = dict(module.named_modules())
    todo = {}
    for q in module.graph.nodes:
        g = mods.get(q.target) if q.op == "call_module" else None
        if isinstance(g, Grid) and g.mask is None and isinstance(q.args[0], fx.Node):
            readers = _splittable(q, mods, regrid)
            if readers:
                todo[g] = (q, readers)
    return todo


def _apply_input_split(module: fx.GraphModule,
                       todo: dict[Grid, tuple[fx.Node, list[WeightedLayer]]],
                       seen: dict[nn.Module, np.ndarray], opts: OutlierOptions,
                       ) -> dict[str, list[int]]:
    out = {}
    for g, (q, readers) in todo.items():
        cols = outlier_channels(seen[g], opts) if g in seen else np.zeros(0, np.int64)
        if not cols.size:
            continue
        mask = torch.ones(len(seen[g]))
        mask[torch.from_numpy(cols)] = 0.0
        g.mask = mask
        for u in list(q.users):
            u.args = (q, q.args[0])
        for layer in readers:
            layer.side_cols = torch.from_numpy(cols)
            out[layer.name] = cols.tolist()
    if out:
        module.recompile()
    return out


def _wide_input_plan(module: fx.GraphModule) -> dict[WeightedLayer, fx.Node]:
    """{linear layer: its node} for the linear layers reading an int16 grid (the norm
    stream, ``prepare(..., wide_norms=True)``) whose output is not read as integers."""
    mods = dict(module.named_modules())
    todo = {}
    for n in module.graph.nodes:
        m = mods.get(n.target) if n.op == "call_module" else None
        if isinstance(m, WeightedLayer) and m.kind == "linear" and m.side_cols is None and \
                m.inputs[0].wide and len(n.args) == 1 and not _integer_readers(n, mods):
            todo[m] = n
    return todo


def _apply_wide_input_split(module: fx.GraphModule, todo: dict[WeightedLayer, fx.Node],
                            seen: dict[nn.Module, np.ndarray], opts: OutlierOptions,
                            ) -> dict[str, list[int]]:
    """PTQ's input split where a linear layer reads the int16 stream: with outlier
    features, the layer reads the stream with them zeroed on an int8 grid of its own (its
    int8 output grid then holds the ordinary features' sums, not the outliers') and adds
    them from the stream's values in an FP32 side path, as ``quantize_onnx(...,
    wide_norms=True)`` plans it (a Mul by the mask and an int8 Q/DQ on the host)."""
    out = {}
    for layer, n in todo.items():
        cols = outlier_channels(seen[layer], opts) if layer in seen else np.zeros(0, np.int64)
        if not cols.size:
            continue
        g = _int8_grid(module, layer)
        g.mask = torch.ones(len(seen[layer]))
        g.mask[torch.from_numpy(cols)] = 0.0
        name = _free_name(module, f"{n.name}_main")
        module.add_submodule(name, g)
        src = n.args[0]
        with module.graph.inserting_before(n):
            q = module.graph.call_module(name, (src,))
        n.args = (q, src)
        object.__setattr__(layer, "inputs", [g])
        layer.side_cols = torch.from_numpy(cols)
        out[layer.name] = cols.tolist()
    if out:
        module.recompile()
    return out
