"""PTQ's outlier split for QAT: a linear layer's outlier output channels in FP32 beside it.

BERT-family models have a few hidden channels ~100x the rest (one FFN output channel of
all-MiniLM-L6-v2 reaches 164 where 99.9% of its values stay below 2). One per-tensor
int8 output grid over them leaves the ordinary channels a code or two. PTQ
(``dsa_tvm.quant.outliers``) computes those channels in a tiny FP32 side path on the host
and keeps the rest of the layer on the DSA with a narrow grid; this does the same on a
prepared module, choosing the channels with PTQ's own predicate
(``quant.outliers.outlier_channels``) from the FP32 outputs over the calibration data.
The side path is ``layers.side_path``; the integer layer's weights are zero there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..quant.outliers import OutlierOptions, outlier_channels
from .layers import WeightedLayer


def split_outliers(module: nn.Module, batches: Sequence[Sequence[torch.Tensor]],
                   opts: OutlierOptions | None = None) -> dict[str, list[int]]:
    """Give every linear layer without a side path yet one for its outlier output
    channels (measured in FP32 over ``batches``); returns {layer: channels} for those
    that got one. The module must be in ``float`` mode."""
    opts = opts or OutlierOptions()
    todo = [m for m in module.modules() if isinstance(m, WeightedLayer) and m.kind == "linear"
            and m.side_rows is None]
    seen: dict[WeightedLayer, np.ndarray] = {}

    def record(layer: WeightedLayer, _args, y: torch.Tensor) -> None:
        m = y.detach().abs().reshape(-1, y.shape[-1]).amax(0).numpy()
        seen[layer] = m if layer not in seen else np.maximum(seen[layer], m)

    hooks = [m.register_forward_hook(record) for m in todo]
    try:
        with torch.no_grad():
            for args in batches:
                module(*args)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for layer in todo:
        rows = outlier_channels(seen[layer], opts) if layer in seen else np.zeros(0, np.int64)
        if rows.size:
            layer.side_rows = torch.from_numpy(rows)
            out[layer.name] = rows.tolist()
    return out
