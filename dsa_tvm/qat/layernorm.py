"""LayerNorm as the DSA's [norm] unit runs it (``prepare(..., quantize_norms=True)``):
``relay_passes.kinds.rownorm``'s layer_norm, int8 codes in and out.

The forward value is :func:`dsa_tvm.isa.intnorm.int_norm` (exact integer row sums, a
table-and-Newton inverse square root, gamma and beta folded into integers by
``norm_params``: the code the simulator runs) on the input's codes, int8 or int16 in and out
(the unit's ``in_wide``/``out_wide``, ``prepare(..., wide_norms=True)``); the gradient is that
of ``F.layer_norm`` on the fake-quantized input, so gamma and beta train. The export
writes ``LayerNormalization`` between Q/DQ pairs, the pattern the compiler folds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx, nn

from ..isa.intnorm import int_norm, norm_params
from . import graph as G
from .errors import QatError
from .layers import Grid, _Integer


def layer_norm_params(n: fx.Node, modules: dict[str, nn.Module], attr: Callable[[Any], Any]
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None, float] | str | None:
    """(weight, bias, eps) of a LayerNorm node over its input's last axis (``nn.LayerNorm``,
    or onnx2torch's ``OnnxLayerNorm`` with constant scale and bias); the reason when the
    unit cannot run it; None when ``n`` is no LayerNorm."""
    m = G.module(n, modules)
    if not (n.args and G.is_tensor(n.args[0])):
        return None
    shape = tuple(n.args[0].meta["tensor_meta"].shape)
    if isinstance(m, nn.LayerNorm) and len(n.args) == 1:
        if tuple(m.normalized_shape) != shape[-1:]:
            return (f"normalized_shape {tuple(m.normalized_shape)}: the [norm] unit "
                    f"normalizes the last axis only")
        return m.weight, m.bias, float(m.eps)
    if G.onnx_kind(n, modules) != "OnnxLayerNorm":
        return None
    if m.axis % len(shape) != len(shape) - 1:
        return f"axis {m.axis} of rank {len(shape)}: the [norm] unit normalizes the last axis only"
    params = [attr(a) for a in n.args[1:3]]
    if not all(isinstance(t, torch.Tensor) and t.numel() == shape[-1] for t in params):
        return "scale or bias computed at run time: the [norm] unit folds constant ones"
    return params[0], params[1] if len(params) > 1 else None, float(m.epsilon)


class LayerNormLayer(_Integer):
    """LayerNorm over the last axis with its own gamma and beta (trainable)."""

    center = True   # False: RMSNorm (:mod:`.rmsnorm`)

    def __init__(self, x: Grid, weight: torch.Tensor | None, bias: torch.Tensor | None,
                 eps: float, width: int, method: str, symmetric: bool) -> None:
        super().__init__([x], None, method, symmetric)
        self.weight = nn.Parameter(torch.ones(width) if weight is None
                                   else weight.detach().clone().float())
        self.bias = nn.Parameter(torch.zeros(width) if bias is None
                                 else bias.detach().clone().float())
        self.eps = eps
        self.width = width

    def float_op(self, x: torch.Tensor) -> torch.Tensor:
        """The float op (calibration, the gradient, the export's ops)."""
        return F.layer_norm(x, (self.width,), self.weight, self.bias, self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.settle(self.float_op(x), lambda: self._codes(x))

    def _codes(self, x: torch.Tensor) -> np.ndarray:
        g_in, g_out = self.inputs[0], self.out
        beta = None if self.bias is None else self.bias.detach().numpy()
        try:   # eps as the export writes it (a float32 constant), which the compiler folds
            p = norm_params(self.width, g_in.s, float(np.float32(self.eps)),
                            self.weight.detach().numpy(), beta, g_out.s, g_out.zero_point,
                            self.center, g_out.wide)
        except ValueError as e:
            raise QatError(f"layer {self.name}: {e}; the [norm] unit cannot fold it (prepare "
                           f"without quantize_norms to keep the norm in FP32)") from None
        return int_norm(g_in.centred(x) + g_in.zero_point, g_in.zero_point, p, g_out.wide)
