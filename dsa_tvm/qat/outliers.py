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
input (LayerNorm gain outliers, and GELU outputs of the outlier channels).
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
    shrink it (a split reader also reads its grid's FP32 input, as integers)."""
    opts = opts or OutlierOptions()
    inputs = _input_plan(module)
    seen_in, seen_out = channel_absmax(module, batches, list(inputs), _output_plan(module))
    split_in = _apply_input_split(module, inputs, seen_in, opts)
    return split_in, _apply_output_split(_output_plan(module), seen_out, opts)


def split_outliers(module: fx.GraphModule, batches: Sequence[Sequence[torch.Tensor]],
                   opts: OutlierOptions | None = None) -> dict[str, list[int]]:
    """Give every linear layer without a side path yet one for its outlier output
    channels (measured in FP32 over ``batches``), unless its output is read as integers;
    returns {layer: channels} for those that got one. The module must be in ``float``
    mode."""
    todo = _output_plan(module)
    return _apply_output_split(todo, channel_absmax(module, batches, outputs_of=todo)[1],
                               opts or OutlierOptions())


def _output_plan(module: fx.GraphModule) -> list[WeightedLayer]:
    """The linear layers an output split may touch (no side path yet, output not read as
    integers)."""
    mods = dict(module.named_modules())
    read_as_integers = {mods[n.target] for n in module.graph.nodes
                        if n.op == "call_module" and _integer_readers(n, mods)}
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


def _splittable(q: fx.Node, mods: dict[str, nn.Module]) -> list[WeightedLayer]:
    """The linear layers reading grid node ``q``, when its input may be split: every
    reader is such a layer without an input split yet, and none of their outputs is read
    as integers (the side path's FP32 sum is no grid value)."""
    layers = []
    for u in q.users:
        m = mods.get(u.target) if u.op == "call_module" else None
        if not (isinstance(m, WeightedLayer) and m.kind == "linear" and m.side_cols is None
                and len(u.args) == 1 and u.args[0] is q):
            return []
        if _integer_readers(u, mods):
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


def _input_plan(module: fx.GraphModule) -> dict[Grid, tuple[fx.Node, list[WeightedLayer]]]:
    """{grid: (its node, its linear readers)} for every grid an input split may touch."""
    mods = dict(module.named_modules())
    todo = {}
    for q in module.graph.nodes:
        g = mods.get(q.target) if q.op == "call_module" else None
        if isinstance(g, Grid) and g.mask is None and isinstance(q.args[0], fx.Node):
            readers = _splittable(q, mods)
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
