"""LayerNorm as the DSA's [norm] unit runs it (``prepare(..., quantize_norms=True)``):
``relay_passes.kinds.rownorm``'s layer_norm, int8 codes in and out.

The forward value is :func:`dsa_tvm.isa.intnorm.int_norm` (exact integer row sums, a
table-and-Newton inverse square root, gamma and beta folded into integers by
``norm_params``: the code the simulator runs) on the input's codes; the gradient is that
of ``F.layer_norm`` on the fake-quantized input, so gamma and beta train. The export
writes ``LayerNormalization`` between Q/DQ pairs, the pattern the compiler folds.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..isa.intnorm import int_norm, norm_params
from .errors import QatError
from .layers import Grid, _Integer


def layer_norm_params(m: nn.Module, width: int) -> tuple[nn.Parameter | None,
                                                         nn.Parameter | None, float] | str:
    """(weight, bias, eps) of an ``nn.LayerNorm`` over the last axis of ``width``; the reason
    when the unit cannot run it."""
    shape = tuple(m.normalized_shape)
    if shape != (width,):
        return f"normalized_shape {shape}: the [norm] unit normalizes the last axis only"
    return m.weight, m.bias, float(m.eps)


class LayerNormLayer(_Integer):
    """LayerNorm over the last axis with its own gamma and beta (trainable)."""

    def __init__(self, x: Grid, weight: torch.Tensor | None, bias: torch.Tensor | None,
                 eps: float, width: int, method: str, symmetric: bool) -> None:
        super().__init__([x], None, method, symmetric)
        self.weight = nn.Parameter(torch.ones(width) if weight is None
                                   else weight.detach().clone().float())
        self.bias = nn.Parameter(torch.zeros(width) if bias is None
                                 else bias.detach().clone().float())
        self.eps = eps
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, (self.width,), self.weight, self.bias, self.eps)
        return self.settle(y, lambda: self._codes(x))

    def _codes(self, x: torch.Tensor) -> np.ndarray:
        g_in, g_out = self.inputs[0], self.out
        try:   # eps as the export writes it (ONNX's float32 attribute), which the compiler folds
            p = norm_params(self.width, g_in.s, float(np.float32(self.eps)),
                            self.weight.detach().numpy(), self.bias.detach().numpy(), g_out.s,
                            g_out.zero_point, True)
        except ValueError as e:
            raise QatError(f"layer {self.name}: {e}; the [norm] unit cannot fold it (prepare "
                           f"without quantize_norms to keep LayerNorm in FP32)") from None
        return int_norm(g_in.centred(x) + g_in.zero_point, g_in.zero_point, p)
