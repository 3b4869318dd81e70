"""A linear layer or a pointwise conv with per-group weight grids
(``prepare(..., weight_group=32)``): the DSA's grouped dense (``layers.group_grid``: a
scale and an offset per group of input rows, GGUF Q4_1's form) inside the forward pass.

Each step the weights are rounded onto their groups' grids (minimum to maximum, as
``quantize_onnx(..., weight_group=...)`` rounds them), straight through for the
gradients. The exact value is the compiler's own: the grid it will find in the exported
float32 weights (``find_grid``), the integer layer it will build from it
(``group_grid.grouped_dense``) and that layer's reference arithmetic
(``tir_schedules.kinds.grouped_dense.run_grouped_dense``), so the exported model on the
DSA gives the prepared module's codes. The export writes the weight as a float32
constant on its grid and the bias as a float add: a QDQ graph cannot carry an offset per
group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from tir_schedules.kinds.grouped_dense import run_grouped_dense

from ..layers.group_grid import GRID_GROUPS, GroupGrid, find_grid, group_grid, grouped_dense
from ..layers.ir import QTensor
from .errors import NonFiniteError, QatError
from .fake_quant import activation, straight_through

if TYPE_CHECKING:
    from .layers import WeightedLayer


def check_group(group: int) -> None:
    if group and group not in GRID_GROUPS:
        raise QatError(f"weight_group={group!r}: the DSA's grouped dense takes groups of "
                       f"{', '.join(map(str, sorted(GRID_GROUPS)))} input rows (or 0: per channel)")


def pointwise(layer: "WeightedLayer") -> bool:
    """A 1x1 convolution that is a dense over the image's pixels (stride 1, no padding,
    groups 1): the compiler runs it as the grouped dense on the image itself."""
    c = layer.conv
    pad = c.get("padding", 0)
    no_pad = pad in ("valid", "same") if isinstance(pad, str) else _pair(pad) == (0, 0)
    return (layer.kind == "conv2d" and tuple(layer.weight.shape[2:]) == (1, 1)
            and layer.pad is None and int(c.get("groups", 1)) == 1 and no_pad
            and _pair(c.get("stride", 1)) == (1, 1))


def fits(layer: "WeightedLayer", group: int) -> bool:
    """A linear layer or a pointwise conv whose input rows (channels) split into whole
    groups."""
    k = layer.weight.shape[1]
    return (layer.kind == "linear" or pointwise(layer)) and k >= group and k % group == 0


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else tuple(int(d) for d in v)


def _flat_weights(layer: "WeightedLayer") -> np.ndarray:
    w = layer.masked_weight().detach().numpy().astype(np.float64)
    if not np.isfinite(w).all():
        raise NonFiniteError(f"layer {layer.name}: weights became NaN or infinite (learning "
                             f"rate too high? lower lr)")
    return w.reshape(w.shape[0], -1)   # a pointwise conv's (O, I, 1, 1) as [N, K]


def weight_values(layer: "WeightedLayer") -> np.ndarray:
    """The weights on their groups' grids, [N, K] float32 (what the export writes):
    nearest, or the learned rounding (``round_up``, :func:`rounding_base`)."""
    if layer.round_up is None:
        return group_grid(_flat_weights(layer), layer.group, layer.bits).values().astype(
            np.float32)
    base, step, offset, (lo, hi), free = rounding_base(layer)
    up = layer.round_up.numpy().reshape(base.shape) & free
    codes = np.clip(base + up, lo, hi)
    return (step * codes + offset).astype(np.float32)


def rounding_base(layer: "WeightedLayer") -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   tuple[int, int], np.ndarray]:
    """What learned rounding (``qat.adaround``) chooses on: per weight [N, K], the code
    below it on its group's nearest-rounding grid, that grid's step and offset, the codes'
    range, and which weights may round up. Each group's smallest and largest weight keep
    the grid's end codes (a constant group its one code), so every group still spans its
    whole grid and ``find_grid`` finds that grid in the export, as for nearest rounding."""
    w = _flat_weights(layer)
    grid = group_grid(w, layer.group, layer.bits)
    n, k = w.shape
    rep = lambda a: np.repeat(a, layer.group, axis=1)[:, :k]  # noqa: E731
    step, offset = rep(grid.step), rep(grid.offset)
    pad = np.full((n, grid.step.shape[1] * layer.group), np.nan)
    pad[:, :k] = w
    blocks = pad.reshape(n, -1, layer.group)
    w_lo, w_hi = rep(np.nanmin(blocks, axis=2)), rep(np.nanmax(blocks, axis=2))
    half = 2 ** (layer.bits - 1)
    safe = np.where(step > 0, step, 1.0)
    free = (step > 0) & (w != w_lo) & (w != w_hi)
    # a weight on the grid stays on its code; the pinned ones keep their nearest codes
    base = np.where(free, np.floor((w - offset) / safe + 1e-9), grid.codes)
    return base, step, offset, (-half, half - 1), free


def compiler_grid(layer: "WeightedLayer", values: np.ndarray) -> GroupGrid:
    """The grid the compiler finds in the exported weight (``find_grid``)."""
    grid = find_grid(values)
    if grid is None:
        raise QatError(f"layer {layer.name}: its rounded weights lie on no grid the compiler "
                       f"finds (groups of {layer.group}, {layer.bits} bits)")
    return grid


def forward(layer: "WeightedLayer", x: torch.Tensor) -> torch.Tensor:
    """Quant mode: the DSA's codes, dequantized, with fake quantization's gradients;
    export mode: MatMul with the float32 grid weight (+ a float bias), quantized."""
    values = weight_values(layer)
    bias = layer.quant_bias()
    conv = layer.kind == "conv2d"
    if layer.mode == "export":
        if conv:   # Conv with the float32 grid weight and bias: the compiler's grouped 1x1
            w = torch.from_numpy(values.reshape(tuple(layer.weight.shape)))
            b = None if bias is None else bias.detach().clone()
            return layer.out.quantize(activation(F.conv2d(x, w, b), layer.act))
        y = torch.matmul(x, torch.from_numpy(np.ascontiguousarray(values.T)))
        if bias is not None:
            y = y + bias.detach().clone()
        return layer.out.quantize(activation(y, layer.act))
    w_fq = straight_through(layer.masked_weight(),
                            torch.from_numpy(values).reshape(layer.weight.shape))
    y = F.conv2d(x, w_fq, bias) if conv else F.linear(x, w_fq, bias)
    approx = layer.out.quantize(activation(y, layer.act))
    if conv:       # the image's pixels are the grouped dense's rows
        rows = x.permute(0, 2, 3, 1)
        exact = _exact(layer, rows, compiler_grid(layer, values), bias)
        return straight_through(approx, exact.permute(0, 3, 1, 2))
    return straight_through(approx, _exact(layer, x, compiler_grid(layer, values), bias))


def _exact(layer: "WeightedLayer", x: torch.Tensor, grid: GroupGrid,
           bias: torch.Tensor | None) -> torch.Tensor:
    g_in, g_out = layer.inputs[0], layer.out
    k, n = grid.codes.shape[1], grid.codes.shape[0]
    q_in = (g_in.centred(x) + g_in.zero_point).reshape(-1, k)
    rows = q_in.shape[0]
    b = None if bias is None else bias.detach().numpy().astype(np.float32).astype(np.float64)
    ly = grouped_dense(layer.name or "layer", QTensor("x", (rows, k), g_in.s, g_in.zero_point),
                       QTensor("y", (rows, n), g_out.s, g_out.zero_point), grid, b,
                       g_out.bounds(layer.act))
    q = run_grouped_dense(ly, {"x": q_in})
    return g_out.dequantize(q.reshape(tuple(x.shape[:-1]) + (n,)))
