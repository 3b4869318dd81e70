"""What a prepared module's quantization becomes in ONNX: QuantizeLinear/DequantizeLinear.

Each function returns its first argument's values in PyTorch and, under the TorchScript
ONNX exporter, writes the QDQ nodes the compiler reads: a constant's integer codes with
their scales (weights: int8 per output channel; biases: int32 at input x weight scale),
or an activation's Q/DQ pair. The codes go in as given, never recomputed from floats, so
the exported model holds exactly the integers the forward pass used.
"""

from __future__ import annotations

import torch


class _DequantizedConstant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, value, codes, scale, zero_point, axis: int):  # noqa: ARG004
        return value.clone()

    @staticmethod
    def symbolic(g, value, codes, scale, zero_point, axis: int):  # noqa: ARG004
        return g.op("DequantizeLinear", codes, scale, zero_point, axis_i=axis)


class _QuantDequant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, zero_point):
        info = torch.iinfo(zero_point.dtype)
        return torch.fake_quantize_per_tensor_affine(x, float(scale), int(zero_point), info.min,
                                                     info.max)

    @staticmethod
    def symbolic(g, x, scale, zero_point):
        q = g.op("QuantizeLinear", x, scale, zero_point)
        return g.op("DequantizeLinear", q, scale, zero_point)


def dequantized_constant(codes: torch.Tensor, scale: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """``codes * scale`` (per slice along ``axis``), exported as DequantizeLinear of the
    integer ``codes`` (int8 or int32, zero point 0)."""
    shape = [1] * codes.dim()
    if scale.numel() > 1:
        shape[axis] = -1
    value = codes.to(torch.float32) * scale.reshape(shape)
    zp = torch.zeros(scale.shape, dtype=codes.dtype)
    return _DequantizedConstant.apply(value, codes, scale, zp, axis)


def quant_dequant(x: torch.Tensor, scale: float, zero_point: int, bits: int = 8) -> torch.Tensor:
    """An activation on its int8 (``bits`` 16: int16) grid, exported as QuantizeLinear ->
    DequantizeLinear (the zero point's type is the codes')."""
    dtype = torch.int16 if bits == 16 else torch.int8
    return _QuantDequant.apply(x, torch.tensor(scale, dtype=torch.float32),
                               torch.tensor(zero_point, dtype=dtype))
