"""Feature distillation: every integer layer's output matched to the FP32 network's.

With a few hundred unlabeled images, the logits alone are a thin signal: a run fits the
training crops' outputs and little else. Each weighted layer's output is a far richer
target (every channel at every position), as block-wise reconstruction (BRECQ, Li et
al., 2021) exploits. The FP32 targets come from a frozen copy of the prepared module in
``float`` mode, which is the FP32 network (batch norms folded), so the layers pair up by
name with no second trace.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .layers import set_mode
from .precision import weighted_layers


@contextmanager
def captured(module: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """While open, the dict holds each weighted layer's latest output, by layer name (the
    source module's path, as the reports name it)."""
    outs: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda m, _a, y: outs.__setitem__(m.name, y))
             for m in weighted_layers(module).values()]
    try:
        yield outs
    finally:
        for h in hooks:
            h.remove()


def fp32_copy(student: nn.Module) -> nn.Module:
    """A frozen copy of the prepared module computing the FP32 network (``float`` mode):
    the teacher of every layer's output, fixed before training moves the weights."""
    ref = copy.deepcopy(student).eval()
    set_mode(ref, "float")
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def feature_loss(student: dict[str, torch.Tensor], teacher: dict[str, torch.Tensor]
                 ) -> torch.Tensor:
    """The mean over layers of the squared error normalized by the FP32 output's mean
    square (1.0: no better than zeros; every layer counts alike, whatever its scale)."""
    terms = [((student[k] - t) ** 2).mean() / t.pow(2).mean().clamp_min(1e-12)
             for k, t in teacher.items() if k in student]
    return torch.stack(terms).mean() if terms else torch.zeros(())
