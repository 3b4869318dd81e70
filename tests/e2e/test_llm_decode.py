"""Decoder LLM steps (``dsa_tvm.llm``) on a seeded tiny Llama through the real model's path.

The FP32 step (explicit KV cache, static buckets, host-side masks and rotary tables) is
checked against Hugging Face's own generation; the W8A8 steps' DSA launches against the
integer reference, bit for bit; buckets compile once.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dsa_tvm.llm import load  # noqa: E402
from dsa_tvm.llm.source import load_source  # noqa: E402
from dsa_tvm.runtime import thread_pack_memo  # noqa: E402
from tir_schedules.kinds import run_region  # noqa: E402

BUCKETS = dict(context_buckets=(16, 64), prefill_buckets=(16,))
PROMPT = "Hello world"


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def w8a8():
    return load("tiny", **BUCKETS)   # offload="all": every region that compiles launches


@pytest.mark.parametrize("prompt", [PROMPT, "A prompt longer than one prefill chunk of 16"])
def test_fp32_steps_generate_what_hugging_face_generates(prompt):
    """The sink token, prefill chunks (padded to their bucket), then decode across a
    cache-bucket boundary (16 -> 64 slots): the same greedy tokens as transformers' own
    KV-cache generation."""
    model = load("tiny", quant="fp32", **BUCKETS)
    ids = model.source.encode(prompt)
    gen = model.generate(prompt, max_new_tokens=12)
    assert gen.ids == hf_greedy(model.hf, ids, 12)
    assert gen.steps[0].kind == "sink" and gen.steps[0].bucket == (1, 0)
    assert (1, 64) in {s.bucket for s in gen.decode}


def test_fp32_step_logits_match_the_full_forward():
    model = load("tiny", quant="fp32", **BUCKETS)
    ids = model.source.encode("The quick brown fox")
    kv = model.new_cache()
    logits, _ = model.prefill(ids[:-3], kv)
    rows = [logits[-1]]
    for t in ids[-3:]:
        step, _ = model.run_step([t], kv, "decode")
        rows.append(step[-1])
    with torch.no_grad():
        want = model.hf(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(np.stack(rows), want[len(ids) - 4:], atol=2e-4, rtol=1e-4)


def assert_steps_bit_exact(model, next_ids: list[int]) -> None:
    """The sink token on the host, then a prefill and two decode steps whose every DSA
    launch equals the integer reference of its region, bit for bit (the second decode
    step's cache repacked from the first's: ``layers.pack_memo``)."""
    regions = {}   # region names repeat across the buckets' compiles: key by compile too
    for crep in model.reports.values():
        regions.update({(crep.compile_id, d.name): d.region for d in crep.regions
                        if d.target == "dsa"})
    kv = model.new_cache()
    model.run_step(model.source.encode(PROMPT)[:1], kv)
    assert not model.last_launches   # the sink token runs on the host
    updates = thread_pack_memo().updates
    for kind, ids in (("prefill", model.source.encode(PROMPT)[1:]), ("decode", next_ids),
                      ("decode", next_ids)):
        model.run_step(ids, kv, kind)
        assert model.last_launches
        for launch in model.last_launches:
            region = regions[launch.compile_id, launch.program.name]
            want = run_region(region, launch.inputs)
            for name, got in launch.outputs.items():
                np.testing.assert_array_equal(got, want[name])
    assert thread_pack_memo().updates > updates


def test_dsa_launches_are_bit_exact_and_buckets_compile_once(w8a8):
    gen = w8a8.generate(PROMPT, max_new_tokens=3)
    assert [s.kind for s in gen.steps] == ["sink", "prefill", "decode", "decode"]
    assert all(s.launches >= 1 for s in gen.steps[1:])
    assert_steps_bit_exact(w8a8, gen.ids[:1])
    compiled = set(w8a8._compiled)
    w8a8.generate("Another prompt", max_new_tokens=2)
    assert set(w8a8._compiled) == compiled == {(16, 16), (1, 16)}


def test_dsa_steps_report_cycles_and_dram(w8a8):
    gen = w8a8.generate(PROMPT, max_new_tokens=2)
    assert gen.steps[0].kind == "sink" and gen.steps[0].cycles == 0
    for s in gen.steps[1:]:
        assert s.cycles > 0 and s.dram_read > 0 and s.macs_dsa > 0
    assert "cycles/token" in gen.summary() and "KV cache" in gen.summary()


def test_decode_dram_reads_split_into_weights_kv_and_activations(w8a8):
    """Every byte a decode step reads is classified once, and no class is below what the
    step must move: each linear layer's int8 weights (lm_head tied to the embedding
    included), and the K and V rows of every cache slot and the new token, per layer."""
    a = w8a8.arch
    gen = w8a8.generate(PROMPT, max_new_tokens=2)
    step = gen.decode[-1]
    assert step.read_weights + step.read_kv + step.read_activations == step.dram_read
    linear = a.hidden * (a.heads + 2 * a.kv_heads) * a.head_dim + a.heads * a.head_dim * a.hidden
    weights = a.layers * (linear + 3 * a.hidden * a.ffn) + a.vocab * a.hidden
    assert step.read_weights >= weights == a.weight_bytes()
    slots = step.bucket[1] + 1
    assert step.read_kv >= a.layers * 2 * a.kv_heads * slots * a.head_dim == a.kv_bytes(slots)
    assert 0 < gen.bandwidth_use(gen.decode) <= 1
    assert step.host_us >= step.launches * w8a8.cfg.launch_overhead_us
    # the per-token record leaves the trace out; the numbers are the traced report's
    from dsa_tvm.report import build_report

    full = build_report(w8a8.last_launches, w8a8.reports[step.bucket])
    bare = build_report(w8a8.last_launches, w8a8.reports[step.bucket], trace=False)
    assert full.trace_events and not bare.trace_events
    assert (bare.total_cycles, bare.rows) == (full.total_cycles, full.rows) \
        and bare.total_cycles == step.cycles


def test_w4a8_reads_half_the_weight_bytes_and_stays_bit_exact(w8a8):
    """W4A8 on a part that unpacks int4 on LOAD: every linear layer's weights (the tied
    lm_head too) are read two codes a byte, and every launch is still bit-exact."""
    w4 = load("tiny", quant="w4a8", **BUCKETS)
    assert w4.dram_weight_bytes == w4.arch.weight_bytes(4)
    assert w8a8.dram_weight_bytes == w8a8.arch.weight_bytes(8)
    g4, g8 = (m.generate(PROMPT, max_new_tokens=2) for m in (w4, w8a8))
    s4, s8 = g4.decode[-1], g8.decode[-1]
    assert s4.bucket == s8.bucket and s4.read_kv == s8.read_kv
    assert s4.read_weights >= w4.arch.weight_bytes(4)
    assert s8.read_weights - s4.read_weights == w4.arch.weight_bytes(4)   # all of them halved
    assert s4.cycles < s8.cycles
    assert_steps_bit_exact(w4, g4.ids[:1])
    assert np.isfinite(w4.perplexity(w4.source.encode("The quick brown fox jumps")))


def test_w4g32_runs_every_projection_as_a_grouped_dense(w8a8):
    """w4g32 (int4 codes with a scale and a minimum per 32 input rows, the head at 8
    bits): every projection and the head are grouped denses, the decode step in W8A8's
    launches (down_proj's int16 input as byte planes), bit-exact; a token reads the codes
    (the head's at 8 bits) and two int16 factors per 32 weights, less than W8A8."""
    from dsa_tvm.layers.ir import GroupedDense

    g = load("tiny", quant="w4g32", **BUCKETS)
    assert g.smooth_group == 32 and not g.gptq
    gg, g8 = (m.generate(PROMPT, max_new_tokens=2) for m in (g, w8a8))
    assert [s.launches for s in gg.decode] == [s.launches for s in g8.decode]
    arch = g.arch
    layers = [ly for d in g.reports[(1, 16)].regions if d.target == "dsa"
              for ly in d.region.layers]
    assert sum(isinstance(ly, GroupedDense) for ly in layers) == 7 * arch.layers + 1
    sg, s8 = gg.decode[-1], g8.decode[-1]
    head = arch.vocab * arch.hidden
    codes = arch.weight_bytes(4) + head // 2                   # the head's codes at 8 bits
    factors = 4 * (arch.weight_bytes(8) // 32)
    assert g.dram_weight_bytes == codes + factors
    assert codes + factors <= sg.read_weights < s8.read_weights, (sg.read_weights, codes)
    assert sg.read_kv == s8.read_kv
    assert_steps_bit_exact(g, gg.ids[:1])
    with pytest.raises(ValueError, match="leave gptq off"):
        load("tiny", quant="w4g32", gptq=True, **BUCKETS)


@pytest.mark.parametrize("call, match", [
    (lambda m: m.generate("", 4), "empty prompt"),
    (lambda m: m.run_step([1, 2], m.new_cache()), "first token runs alone"),
    (lambda m: m.generate([5, 256], 2), r"not in 0\.\.255"),
    (lambda m: m.perplexity([-1, 3]), r"not in 0\.\.255"),
    (lambda m: m.prefill([1, 2, 300], m.new_cache()), r"not in 0\.\.255"),
    (lambda m: m.generate(PROMPT, -1), "max_new_tokens"),
    (lambda m: m.generate("y" * 16, 60), "exceeds the largest bucket"),
])
def test_bad_requests_say_what_to_change(call, match):
    model = load("tiny", quant="fp32", **BUCKETS)
    with pytest.raises(ValueError, match=match):
        call(model)


def test_bad_model_and_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="quant must be one of"):
        load("tiny", quant="int3")
    with pytest.raises(ValueError, match="context_buckets must be positive"):
        load("tiny", context_buckets=())
    with pytest.raises(ValueError, match="prefill_buckets must be positive"):
        load("tiny", prefill_buckets=(0, 16))
    with pytest.raises(FileNotFoundError, match="no model at"):
        load_source(tmp_path / "missing.gguf")
    # a wrong quant or hardware is named before the model's weights are read
    with pytest.raises(ValueError, match="quant must be one of"):
        load(tmp_path / "missing.gguf", quant="w4g33")
    with pytest.raises(ValueError, match="unknown hardware preset .defualt."):
        load(tmp_path / "missing.gguf", hw="defualt")
    with pytest.raises(ValueError, match="calibration must be a string or a sequence"):
        load("tiny", calibration=[b"bytes"])
    # an on/off option takes a bool (bool("no") would turn it on) or None for the part's
    for name in ("wide_qkv", "wide_mlp_inputs", "wide_residual", "wide_down"):
        with pytest.raises(ValueError, match=f"{name} must be True, False or None"):
            load("tiny", **{name: "no"}, **BUCKETS)
    assert not load("tiny", wide_qkv=np.bool_(False), **BUCKETS).wide_qkv
    # one string is one calibration text (not one text per character)
    assert load("tiny", calibration="Some text.", **BUCKETS)._calibration == ("Some text.",)
    # a cache bucket that is no whole number of tiles works, but copies the cache: said
    with pytest.warns(UserWarning, match=r"context buckets \[20\] are not whole 16-row"):
        load("tiny", context_buckets=(20, 64), prefill_buckets=(16,))


def test_generate_cli_streams_tokens_and_writes_the_report(tmp_path, capsys):
    import json

    from dsa_tvm.cli import main

    out = tmp_path / "gen.json"
    assert main(["generate", "tiny", "--prompt", PROMPT, "--max-new-tokens", "3",
                 "--quant", "fp32", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("launch(es)]") == 3 and "decode:" in text
    rep = json.loads(out.read_text())
    want = hf_greedy(load_source("tiny").model, list(PROMPT.encode()), 3)
    assert rep["ids"] == want and [s["kind"] for s in rep["steps"]][:2] == ["sink", "prefill"]
    assert main(["generate", "tiny", "--prompt", "", "--quant", "fp32"]) == 2
    assert "empty prompt" in capsys.readouterr().err
    # W8A8 on the DSA: every decode token's DRAM reads split, in the summary and the JSON
    assert main(["generate", "tiny", "--prompt", PROMPT, "--max-new-tokens", "2",
                 "--json", str(out)]) == 0
    assert "KV cache" in capsys.readouterr().out
    step = json.loads(out.read_text())["steps"][-1]
    assert step["kind"] == "decode" and step["launches"] > 0
    assert step["read_weights"] + step["read_kv"] + step["read_activations"] == step["dram_read"]
    with pytest.raises(SystemExit):
        main(["generate", "tiny", "--prompt", PROMPT, "--offload", "sometimes"])


def test_perplexity_matches_the_full_forward_and_w8a8_stays_close(w8a8):
    text = "the quick brown fox jumps over the lazy dog " * 3
    ids = list(text.encode())[:60]
    fp32 = load("tiny", quant="fp32", **BUCKETS)
    with torch.no_grad():
        logp = torch.log_softmax(fp32.hf(torch.tensor([ids])).logits[0, :-1].double(), -1)
    want = float(torch.exp(-logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean()))
    assert fp32.perplexity(ids) == pytest.approx(want, rel=1e-4)
    assert w8a8.perplexity(ids) == pytest.approx(want, rel=0.25)
    with pytest.raises(ValueError, match="at least two tokens"):
        fp32.perplexity("a")


def test_offload_policy_decides_where_compiled_regions_run():
    """The tiny model's decode regions are launch-bound (a host estimate of a microsecond
    or two against a 20 us launch): ``offload="faster"`` keeps them on the host and says
    why; the default ``"all"`` launches every one; an unknown policy is refused."""
    faster = load("tiny", offload="faster", **BUCKETS)
    gen = faster.generate(PROMPT, max_new_tokens=2)
    assert gen.steps[-1].kind == "decode" and gen.steps[-1].launches == 0
    regions = faster.reports[gen.steps[-1].bucket].regions
    assert regions and all(d.target == "cpu" and "CPU is estimated faster" in d.reason
                           for d in regions)
    everything = load("tiny", **BUCKETS)
    gen = everything.generate(PROMPT, max_new_tokens=2)
    regions = everything.reports[gen.steps[-1].bucket].regions
    assert all(d.target == "dsa" and "offload='all'" in d.reason for d in regions)
    assert gen.steps[-1].launches == len(regions)
    with pytest.raises(ValueError, match="offload must be one of faster, all"):
        load("tiny", offload="always", **BUCKETS)



def test_decode_sweep_stays_under_the_dram_roofline_and_plots(w8a8, tmp_path):
    """Per context bucket: real cache contents, the DSA's tokens/s never above the DRAM
    roofline (every weight and the bucket's K/V read once), the KV share growing with the
    context; the PNG is written."""
    from dsa_tvm.llm.context_sweep import STEPS, decode_point, plot_decode

    points = [decode_point(w8a8, c) for c in w8a8.context_buckets]
    for p in points:
        assert p.bucket == p.context + STEPS and 0 < p.roofline_fraction <= 1
        assert p.tokens_per_s <= p.roofline_tokens_per_s
        assert p.wall_s > 0 and p.wall_first_s > 0
    assert points[1].read_kv > points[0].read_kv
    assert plot_decode(points, tmp_path / "decode.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="not one of the model's cache buckets"):
        decode_point(w8a8, 100)
    for steps in (0, 16):
        with pytest.raises(ValueError, match="steps must be 1..15"):
            decode_point(w8a8, 16, steps=steps)
    with pytest.raises(ValueError, match="no decode points"):
        plot_decode([], tmp_path / "empty.png")


def test_teacher_forced_agreement_is_the_share_of_next_tokens_predicted(w8a8):
    """A model agrees with its own greedy continuation everywhere; the W8A8 DSA model's
    share is the count of positions where its prefill argmax equals that continuation."""
    fp32 = load("tiny", quant="fp32", **BUCKETS)
    want = fp32.generate("ab", 6).ids
    assert fp32.teacher_forced("ab", want) == 1.0
    ids = fp32.token_ids("ab")
    logits, _ = w8a8.prefill(ids + want[:-1], w8a8.new_cache())
    hits = sum(int(np.argmax(logits[len(ids) - 1 + i])) == t for i, t in enumerate(want))
    assert w8a8.teacher_forced("ab", want) == pytest.approx(hits / len(want))
    with pytest.raises(ValueError, match="continuation"):
        fp32.teacher_forced("ab", [])
