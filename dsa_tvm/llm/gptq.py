"""GPTQ (Frantar et al., 2023): weight codes that compensate each other's rounding.

Rounding each weight to its nearest code (what the quantizer does) treats the weights
of one output channel as if their errors were independent. They are not: the channel's
output is ``sum_k w_k x_k`` and its inputs are correlated, so the error one rounding
leaves can be cancelled by the weights not yet rounded. GPTQ rounds one input column at
a time and spreads its error over the remaining columns in proportion to the inverse of
the inputs' second-moment matrix ``H = X^T X`` (collected from calibration text).

On SmolLM2 it does not lower W8A8's error (8-bit codes are fine already); at W4A8 it
takes the proxy's perplexity from +221% to +114% of FP32 (docs/llm.md), so ``load``
uses it for W4A8 by default.

The codes keep the quantizer's grid: one scale per output channel, ``max|w| / qmax``
of the weights as they are, and the weight holding that maximum keeps its code
(``+-qmax``), so writing the dequantized codes back into the FP32 model makes the
quantizer, which rounds to nearest on the same scales, produce exactly these codes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..quant.qparams import weight_qmax
from .smooth import LINEARS, linear_inputs

if TYPE_CHECKING:
    import torch

#: dampening added to H's diagonal, as a share of its mean. Calibrated on 1,024 tokens,
#: SmolLM2's layers kept 0.36-1.08 of nearest rounding's output error on held-out text
#: at the paper's 1%, 0.29-0.69 at 10% (8-bit codes, layers 0, 10, 20 and 29)
DAMP = 0.1
#: the default calibration: windows of pydoc's English text from this token on (the
#: benchmarks score perplexity on its first tokens; these are far from them)
TEXT_START, WINDOWS, WINDOW = 10_000, 8, 256
#: columns updated together (the paper's lazy batch updates; any size gives the same result)
BLOCK = 128


def default_texts(source) -> list[list[int]]:
    """GPTQ's default calibration: :data:`WINDOWS` windows of :data:`WINDOW` tokens of
    Python's bundled English text (``pydoc_data.topics``) from token :data:`TEXT_START`.
    GPTQ needs thousands of tokens (the step calibration's few hundred overfit)."""
    from .source import pydoc_text

    ids = source.encode(pydoc_text())[TEXT_START:TEXT_START + WINDOWS * WINDOW]
    return [ids[i:i + WINDOW] for i in range(0, len(ids), WINDOW)]


def input_moments(hf, texts: list[list[int]]) -> dict[str, "torch.Tensor"]:
    """Per linear layer (``"{i}.mlp.down_proj"``, ...), ``X^T X`` (float64) of its input
    rows over ``texts``' positions 1.. (position 0 is the host's FP32 sink token)."""
    def fold(so_far, rows):
        x = rows.double()
        return x.T @ x if so_far is None else so_far + x.T @ x

    return linear_inputs(hf, texts, fold, "GPTQ")


def gptq_codes(w: "torch.Tensor", h: "torch.Tensor", bits: int = 8,
               damp: float = DAMP) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(codes, scales) of ``w`` (out, in) on per-output-channel scales ``max|w| / qmax``,
    rounded by GPTQ against the input moments ``h`` (in, in), columns in order of
    decreasing ``h`` diagonal. Each channel's largest weight keeps its code ``+-qmax``,
    so the scales are those of the codes' own maximum."""
    import torch

    qmax = weight_qmax(bits)
    w = w.detach().double().clone()
    rows, cols = w.shape
    scale = (w.abs().amax(1) / qmax).clamp_min(1e-12)
    pinned = w.abs().argmax(1)                      # each row's largest weight
    pin_code = torch.sign(w[torch.arange(rows), pinned]) * qmax
    h = h.double().clone()
    dead = torch.diagonal(h) == 0                   # inputs never seen: nothing to balance
    h[dead, dead] = 1.0
    order = torch.argsort(torch.diagonal(h), descending=True)
    w, h = w[:, order], h[order][:, order]
    where = torch.empty_like(order)
    where[order] = torch.arange(cols)
    pin_col = where[pinned]                         # the pinned weights' permuted columns
    h += damp * torch.diagonal(h).mean() * torch.eye(cols, dtype=h.dtype)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.zeros_like(w)
    for b0 in range(0, cols, BLOCK):
        b1 = min(b0 + BLOCK, cols)
        wb, err = w[:, b0:b1].clone(), torch.zeros(rows, b1 - b0, dtype=w.dtype)
        for j in range(b1 - b0):
            c = b0 + j
            qc = torch.clamp(torch.round(wb[:, j] / scale), -qmax, qmax)
            pin = pin_col == c
            qc[pin] = pin_code[pin]
            q[:, c] = qc
            e = (wb[:, j] - qc * scale) / hinv[c, c]
            wb[:, j:] -= e[:, None] * hinv[c, c:b1][None, :]
            err[:, j] = e
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    return q[:, where], scale


def gptq_llama(hf, texts: list[list[int]], bits: int = 8,
               measure: bool = False) -> dict[str, float]:
    """Round every decoder linear layer of ``hf`` (in place: pass a copy) by GPTQ at
    ``bits`` on calibration ``texts`` and write the dequantized codes back as its FP32
    weights. lm_head (tied to the embeddings the host reads) is left alone. With
    ``measure``, returns each layer's output error on the calibration inputs relative to
    nearest rounding's (``tr(dW H dW^T)``; below 1 is better); it costs as much again as
    the rounding, so ``load`` does not ask for it."""
    import torch

    moments = input_moments(hf, texts)
    qmax = weight_qmax(bits)
    ratios = {}
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            for lin in LINEARS:
                mod, h = layer.get_submodule(lin), moments[f"{i}.{lin}"]
                w = mod.weight.detach().double()
                q, s = gptq_codes(w, h, bits)
                new = q * s[:, None]
                if measure:
                    near = torch.clamp(torch.round(w / s[:, None]), -qmax, qmax) * s[:, None]
                    ratios[f"{i}.{lin}"] = float(_output_error(w - new, h) /
                                                 max(_output_error(w - near, h), 1e-30))
                mod.weight.copy_(new.to(mod.weight.dtype))
    return ratios


def _output_error(dw: "torch.Tensor", h: "torch.Tensor") -> float:
    """``tr(dW H dW^T)``: the summed squared output error ``dW`` causes on the inputs."""
    return float(((dw @ h) * dw).sum())
