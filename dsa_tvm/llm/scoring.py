"""Scoring a quantized decoder against its FP32 reference token by token.

One 256-token perplexity moves by a few percent between schemes that are the same (its
paired standard error on SmolLM2 is about 0.027 nats, +-2.7%), so comparing schemes needs
the paired score: the mean increase of the negative log-likelihood over the same tokens,
with its standard error, and the mean KL divergence of the next-token distributions
(KL(FP32 || quantized)), which every position informs, not only the text's own next token.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .model import CompiledLLM


def window_log_probs(model: "CompiledLLM", ids: list[int]
                     ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per window of the largest context bucket (a fresh cache each): the next-token
    log-probabilities (tokens, vocab) of its tokens, the host's float log-softmax of the
    step's logits, and the tokens they predict. A generator, so a long text's perplexity
    holds one window's rows (2,048 x 49,152 float64 are 0.8 GB), not the text's."""
    window, seen = model.context_buckets[-1], False
    for w in range(0, len(ids), window):
        chunk = ids[w:w + window]
        if len(chunk) < 2:
            break
        z = model.prefill(chunk, model.new_cache())[0][:-1].astype(np.float64)
        z -= z.max(-1, keepdims=True)
        seen = True
        yield z - np.log(np.exp(z).sum(-1, keepdims=True)), np.asarray(chunk[1:])
    if not seen:
        raise ValueError("perplexity needs at least two tokens of text")


def log_probs(model: "CompiledLLM", ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`window_log_probs` of every window, joined."""
    rows, targets = zip(*window_log_probs(model, ids))
    return np.concatenate(rows), np.concatenate(targets)


def perplexity(model: "CompiledLLM", ids: list[int]) -> float:
    """exp(mean negative log-likelihood) of ``ids``, one window at a time."""
    nll, count = 0.0, 0
    for logp, t in window_log_probs(model, ids):
        nll -= float(logp[np.arange(len(t)), t].sum())
        count += len(t)
    return float(np.exp(nll / count))


def perplexity_of(logp: np.ndarray, targets: np.ndarray) -> float:
    """exp(mean negative log-likelihood) of ``targets`` under ``logp``."""
    return float(np.exp(-logp[np.arange(len(targets)), targets].mean()))


@dataclass(frozen=True)
class PairedScore:
    """A quantized model against FP32 on the same tokens."""

    ppl: float        # the quantized model's perplexity
    ppl_fp32: float
    dnll: float       # mean NLL increase per token (log of the perplexity ratio)
    dnll_se: float    # its standard error over tokens
    kl: float         # mean KL(FP32 || quantized) of the next-token distributions
    kl_se: float
    tokens: int

    def __str__(self) -> str:
        return (f"perplexity {self.ppl:.3f} ({self.ppl / self.ppl_fp32 - 1:+.1%} against FP32 "
                f"{self.ppl_fp32:.3f}; NLL +{self.dnll:.4f} +- {self.dnll_se:.4f} over "
                f"{self.tokens} tokens), KL {self.kl:.4f} +- {self.kl_se:.4f}")


def _se(v: np.ndarray) -> float:
    """Standard error of ``v``'s mean (NaN for one value)."""
    return float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def paired_score(quant: np.ndarray, ref: np.ndarray, targets: np.ndarray) -> PairedScore:
    """``quant`` and ``ref``: log-probabilities of the same positions (:func:`log_probs`)."""
    rows = np.arange(len(targets))
    d = ref[rows, targets] - quant[rows, targets]
    kl = (np.exp(ref) * (ref - quant)).sum(-1)
    return PairedScore(perplexity_of(quant, targets), perplexity_of(ref, targets),
                       float(d.mean()), _se(d), float(kl.mean()), _se(kl), len(d))
