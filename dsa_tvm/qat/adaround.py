"""Learned weight rounding (AdaRound, Nagel et al., 2020) on the DSA's weight grids.

Rounding every weight to its nearest code is what PTQ does, and at 4 bits it is far from
the best choice: the errors of a channel's weights add up in its output, and rounding
some of them the other way cancels much of the sum. AdaRound learns, one layer at a time,
whether each weight rounds down or up (``floor(w / s) + h``, ``h`` relaxed to a rectified
sigmoid and pushed to 0 or 1 by an annealed regularizer) so the layer's output on real
inputs matches the FP32 network's. The inputs are the quantized module's own (earlier
layers already rounded, activations on their grids), the target the FP32 network's
output, so a layer also learns to absorb what came before it (BRECQ's and QDrop's
asymmetric reconstruction).

The choice is stored on the layer (``WeightedLayer.round_up``); the FP32 weights stay, so
the prepared module's ``float`` mode is still the FP32 network and QAT can train on.
Only the codes change: the scales, the requantize and export are as before, and the
compiled model reproduces the prepared module bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from ..quant.calibrate import progress
from ..quant.qparams import weight_qmax
from . import grouped
from .errors import QatError
from .layers import WeightedLayer, set_mode
from .precision import weighted_layers
from .sparse_refit import check_batches, forward_order

Batch = tuple[torch.Tensor, ...]
ZETA, GAMMA = 1.1, -0.1   # the rectified sigmoid's stretch (the paper's values)


class _Stop(Exception):
    """Raised by a capture hook once the layer's input is seen: the rest need not run."""


@dataclass
class LayerRounding:
    name: str
    bits: int
    error_nearest: float   # output MSE / FP32 output mean square, nearest rounding
    error_learned: float   # the same with the learned rounding
    flipped: float         # share of weights rounded away from their nearest code
    seconds: tuple[float, float] = (0.0, 0.0)   # capturing the inputs, learning


@dataclass
class RoundingReport:
    layers: list[LayerRounding] = field(default_factory=list)

    def summary(self) -> str:
        if not self.layers:
            return "no layer rounded"
        a = np.mean([r.error_nearest for r in self.layers])
        b = np.mean([r.error_learned for r in self.layers])
        return (f"{len(self.layers)} layers: relative output error {a:.4f} (nearest) -> "
                f"{b:.4f} (learned), mean over layers")


def _inputs_of(module: nn.Module, layer: WeightedLayer, batches: Sequence[Batch],
               mode: str) -> torch.Tensor:
    """``layer``'s input over ``batches`` with the module in ``mode`` (stops each pass
    at the layer)."""
    seen: list[torch.Tensor] = []

    def hook(_m, args):
        seen.append(args[0].detach())
        raise _Stop

    h = layer.register_forward_pre_hook(hook)
    set_mode(module, mode)
    try:
        with torch.no_grad():
            for b in batches:
                try:
                    module(*b)
                except _Stop:
                    pass
    finally:
        h.remove()
        set_mode(module, "quant")
    if not seen:
        raise QatError(f"layer {layer.name} never ran on the given batches; pass inputs that "
                       f"reach it")
    return torch.cat(seen)


def _soft(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def _grid_of(layer: WeightedLayer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                              tuple[int, int], torch.Tensor]:
    """(codes below each weight, step, offset, code range, which weights may round up),
    in the weight's shape: ``weight = step * code + offset``, per channel (offset 0) or
    per group of a grouped layer's grid."""
    w = layer.masked_weight().detach().double()
    if layer.group:
        base, step, offset, limits, free = grouped.rounding_base(layer)
        as_w = lambda a: torch.from_numpy(np.ascontiguousarray(a)).reshape(w.shape)  # noqa: E731
        return as_w(base), as_w(step), as_w(offset), limits, as_w(free)
    shape = (-1,) + (1,) * (w.dim() - 1)
    s = torch.from_numpy(layer.quant_params()[0].astype(np.float64)).reshape(shape)
    qmax = weight_qmax(layer.bits)
    return (torch.floor(w / s), s.expand_as(w), torch.zeros_like(w), (-qmax, qmax),
            torch.ones_like(w, dtype=torch.bool))


def _round_layer(layer: WeightedLayer, xq: torch.Tensor, xf: torch.Tensor, iters: int,
                 batch: int, lr: float, reg: float, gen: torch.Generator) -> LayerRounding:
    w = layer.masked_weight().detach().double()
    base, s, offset, (lo, hi), free = _grid_of(layer)
    frac = ((w - offset) / torch.where(s > 0, s, 1.0) - base).clamp(1e-4, 1 - 1e-4)
    # h(v) starts at the fraction: the soft weight starts at the FP32 weight
    v = nn.Parameter(-torch.log((ZETA - GAMMA) / (frac - GAMMA) - 1).float())
    keep = free.clone()   # pruned and side-path weights stay 0, a group's ends stay put
    if layer.mask is not None:
        keep &= layer.mask.bool()
    if layer.side_rows is not None:
        keep = keep.index_fill(0, layer.side_rows, False)
    b = None if layer.bias is None else layer.bias.detach()
    s32, base32, keep32, off32 = s.float(), base.float(), keep.float(), offset.float()
    with torch.no_grad():
        target = layer._op(xf, layer.masked_weight().detach(), b)
    norm = target.pow(2).mean().clamp_min(1e-12)

    def weights(h: torch.Tensor) -> torch.Tensor:
        return s32 * torch.clamp(base32 + h * keep32, lo, hi) + off32

    def error(h: torch.Tensor, rows: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        return (layer._op(xq[rows], weights(h), b) - target[rows]).pow(2).mean() / norm

    with torch.no_grad():
        nearest = (frac >= 0.5).float()
        err_nearest = float(error(nearest))
    opt = torch.optim.Adam([v], lr=lr)
    warm = iters // 5
    for i in range(iters):
        rows = torch.randint(len(xq), (min(batch, len(xq)),), generator=gen)
        h = _soft(v)
        loss = error(h, rows)
        if i >= warm:   # beta anneals 20 -> 2: early, only h far from 0/1 pays
            beta = 2 + 18 * (1 - (i - warm) / max(iters - warm, 1))
            loss = loss + reg * (1 - (2 * h - 1).abs().pow(beta)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        up = (v.detach() >= 0) & keep.bool()   # h >= 0.5
        err_learned = float(error(up.float()))
    if err_learned < err_nearest:
        layer.round_up = up
        flipped = float((up.float() != nearest * keep32).float().mean())
    else:   # the search did not beat nearest rounding: keep it
        err_learned, flipped = err_nearest, 0.0
    return LayerRounding(layer.name, layer.bits, err_nearest, err_learned, flipped)


def adaround(module: nn.Module, batches: Sequence[Batch], *, bits: Sequence[int] = (4,),
             iters: int = 150, batch_size: int = 8, lr: float = 5e-2, reg: float = 0.01,
             seed: int = 0, show_progress: bool = True) -> RoundingReport:
    """Learn each weighted layer's rounding (layers whose width is in ``bits``; 4 by
    default: at 8 bits nearest rounding is already close) on ``batches`` (unlabeled
    inputs, e.g. the calibration set), in forward order. A layer keeps nearest rounding
    where the learned one does not lower its output error. Run it after choosing widths
    (``choose_bits``, ``set_bits``), pruning and calibration, before ``distill``: changing
    a layer's width, clip or mask afterwards drops its learned rounding."""
    batches = [b if isinstance(b, tuple) else (b,) for b in batches]
    if not batches:
        raise QatError("adaround needs at least one batch of inputs (e.g. the calibration "
                       "data)")
    if iters < 1 or batch_size < 1:
        raise QatError(f"iters={iters!r}, batch_size={batch_size!r}: pass whole numbers >= 1")
    check_batches(batches)
    layers = weighted_layers(module)
    try:
        order = forward_order(module, batches[0], layers)
    except (RuntimeError, TypeError, ValueError) as e:
        raise QatError(f"the module does not run on the given batches ({type(e).__name__}: "
                       f"{e}); pass inputs shaped as prepare's example inputs") from None
    names = [n for n in order if layers[n].bits in bits]
    gen = torch.Generator().manual_seed(seed)
    report = RoundingReport()
    was_training = module.training
    module.eval()
    try:
        for name in progress(names, len(names), "adaround", show_progress):
            layer = layers[name]
            layer.round_up = None
            layer.rederive_bias_correction()
            t0 = time.perf_counter()
            xq = _inputs_of(module, layer, batches, "quant")
            xf = _inputs_of(module, layer, batches, "float")
            t1 = time.perf_counter()
            r = _round_layer(layer, xq, xf, iters, batch_size, lr, reg, gen)
            report.layers.append(replace(r, seconds=(t1 - t0, time.perf_counter() - t1)))
            layer.rederive_bias_correction()   # the mean error left by the chosen codes
    finally:
        module.train(was_training)
        set_mode(module, "quant")
    return report
