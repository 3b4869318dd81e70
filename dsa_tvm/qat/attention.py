"""Attention's integer layers (``prepare(..., quantize_norms=True)``): the product of two
activations (``Q @ K^T``, ``P @ V``) and the softmax, as the DSA runs them.

- :class:`MatMulLayer` mirrors ``relay_passes.kinds.batch_matmul``: int8 x int8 codes
  summed exactly, ``sum (a - zp_a) * b`` (the second operand's zero point is 0, as PTQ
  plans attention's K and V, so the product can be made on the device), then REQUANT by
  ``s_a * s_b / s_out``.
- :class:`SoftmaxLayer` mirrors ``relay_passes.kinds.rownorm``'s softmax: the I-BERT
  integer softmax of :mod:`dsa_tvm.isa.intnorm` (the code the simulator runs) on the
  input's codes, out on PTQ's fixed grid of 1/256 (``quant.api.SOFTMAX_OUT``). Its input
  grid ignores an additive mask's values (``quant.observers.SoftmaxInputObserver``).

Gradients are straight through, as for every other layer: the forward value is the
integer result, the gradient that of the float op on the fake-quantized inputs.
"""

from __future__ import annotations

import numpy as np
import torch

from ..isa.intnorm import EXP_ZERO_SPAN, int_softmax, softmax_params
from ..quant.api import SOFTMAX_OUT
from ..quant.observers import MASKED, SoftmaxInputObserver, make_observer
from . import exact
from .errors import QatError
from .fake_quant import codes
from .layers import Grid, _Integer


class SoftmaxInputGrid(Grid):
    """A softmax input's grid: PTQ's observer for it, which keeps an attention mask's values
    from setting the range."""

    def __init__(self, method: str = "minmax", symmetric: bool = False) -> None:
        super().__init__(method, symmetric)
        self.reset()

    def reset(self) -> None:
        self.observer = SoftmaxInputObserver(make_observer(self.method), EXP_ZERO_SPAN)
        self.calibrated = False

    def observe(self, x: torch.Tensor) -> None:
        """As :meth:`Grid.observe`, but -inf is allowed: an attention mask's value."""
        inf = float("inf")
        super().observe(torch.nan_to_num(x, nan=float("nan"), posinf=inf, neginf=MASKED))

    def calibrate(self) -> None:
        try:
            super().calibrate()
        except ValueError as e:
            raise QatError(str(e)) from None


class FixedGrid(Grid):
    """A grid whose scale and zero point are set, not calibrated or learned (the softmax's
    output: probabilities in steps of 1/256)."""

    def __init__(self, scale: float, zero_point: int) -> None:
        super().__init__()
        self.base = torch.tensor(scale, dtype=torch.float32)
        self.zero_point = int(zero_point)
        self.calibrated = True

    def observe(self, x: torch.Tensor) -> None:
        pass

    def reset(self) -> None:
        pass

    def calibrate(self) -> None:
        self.gain.data.zero_()


class MatMulLayer(_Integer):
    """``a @ b`` of two int8 activations (attention's ``Q @ K^T``, ``P @ V``)."""

    def __init__(self, a: Grid, b: Grid, method: str, symmetric: bool) -> None:
        super().__init__([a, b], None, method, symmetric)
        b.symmetric = True   # zero point 0, as PTQ plans the second operand

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.settle(torch.matmul(a, b), lambda: self._codes(a, b))

    def _codes(self, a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
        ga, gb, g_out = self.inputs[0], self.inputs[1], self.out
        acc = exact.int_product(torch.matmul, codes(a, ga.scale), codes(b, gb.scale),
                                int(a.shape[-1]), exact.MAX_CENTRED)
        factor = np.array([ga.s * gb.s / g_out.s])
        return exact.output_stage(acc, 0, factor, g_out.zero_point, (-128, 127), -1)


class SoftmaxLayer(_Integer):
    """Softmax over the last axis, int8 codes in and out (the [norm] unit's row op)."""

    def __init__(self, x: Grid, method: str, symmetric: bool) -> None:
        super().__init__([x], None, method, symmetric)
        self.out = FixedGrid(SOFTMAX_OUT.scale, SOFTMAX_OUT.zero_point)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.settle(torch.softmax(x, dim=-1), lambda: self._codes(x))

    def _codes(self, x: torch.Tensor) -> np.ndarray:
        g_in, g_out = self.inputs[0], self.out
        p = softmax_params(g_in.s, g_out.s, g_out.zero_point)
        return int_softmax(g_in.centred(x) + g_in.zero_point, g_in.zero_point, p)
