"""Fake quantization with straight-through gradients, on the DSA's grids.

Values stay float tensors that lie exactly on an int8 grid, ``s * (q - zp)``, as
ONNX's QuantizeLinear/DequantizeLinear pair would leave them: ``q = clamp(
round_half_even(x / s) + zp, qmin, qmax)``. The gradient passes straight through
inside the grid's range and stops outside it (the clamp); the scale, when learned,
gets LSQ's gradient (Esser et al., 2020), scaled by ``1 / sqrt(numel * qmax)``.
"""

from __future__ import annotations

import math

import torch


class _FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor, zero_point: int, qmin: int,
                qmax: int) -> torch.Tensor:
        v = x / scale
        r = torch.round(v)
        q = torch.clamp(r + zero_point, qmin, qmax)
        ctx.save_for_backward(v, r)
        ctx.bounds = (qmin - zero_point, qmax - zero_point)
        ctx.scale_shape = scale.shape
        return (q - zero_point) * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        v, r = ctx.saved_tensors
        lo, hi = ctx.bounds
        inside = (r >= lo) & (r <= hi)
        gx = grad * inside
        gs = None
        if ctx.needs_input_grad[1]:
            step = torch.where(inside, r - v, torch.where(r < lo, float(lo), float(hi)))
            g = grad * step / math.sqrt(max(v.numel(), 1) * max(hi, 1))
            gs = g.sum_to_size(ctx.scale_shape)
        return gx, gs, None, None, None


def fake_quant(x: torch.Tensor, scale: torch.Tensor, zero_point: int = 0, qmin: int = -128,
               qmax: int = 127) -> torch.Tensor:
    """``s * (clamp(round(x / s) + zp, qmin, qmax) - zp)`` with straight-through gradients
    (and LSQ's to ``scale`` when it requires grad). ``scale`` broadcasts against ``x``."""
    return _FakeQuant.apply(x, scale, int(zero_point), int(qmin), int(qmax))


def codes(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The centred integer codes ``q - zp`` of values on a grid of ``scale`` (exact: the
    quotient lies within float32's rounding of an integer below 2**9)."""
    return torch.round(x.detach() / scale.detach())


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
        ctx.approx_shape, ctx.approx_dtype = approx.shape, approx.dtype
        shape = torch.broadcast_shapes(approx.shape, exact.shape)
        dtype = torch.promote_types(approx.dtype, exact.dtype)
        return exact.detach().to(dtype).expand(shape).clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.sum_to_size(ctx.approx_shape).to(ctx.approx_dtype), None


def straight_through(approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``exact``'s values, bit for bit, with ``approx``'s gradient: the forward pass is the
    integer one, the backward pass the fake-quantized float one. (Not ``approx + (exact -
    approx).detach()``: that sum rounds, one ulp off ``exact`` where the two differ, and
    the DSA's outputs are ``exact``.)"""
    return _StraightThrough.apply(approx, exact)


def activation(y: torch.Tensor, act: tuple[float, float] | None) -> torch.Tensor:
    """A fused ReLU / Clip (``act``: its bounds, the upper one possibly infinite)."""
    if act is None:
        return y
    lo, hi = act
    return torch.clamp(y, min=lo, max=None if math.isinf(hi) else hi)
