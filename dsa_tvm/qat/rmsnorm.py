"""RMSNorm as the DSA's [norm] unit runs it (``prepare(..., quantize_norms=True)`` or
``{"rms_norm"}``): ``relay_passes.kinds.rownorm``'s rms_norm, the decoders' norm.

Two forms are mirrored: ``nn.RMSNorm`` over the last axis, and a module of one's own whose
class name ends in ``RMSNorm`` (Hugging Face's ``LlamaRMSNorm``, ``Qwen2RMSNorm``, ...)
with a ``weight`` and an ``eps`` (or ``variance_epsilon``), traced as one node and kept
only if it computes ``x / sqrt(mean(x**2) + eps) * weight`` on a probe input (Gemma's
``(1 + weight)`` does not, and stays as it is, FP32). The forward value is
:func:`dsa_tvm.isa.intnorm.int_norm` without centring; the export writes ``x *
rsqrt(mean(x**2) + eps) * weight`` between Q/DQ pairs, the form the compiler folds.

``nn.RMSNorm`` has no ONNX export at opset 17 (``aten::rms_norm``); one that stays FP32 is
replaced by the same formula in plain ops (:class:`FloatRMSNorm`) so the model exports.
"""

from __future__ import annotations

import torch
from torch import fx, nn

from . import graph as G
from .layernorm import LayerNormLayer
from .layers import Grid


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float, dims: int = 1) -> torch.Tensor:
    """``x * rsqrt(mean(x**2) + eps) * weight`` over the last ``dims`` axes, in ops every
    exporter writes."""
    y = x * torch.rsqrt(x.pow(2).mean(tuple(range(-dims, 0)), keepdim=True) + eps)
    return y if weight is None else y * weight


def is_rms_norm_module(m: nn.Module) -> bool:
    """``nn.RMSNorm``, or a module of one's own named ``...RMSNorm`` with a weight and an
    eps: traced as one node, so :func:`rms_norm_params` can check what it computes."""
    if isinstance(m, nn.RMSNorm):
        return True
    # the registries, not getattr: while fx traces, a parameter read is a Proxy
    weight = m._parameters.get("weight", m._buffers.get("weight"))
    return type(m).__name__.endswith("RMSNorm") and isinstance(weight, torch.Tensor) and \
        _eps(m) is not None


def _eps(m: nn.Module) -> float | None:
    for name in ("eps", "variance_epsilon"):
        v = vars(m).get(name)
        if isinstance(v, (int, float)):
            return float(v)
    return None


def rms_norm_params(n: fx.Node, modules: dict[str, nn.Module]
                    ) -> tuple[torch.Tensor | None, float] | str | None:
    """(weight, eps) of an RMSNorm node over its input's last axis; the reason when the
    unit cannot run it; None when ``n`` is no RMSNorm."""
    m = G.module(n, modules)
    if m is None or not is_rms_norm_module(m) or len(n.args) != 1 or not G.is_tensor(n.args[0]):
        return None
    shape = tuple(n.args[0].meta["tensor_meta"].shape)
    if isinstance(m, nn.RMSNorm):
        if tuple(m.normalized_shape) != shape[-1:]:
            return (f"normalized_shape {tuple(m.normalized_shape)}: the [norm] unit "
                    f"normalizes the last axis only")
        eps = torch.finfo(torch.float32).eps if m.eps is None else float(m.eps)
        return m.weight, eps
    w, eps = m.weight, _eps(m)
    probe = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3
    with torch.no_grad():
        got = m(probe)
        if w.shape != shape[-1:] or not torch.allclose(got, rms(probe, w, eps), rtol=1e-4,
                                                       atol=1e-5):
            return (f"{type(m).__name__} does not compute x / sqrt(mean(x^2) + eps) * weight "
                    f"over the last axis (checked on a probe input); it runs as written")
    return w, eps


class RMSNormLayer(LayerNormLayer):
    """RMSNorm over the last axis with its own (trainable) gamma; no beta."""

    center = False

    def __init__(self, x: Grid, weight: torch.Tensor | None, eps: float, width: int,
                 method: str, symmetric: bool) -> None:
        super().__init__(x, weight, None, eps, width, method, symmetric)
        self.bias = None

    def float_op(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.weight, self.eps)


class FloatRMSNorm(nn.Module):
    """``nn.RMSNorm`` in exportable ops (FP32, on the host)."""

    def __init__(self, m: nn.RMSNorm) -> None:
        super().__init__()
        self.weight = None if m.weight is None else nn.Parameter(m.weight.detach().clone())
        self.eps = torch.finfo(torch.float32).eps if m.eps is None else float(m.eps)
        self.dims = len(m.normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.weight, self.eps, self.dims)
