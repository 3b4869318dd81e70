"""Fold a few-channel conv's window into its channels at the region boundary (host im2col).

A conv over few input channels (the RGB stem) fills only C of the array's
``block_in`` lanes on every tap: a 7x7 conv over 3 channels takes 49 GEMM steps
per pixel at 3/16 lane use. When such a conv reads a region input that no other
layer reads, the runtime can pack that input as the conv's im2col matrix instead
(``C*KH*KW`` channels per output pixel, pads at the input zero point) and the
conv becomes a 1x1 conv over those channels: the same integer sums in
``ceil(C*KH*KW / block)`` steps per pixel. It moves more bytes over DRAM, so the
fold is taken only when the schedule's cycle estimate says it wins (by the
``fold_min_gain`` option).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tir_schedules.kinds import recipe
from tir_schedules.options import current_options

from ..hw.config import HardwareConfig
from ..layers.ir import Conv2d, Layer, QTensor, Region


def fold_region_inputs(region: Region, cfg: HardwareConfig) -> tuple[Region, dict[str, dict]]:
    """The region with eligible convs folded, and {input name: im2col spec} for the runtime."""
    readers = region.readers()
    outputs = {t.name for t in region.outputs}
    inputs = {t.name for t in region.inputs}
    specs: dict[str, dict] = {}
    layers: list[Layer] = []
    for layer in region.layers:
        name = getattr(layer, "input", None) and layer.input.name
        if (isinstance(layer, Conv2d) and name in inputs and readers[name] == 1
                and name not in outputs and _worth_folding(layer, cfg)):
            folded = fold_conv(layer)
            specs[name] = im2col_spec(layer)
            layers.append(folded)
        else:
            layers.append(layer)
    if not specs:
        return region, {}
    new_inputs = [next((ly.input for ly in layers if isinstance(ly, Conv2d)
                        and ly.input.name == t.name), t) if t.name in specs else t
                  for t in region.inputs]
    return Region(region.name, new_inputs, list(region.outputs), layers), specs


def im2col_spec(layer: Conv2d) -> dict:
    return {"kernel": [int(v) for v in layer.weight.shape[2:]],
            "strides": [int(v) for v in layer.strides],
            "padding": [int(v) for v in layer.padding],
            "dilation": [int(v) for v in layer.dilation]}


def fold_conv(layer: Conv2d) -> Conv2d:
    """The equivalent 1x1 conv over the im2col channels ``(ki * KW + kj) * C + c``."""
    o, c, kh, kw = layer.weight.shape
    n, _, oh, ow = layer.output.shape
    x = layer.input
    folded_in = QTensor(x.name, (n, c * kh * kw, oh, ow), x.scale, x.zero_point)
    w = np.ascontiguousarray(layer.weight.transpose(0, 2, 3, 1).reshape(o, kh * kw * c, 1, 1))
    return replace(layer, input=folded_in, weight=w, strides=(1, 1), padding=(0, 0, 0, 0),
                   dilation=(1, 1))


def _worth_folding(layer: Conv2d, cfg: HardwareConfig) -> bool:
    o, c, kh, kw = layer.weight.shape
    if layer.groups != 1 or c % cfg.block_in == 0 or kh * kw == 1:
        return False  # no idle lanes to fill, or nothing to fold
    try:
        cycles = []
        for ly in (layer, fold_conv(layer)):
            r = recipe(ly, cfg, consts=False)
            cycles.append(r.kind.estimate(cfg, r.shape, r.kind.default(cfg, r.shape)))
    except ValueError:  # one of the two forms has no schedule: keep the layer as it is
        return False
    return cycles[1] * current_options().fold_min_gain < cycles[0]
