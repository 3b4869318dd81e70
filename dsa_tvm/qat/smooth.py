"""SmoothQuant-style scale migration for linear layers fed from FP32 (a transformer's
LayerNorm outputs).

A transformer's residual stream has a few input channels tens of times larger than the
rest; one per-tensor int8 grid over them leaves the other channels a handful of codes.
SmoothQuant (Xiao et al., 2023) divides each input channel c by ``s_c = max|x_c|**alpha /
max|w_c|**(1 - alpha)`` and multiplies the weights' column c by it: the product is
unchanged in real numbers, the activation grid gets even channels and the weights take
the range (they are per output channel anyway). Here the division is a :class:`Smooth`
node on the host (its producer is FP32 already: an elementwise multiply before the
quantize), the multiplication is folded into the layer's FP32 weights before
calibration, so the DSA runs exactly what the prepared module computes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from .errors import QatError


class Smooth(nn.Module):
    """``x * inv_scale`` over the last axis; records ``max|x|`` per channel while
    ``recording``. ``consumers`` are the weighted layers whose weights take the scales."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.register_buffer("inv_scale", torch.ones(channels))
        self.consumers: list[nn.Module] = []
        self.recording = False
        self.absmax: torch.Tensor | None = None
        self.done = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recording:
            m = x.detach().abs().reshape(-1, x.shape[-1]).amax(0)
            self.absmax = m if self.absmax is None else torch.maximum(self.absmax, m)
        return x * self.inv_scale


def check_alpha(alpha: float | None) -> None:
    if alpha is not None and not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise QatError(f"smooth={alpha!r}: the migration strength alpha lies in [0, 1] "
                       f"(SmoothQuant uses 0.5; None turns it off)")


def migration_scales(x_absmax: torch.Tensor, w_absmax: torch.Tensor, alpha: float
                     ) -> torch.Tensor:
    """SmoothQuant's per-channel ``s``; 1 where a channel saw no activation or weight."""
    s = x_absmax.clamp_min(1e-12) ** alpha / w_absmax.clamp_min(1e-12) ** (1.0 - alpha)
    live = (x_absmax > 0) & (w_absmax > 0)
    return torch.where(live, s.clamp(1e-4, 1e4), torch.ones_like(s))


def migrate(module: nn.Module, batches: Iterable[Sequence[torch.Tensor]], alpha: float) -> int:
    """Measure every new :class:`Smooth` node's input over ``batches`` (the module in FP32
    mode), then move its scales into its consumers' weights. Returns the nodes set; a node
    already set keeps its scales (calibrating again after pruning must not move them
    twice)."""
    todo = [m for m in module.modules() if isinstance(m, Smooth) and not m.done]
    if not todo:
        return 0
    for m in todo:
        m.recording, m.absmax = True, None
    with torch.no_grad():
        for args in batches:
            module(*args)
    for m in todo:
        m.recording = False
        w_absmax = torch.stack([c.weight.detach().abs().amax(0) for c in m.consumers]).amax(0)
        s = migration_scales(m.absmax, w_absmax, alpha)
        m.inv_scale.copy_(1.0 / s)
        for c in m.consumers:
            c.weight.data.mul_(s)
        m.done, m.absmax = True, None
    return len(todo)
