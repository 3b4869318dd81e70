"""GPTQ weight rounding for the decoder's linear layers (``dsa_tvm.llm.gptq``).

The codes must cut the output error nearest rounding leaves on correlated inputs (and
equal nearest rounding where the inputs are uncorrelated: nothing to balance), keep the
quantizer's grid so its own nearest rounding of the written-back weights gives exactly
these codes, and the quantized steps must come from the rounded copy while the FP32
reference stays the original.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dsa_tvm.llm import load  # noqa: E402
from dsa_tvm.llm.gptq import gptq_codes, gptq_llama, input_moments  # noqa: E402
from dsa_tvm.llm.source import tiny_llama  # noqa: E402
from dsa_tvm.quant.qparams import quantize_weight, weight_qmax, weight_qparams  # noqa: E402

BUCKETS = dict(context_buckets=(16, 64), prefill_buckets=(16,))
TEXTS = [list(b"The capital of France is Paris, known for its food and its museums."),
         list(b"def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)")]


def _inputs(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Correlated inputs with a few outlier channels, as a decoder's linear layers see."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64) @ mix / cols ** 0.5
    x[:, :3] *= 10.0
    return x


def _error(w: torch.Tensor, q: torch.Tensor, s: torch.Tensor, x: torch.Tensor) -> float:
    return float(((x @ (w - q * s[:, None]).T) ** 2).sum())


def _nearest(w: torch.Tensor, s: torch.Tensor, bits: int) -> torch.Tensor:
    qmax = weight_qmax(bits)
    return torch.clamp(torch.round(w / s[:, None]), -qmax, qmax)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", [(24, 64), (64, 200), (7, 300)])
def test_codes_cut_the_output_error_on_seen_and_held_out_inputs(bits, shape):
    out, cols = shape
    w = torch.randn(out, cols, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64) * 0.05
    x, held = _inputs(4 * cols, cols, 0), _inputs(4 * cols, cols, 1)
    q, s = gptq_codes(w, x.T @ x, bits)
    near = _nearest(w, s, bits)
    assert _error(w, q, s, x) < 0.7 * _error(w, near, s, x)
    assert _error(w, q, s, held) < 0.85 * _error(w, near, s, held)
    qmax = weight_qmax(bits)
    assert q.abs().max() <= qmax and torch.equal(q, torch.round(q))
    # each row keeps its largest weight's code, so the scales are the codes' own
    assert torch.equal(q.abs().amax(1), torch.full((out,), float(qmax), dtype=q.dtype))
    torch.testing.assert_close(s, w.abs().amax(1) / qmax)


def test_uncorrelated_inputs_give_nearest_rounding():
    """With a diagonal H no column can cancel another's error: GPTQ is nearest rounding."""
    w = torch.randn(16, 40, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    h = torch.diag(torch.rand(40, generator=torch.Generator().manual_seed(5),
                              dtype=torch.float64) + 0.1)
    for bits in (8, 4):
        q, s = gptq_codes(w, h, bits)
        assert torch.equal(q, _nearest(w, s, bits))


def test_a_dead_input_channel_is_no_error():
    w = torch.randn(8, 32, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    x = _inputs(128, 32, 2)
    x[:, 5] = 0.0
    q, s = gptq_codes(w, x.T @ x, 8)
    assert torch.isfinite(q).all() and q.abs().max() <= 127


@pytest.mark.parametrize("bits", [8, 4])
def test_the_quantizer_rounds_the_written_back_weights_to_the_same_codes(bits):
    hf = tiny_llama(0)
    want = {}
    moments = input_moments(hf, TEXTS)
    for i, layer in enumerate(hf.model.layers):
        want[i] = gptq_codes(layer.self_attn.q_proj.weight, moments[f"{i}.self_attn.q_proj"],
                             bits)[0]
    ratios = gptq_llama(hf, TEXTS, bits, measure=True)
    assert len(ratios) == 7 * len(hf.model.layers)
    assert all(r <= 1.0 + 1e-9 for r in ratios.values())
    assert np.mean(list(ratios.values())) < 0.9
    for i, layer in enumerate(hf.model.layers):
        for lin in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
            w = layer.get_submodule(lin).weight.detach().numpy()
            codes = quantize_weight(w, weight_qparams(w, 0, bits), 0, bits)
            if lin == "self_attn.q_proj":
                np.testing.assert_array_equal(codes, want[i].numpy())
            # on the grid: every weight is its code times its row's scale (to float32)
            np.testing.assert_allclose(w, codes * weight_qparams(w, 0, bits)[:, None],
                                       rtol=2e-7, atol=0)


def test_the_steps_come_from_the_rounded_copy_and_fp32_from_the_original():
    model = load("tiny", gptq=True, **BUCKETS)
    hf_before = {n: p.detach().clone() for n, p in model.hf.named_parameters()}
    rounded = model.step_model
    assert rounded is not model.hf and rounded is model.step_model
    for n, p in model.hf.named_parameters():
        assert torch.equal(p, hf_before[n]), n
    w = rounded.model.layers[0].mlp.down_proj.weight.detach().numpy()
    s = weight_qparams(w, 0, 8)
    np.testing.assert_allclose(w, quantize_weight(w, s, 0, 8) * s[:, None], rtol=2e-7, atol=0)
    assert rounded.lm_head.weight is rounded.model.embed_tokens.weight   # the head untouched
    assert torch.equal(rounded.lm_head.weight, model.hf.lm_head.weight)
    for off in (load("tiny", quant="fp32", gptq=True, **BUCKETS),
                load("tiny", smooth=None, **BUCKETS)):
        assert off.step_model is off.hf
    assert load("tiny", smooth=None, gptq=True, **BUCKETS).step_model is not model.hf


def test_w4a8_rounds_by_gptq_by_default_on_4_bit_codes():
    assert not load("tiny", **BUCKETS).gptq             # W8A8: nearest (no gain measured)
    model = load("tiny", quant="w4a8", **BUCKETS)
    assert model.gptq
    assert not load("tiny", quant="w4a8", gptq=False, **BUCKETS).gptq
    with pytest.raises(ValueError, match="gptq must be True, False or None"):
        load("tiny", gptq="yes", **BUCKETS)
    w = model.step_model.model.layers[1].self_attn.k_proj.weight.detach().numpy()
    s = weight_qparams(w, 0, 4)
    codes = quantize_weight(w, s, 0, 4)
    assert np.abs(codes).max() == 7
    np.testing.assert_allclose(w, codes * s[:, None], rtol=2e-7, atol=0)


def test_the_default_calibration_is_thousands_of_tokens_far_from_the_scored_text():
    from dsa_tvm.llm.gptq import TEXT_START, WINDOW, WINDOWS, default_texts
    from dsa_tvm.llm.source import load_source, pydoc_text

    source = load_source("tiny")
    texts = default_texts(source)
    assert len(texts) == WINDOWS and all(len(t) == WINDOW for t in texts)
    assert texts[0] == source.encode(pydoc_text())[TEXT_START:TEXT_START + WINDOW]
