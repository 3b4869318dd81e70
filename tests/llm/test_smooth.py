"""SmoothQuant folded into the decoder's FP32 weights (``dsa_tvm.llm.smooth``).

The smoothed copy must compute the original's function (every fold divides one
producer by the factor its consumer multiplies by), each fold must matter (dropping the
producer half of any one changes the logits), position 0 (the host's sink token) must
stay out of the maxima, and the quantized steps must come from the smoothed copy while
the FP32 reference stays the original.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dsa_tvm.llm import load  # noqa: E402
from dsa_tvm.llm import smooth as sq  # noqa: E402
from dsa_tvm.llm.feeds import step_feeds  # noqa: E402
from dsa_tvm.llm.source import tiny_llama  # noqa: E402
from dsa_tvm.llm.step import run_step_fp32  # noqa: E402

TEXTS = [list(b"The capital of France is Paris, known for its food."),
         list(b"def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)")]
PROBE = torch.tensor([list(b"Hello world, a probe the smoothing never saw")])
BUCKETS = dict(context_buckets=(16, 64), prefill_buckets=(16,))
#: the producer each fold divides (restoring it leaves only the consumer's half)
PRODUCERS = {"_fold_qkv": "input_layernorm.weight",
             "_fold_gate_up": "post_attention_layernorm.weight",
             "_fold_down": "mlp.up_proj.weight",
             "_fold_o": "self_attn.v_proj.weight"}


@pytest.fixture(scope="module")
def hf():
    """The tiny Llama with norm weights far from 1 (the norm folds must be exercised) and
    a few outlier input channels (the factors must be far from uniform)."""
    model = tiny_llama(0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.0 + 0.2)
                p[:3] *= 20.0
    return model


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(PROBE).logits


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / a.abs().max()).detach())


def test_the_smoothed_copy_computes_the_same_logits_and_leaves_the_original(hf):
    before = {n: p.detach().clone() for n, p in hf.named_parameters()}
    smoothed = sq.smooth_llama(hf, TEXTS, 0.5)
    assert rel_err(logits(hf), logits(smoothed)) < 1e-4
    for n, p in hf.named_parameters():   # the original is untouched
        assert torch.equal(p, before[n]), n
    params = dict(smoothed.named_parameters())
    for i in range(len(hf.model.layers)):   # every folded tensor moved, by a lot
        for leaf in [*PRODUCERS.values(), "self_attn.o_proj.weight", "mlp.down_proj.weight"]:
            name = f"model.layers.{i}.{leaf}"
            assert rel_err(before[name], params[name]) > 0.1, name
    # the tied head and the final norm are left alone
    assert smoothed.lm_head.weight is smoothed.model.embed_tokens.weight
    assert torch.equal(params["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert torch.equal(params["model.norm.weight"], before["model.norm.weight"])


@pytest.mark.parametrize("fold", sorted(PRODUCERS))
def test_dropping_one_folds_producer_half_changes_the_logits(hf, monkeypatch, fold):
    """Each fold alone: its consumer's columns scaled, its producer restored -> not the
    same function (so the equality above is not vacuous for any of the four)."""
    original = getattr(sq, fold)

    def consumer_only(layer, *args):
        producer = layer.get_parameter(PRODUCERS[fold])
        kept = producer.detach().clone()
        original(layer, *args)
        producer.copy_(kept)

    monkeypatch.setattr(sq, fold, consumer_only)
    assert rel_err(logits(hf), logits(sq.smooth_llama(hf, TEXTS, 0.5))) > 1e-2


def test_o_proj_factors_are_shared_by_the_q_heads_of_one_kv_head(hf):
    """o_proj's columns of the q heads reading one KV head are scaled alike (v_proj's
    rows can carry only one factor per KV-head channel)."""
    smoothed = sq.smooth_llama(hf, TEXTS, 0.5)
    c = hf.config
    hd = c.hidden_size // c.num_attention_heads
    group = c.num_attention_heads // c.num_key_value_heads
    assert group > 1   # the tiny model has GQA, so the sharing is exercised
    for a, b in zip(hf.model.layers, smoothed.model.layers):
        ratio = (b.self_attn.o_proj.weight / a.self_attn.o_proj.weight)[0]
        ratio = ratio.reshape(c.num_key_value_heads, group, hd)
        torch.testing.assert_close(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-5, atol=0)
        # v_proj's row of each KV-head channel divided by that channel's factor (its
        # column 0 also carries the Q/K/V fold's one factor, the same for every row)
        v = (b.self_attn.v_proj.weight / a.self_attn.v_proj.weight)[:, 0]
        undone = v.reshape(c.num_key_value_heads, hd) * ratio[:, 0]
        torch.testing.assert_close(undone, undone[0, 0].expand_as(undone), rtol=1e-5, atol=0)


def test_maxima_leave_out_position_0(hf):
    """q_proj's recorded input maxima are those of the input norm's output over positions
    1.. ; position 0 (the sink token, FP32 on the host) would raise them."""
    amax = sq.input_maxima(hf, TEXTS[:1])
    with torch.no_grad():
        states = hf(torch.tensor([TEXTS[0]]), output_hidden_states=True).hidden_states
    for i, layer in enumerate(hf.model.layers):
        x = layer.input_layernorm(states[i])[0].abs()
        torch.testing.assert_close(amax[f"{i}.self_attn.q_proj"], x[1:].amax(0))
    x = hf.model.layers[0].input_layernorm(states[0])[0].abs()
    assert bool((x[0] > x[1:].amax(0)).any())   # position 0 would have changed them


@pytest.mark.parametrize("alpha", [1.5, -0.1, math.nan, math.inf, "half", None, True])
def test_hostile_alpha_is_a_clear_error(hf, alpha):
    with pytest.raises(ValueError, match="smooth"):
        sq.smooth_llama(hf, TEXTS, alpha)


def test_hostile_alpha_is_refused_by_load():
    with pytest.raises(ValueError, match=r"smooth .*\[0, 1\].*nan"):
        load("tiny", smooth=float("nan"), **BUCKETS)


def test_calibration_too_short_is_a_clear_error(hf):
    with pytest.raises(ValueError, match="at least two tokens"):
        sq.smooth_llama(hf, [[1], []], 0.5)


@pytest.mark.parametrize("folds", [("qkv", "gate_up"), ("down",), ("o",), "qkv"])
def test_any_subset_of_folds_computes_the_same_logits(hf, folds):
    smoothed = sq.smooth_llama(hf, TEXTS, 0.5, folds)
    assert rel_err(logits(hf), logits(smoothed)) < 1e-4
    names = {"qkv": "input_layernorm.weight", "o": "self_attn.o_proj.weight"}
    for fold, leaf in names.items():   # the folds left out leave their weights alone
        same = torch.equal(hf.model.layers[0].get_parameter(leaf),
                           smoothed.model.layers[0].get_parameter(leaf))
        assert same == (fold not in ((folds,) if isinstance(folds, str) else folds))


def test_unknown_fold_is_a_clear_error(hf):
    with pytest.raises(ValueError, match=r"unknown smoothing folds \['lm_head'\]"):
        sq.smooth_llama(hf, TEXTS, 0.5, ("qkv", "lm_head"))
    with pytest.raises(ValueError, match="unknown smoothing folds"):
        load("tiny", smooth=0.5, smooth_folds=("norm",), **BUCKETS)


def test_alpha_ends_are_exact(hf):
    """a = 0 and a = 1 are allowed and still compute the same function."""
    for a in (0.0, 1.0):
        assert rel_err(logits(hf), logits(sq.smooth_llama(hf, TEXTS, a))) < 1e-4


def test_quantized_steps_use_the_smoothed_copy_and_fp32_the_original():
    model = load("tiny", smooth=0.5, smooth_folds=sq.FOLDS, **BUCKETS)   # w8a8, with the o fold
    assert model.smooth == 0.5 and model.step_model is not model.hf
    assert model.step_model is model.step_model   # built once
    for off in (load("tiny", quant="fp32", smooth=0.5, **BUCKETS),
                load("tiny", smooth=None, **BUCKETS)):
        assert off.step_model is off.hf
    # the sink step (host FP32) fills the cache from the smoothed copy: v_proj's rows
    # carry the division the quantized steps' o_proj undoes
    ids = model.source.encode("Hi")
    kv = model.new_cache()
    lg, rec = model.run_step(ids[:1], kv)
    assert rec.kind == "sink"
    f = step_feeds(model.hf, model.arch, ids[:1], 0, 1, 0, None)
    want = dict(zip(model.arch.output_names(), run_step_fp32(model.step_model, 1, 0, f)))
    orig = dict(zip(model.arch.output_names(), run_step_fp32(model.hf, 1, 0, f)))
    np.testing.assert_array_equal(kv.tensors["v0"][:, :, :1], want["v0_new"])
    assert not np.allclose(want["v0_new"], orig["v0_new"], rtol=1e-2)
    np.testing.assert_allclose(lg, orig["logits"][0], rtol=1e-4, atol=1e-4)   # same logits
    # calibration caches come from the smoothed copy too
    first = model.source.encode(model._calibration[0])[:2]
    f = step_feeds(model.hf, model.arch, first[:1], 0, 1, 0, None)
    want = dict(zip(model.arch.output_names(), run_step_fp32(model.step_model, 1, 0, f)))
    cal = model.calibration_feeds()
    np.testing.assert_allclose(cal[0]["v0"][:, :, :1], want["v0_new"], rtol=1e-4, atol=1e-5)


def test_generate_cli_takes_smooth(capsys):
    from dsa_tvm.cli import main

    assert main(["generate", "tiny", "--prompt", "Hi", "--max-new-tokens", "1",
                 "--quant", "fp32", "--smooth", "0.5"]) == 0
    capsys.readouterr()
    assert main(["generate", "tiny", "--prompt", "Hi", "--smooth", "1.5"]) == 2
    assert "smooth" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "tiny", "--prompt", "Hi", "--smooth", "half"])


@pytest.mark.parametrize("group", [4, 5])
def test_grouped_factors_are_constant_over_each_run_of_input_channels(hf, group):
    """group > 1: every folded weight's input columns scaled alike within each run of
    ``group`` (a shorter last run included), so a per-group weight grid stays one."""
    folds = ("qkv", "gate_up", "down") if group == 5 else sq.FOLDS   # 5 does not divide hd
    smoothed = sq.smooth_llama(hf, TEXTS, 0.5, folds, group=group)
    assert rel_err(logits(hf), logits(smoothed)) < 1e-4
    for a, b in zip(hf.model.layers, smoothed.model.layers):
        for lin in ("self_attn.q_proj", "mlp.up_proj", "mlp.down_proj", "self_attn.o_proj"):
            if lin == "self_attn.o_proj" and "o" not in folds:
                continue
            ratio = (b.get_submodule(lin).weight / a.get_submodule(lin).weight)[0].detach()
            for s in range(0, ratio.numel(), group):
                run = ratio[s:s + group]
                torch.testing.assert_close(run, run[:1].expand_as(run), rtol=1e-5, atol=0)
        assert float(ratio.max() / ratio.min()) > 1.5   # still far from uniform


@pytest.mark.parametrize("group", [0, -2, 2.5, True, "32"])
def test_hostile_group_is_a_clear_error(hf, group):
    with pytest.raises(ValueError, match="group"):
        sq.smooth_llama(hf, TEXTS, 0.5, group=group)


def test_a_group_straddling_heads_is_refused_with_the_o_fold(hf):
    with pytest.raises(ValueError, match="straddle heads"):
        sq.smooth_llama(hf, TEXTS, 0.5, sq.FOLDS, group=5)


def test_hostile_group_is_refused_by_the_model_at_once():
    from dsa_tvm.llm.model import CompiledLLM
    from dsa_tvm.llm.source import load_source

    with pytest.raises(ValueError, match="group"):
        CompiledLLM(load_source("tiny"), smooth_group=0, **BUCKETS)
