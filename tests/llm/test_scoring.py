"""``llm.scoring``: the paired score against numpy written out, the identities it must keep
(a model against itself scores zero; KL is never negative), the windows the perplexity
reads, and bad text refused."""

from __future__ import annotations

import numpy as np
import pytest

from dsa_tvm.llm.scoring import log_probs, paired_score, perplexity, perplexity_of


def _logp(rng, n: int, v: int) -> np.ndarray:
    z = rng.normal(0, 2, (n, v))
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_paired_score_against_numpy_written_out():
    rng = np.random.default_rng(0)
    ref, quant = _logp(rng, 50, 7), _logp(rng, 50, 7)
    t = rng.integers(0, 7, 50)
    s = paired_score(quant, ref, t)
    d = np.array([ref[i, t[i]] - quant[i, t[i]] for i in range(50)])
    kl = np.array([sum(np.exp(ref[i, j]) * (ref[i, j] - quant[i, j]) for j in range(7))
                   for i in range(50)])
    assert s.dnll == pytest.approx(d.mean()) and s.kl == pytest.approx(kl.mean())
    assert s.dnll_se == pytest.approx(d.std(ddof=1) / np.sqrt(50))
    assert s.ppl == pytest.approx(np.exp(-np.mean([quant[i, t[i]] for i in range(50)])))
    assert s.ppl / s.ppl_fp32 == pytest.approx(np.exp(s.dnll))
    assert (kl >= 0).all() and s.tokens == 50
    same = paired_score(ref, ref, t)
    assert same.dnll == 0 and same.kl == 0 and same.ppl == same.ppl_fp32
    assert "+0.0% against FP32" in str(same)
    assert np.isnan(paired_score(ref[:1], ref[:1], t[:1]).dnll_se)


class _Uniform:
    """A model whose every next-token distribution is uniform over ``v`` tokens, recording
    the windows it is asked to prefill."""

    context_buckets = (4,)

    def __init__(self, v: int) -> None:
        self.v, self.windows = v, []

    def new_cache(self):
        return None

    def prefill(self, chunk, cache):
        self.windows.append(list(chunk))
        return np.zeros((len(chunk), self.v), np.float32), None


def test_log_probs_reads_windows_of_the_largest_bucket():
    m = _Uniform(10)
    logp, targets = log_probs(m, list(range(10)))
    assert m.windows == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert targets.tolist() == [1, 2, 3, 5, 6, 7, 9]      # each window's own next tokens
    assert perplexity_of(logp, targets) == pytest.approx(10.0)
    assert perplexity(_Uniform(10), list(range(10))) == pytest.approx(10.0)
    for score in (log_probs, perplexity):
        with pytest.raises(ValueError, match="at least two tokens"):
            score(_Uniform(5), [3])
