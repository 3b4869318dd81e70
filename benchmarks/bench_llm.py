"""Decoder LLM on the DSA (issue 14): W8A8 and W4A8 against the FP32 model, side by side.

Per run and quantization (``--quants``): greedy tokens of the DSA model against the FP32
model's (the same step graphs in torch) over ``--prompts`` prompts x ``--tokens`` new
tokens, position by position until the first disagreement and overall; perplexity of
each on the first ``--ppl-tokens`` tokens of ``pydoc_data.topics`` (English text that
ships with Python), scored token by token against FP32 (``dsa_tvm.llm.scoring``: the NLL
increase with its standard error, the KL divergence);
the prefill and decode steps' cycles, launches and DRAM bytes; compile and simulator
wall times. Every number is measured in this run.

Part ``speed``: decode on the DSA (each quantization) at each context bucket (cache filled with real text by
the FP32 model on the host), tokens/s at the simulated clock against the DRAM roofline,
each token's bytes split into weights / KV cache / activations, a PNG of both; the
simulator's wall time per token beside transformers' FP32 tokens/s on this CPU.

Part ``prefill``: a ``--prefill``-token prompt (default 512) of ``pydoc_data.topics`` in
one chunk (the sink token on the host, then one bucket of N - 1 tokens against the cache
bucket ``--prefill-cache``, 128 by default, the one a prompt's first chunk gets): cycles,
tokens/s at the clock, MACs on the DSA and on the host, the MAC array's
utilization (MACs / (cycles x the array's peak MACs a cycle); goal >= 70% at 512),
launches, DRAM bytes; compile and simulator wall time. Not in the default parts (a
512-token bucket compiles in about 6 minutes).

    python benchmarks/bench_llm.py [--model smollm2|tiny] [--hw default]
                                   [--quants w8a8,w4a8] [--parts accuracy,speed,prefill]
                                   [--prompts 8] [--tokens 32]
                                   [--ppl-tokens 2048] [--contexts 128,512,2048] [--smooth 0.5|none]
                                   [--smooth-folds qkv,gate_up,down,o]
                                   [--plot bench_llm_decode.png] [--prefill 512]
                                   [--rows-concat dsa|host] [--narrow-attention]
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

import numpy as np

from dsa_tvm.llm.buckets import CONTEXT
from dsa_tvm.llm.source import pydoc_text  # noqa: F401  (also the sibling scripts' import)

if TYPE_CHECKING:
    from dsa_tvm.llm.scoring import PairedScore

PROMPTS = (
    "The capital of France is",
    "Water is made of",
    "The largest planet in the solar system is",
    "To make a cup of tea, you",
    "def add(a, b):\n   ",
    "The first president of the United States was",
    "Photosynthesis is the process",
    "My favourite season is autumn because",
)
#: buckets small enough that the run compiles four steps
BUCKETS = dict(prefill_buckets=(16,), context_buckets=(128, 512))

#: the library's int16 grids a run can put back on int8: flag -> (CompiledLLM option, its
#: label, what it widens, int16 on a digital part only). One table for this script and
#: llm_qdq_proxy.py, so a new grid option is one line here
NARROW = {
    "narrow": ("wide_residual", "residual", "the residual stream", False),
    "narrow-down": ("wide_down", "down_proj input", "down_proj's input (the SiLU-gate "
                    "product)", True),
    "narrow-attention": ("wide_attention", "probabilities", "the attention's probabilities",
                         False),
    "narrow-logits": ("wide_logits", "logits", "the logits", False),
    "narrow-mlp": ("wide_mlp", "mlp", "the gated MLP's interior (gate, up, the SiLU)", True),
    "narrow-qkv": ("wide_qkv", "qkv", "Q, K and V with their cache", True),
    "narrow-mlp-inputs": ("wide_mlp_inputs", "mlp input", "the gate and up projections' "
                          "input", True),
}


def add_narrow_flags(ap: argparse.ArgumentParser, flags: tuple[str, ...]) -> None:
    """``--narrow-*`` switches of :data:`NARROW` on ``ap``."""
    for flag in flags:
        _, _, what, digital = NARROW[flag]
        ap.add_argument(f"--{flag}", action="store_true",
                        help=f"{what} on int8 grids (the library's default"
                             f"{' on a digital part' if digital else ''}: int16)")


def narrow_options(args: argparse.Namespace, flags: tuple[str, ...]) -> dict[str, bool]:
    """The CompiledLLM options the given ``--narrow-*`` flags turn off (the rest: the
    library's defaults)."""
    return {NARROW[f][0]: False for f in flags if getattr(args, f.replace("-", "_"))}


#: the grids this script can narrow (the proxy takes every one)
BENCH_NARROW = ("narrow-attention", "narrow-mlp", "narrow-qkv", "narrow-mlp-inputs")


def agreement(a: list[int], b: list[int]) -> tuple[float, int]:
    """Share of positions where both chose the same token, and the first position where
    they differ (len when never)."""
    n = min(len(a), len(b))
    same = [x == y for x, y in zip(a[:n], b[:n])]
    first = same.index(False) if False in same else n
    return (sum(same) / n if n else 1.0), first


def main() -> None:
    from dsa_tvm.llm import load
    from dsa_tvm.llm.scoring import log_probs, perplexity_of

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--hw", default="default")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--ppl-tokens", type=int, default=2048,
                    help="tokens of pydoc_data.topics scored (256 is worth +-3%% of perplexity "
                    "between two schemes; 2048 about +-1%%)")
    add_narrow_flags(ap, BENCH_NARROW)
    ap.add_argument("--wide-inputs", action="store_true",
                    help="every linear layer's input (but the head's) on an int16 grid, each "
                         "dense run as two byte planes")
    ap.add_argument("--parts", default="accuracy,speed")
    ap.add_argument("--quants", default="w8a8,w4a8",
                    help="DSA quantizations, comma-separated (w8a8, w4a8, w4g32)")
    ap.add_argument("--contexts", default="128,512,2048")
    ap.add_argument("--smooth", default=None,
                    help="SmoothQuant's alpha folded into the DSA steps' weights (default: "
                         "the library's, dsa_tvm.llm.model.SMOOTH); 'none' for no smoothing")
    ap.add_argument("--plot", default="bench_llm_decode.png")
    ap.add_argument("--rows-concat", default="dsa", choices=("host", "dsa"),
                    help="where the KV-cache concat runs ('dsa', the default: in the region, "
                         "one launch a decode step; 'host': before it)")
    ap.add_argument("--prefill", type=int, default=512,
                    help="prompt tokens of part prefill (one chunk)")
    ap.add_argument("--prefill-cache", type=int, default=CONTEXT[0],
                    help="the cache bucket the chunk reads (the sink's one position; the "
                         "library's smallest context bucket by default, as a prompt's first "
                         "chunk gets; before 2026-12-07 the bench passed --prefill, which "
                         "doubles the attention's columns, half of them empty slots)")
    ap.add_argument("--smooth-folds", default=None,
                    help="the inputs smoothed, comma-separated (qkv, gate_up, down, o; default: "
                         "the library's, dsa_tvm.llm.model.SMOOTH_FOLDS)")
    ap.add_argument("--gptq", choices=("on", "off"), default=None,
                    help="W4A8's weight rounding (default: the library's, GPTQ); 'off' for a "
                         "speed-only run (the codes change, the programs and cycles do not)")
    args = ap.parse_args()
    from dsa_tvm.llm.gptq import TEXT_START

    if args.ppl_tokens > TEXT_START:   # W4A8's GPTQ calibrates on pydoc from there on
        ap.error(f"--ppl-tokens {args.ppl_tokens}: at most {TEXT_START}, the token where "
                 f"GPTQ's calibration text starts (dsa_tvm.llm.gptq.TEXT_START)")
    parts = set(args.parts.split(","))
    contexts = tuple(int(c) for c in args.contexts.split(","))

    t0 = time.perf_counter()
    buckets = dict(BUCKETS, context_buckets=tuple(sorted(set(BUCKETS["context_buckets"])
                                                         | set(contexts))))
    quants = [q.strip() for q in args.quants.split(",") if q.strip()]
    opts = {} if args.smooth is None else {
        "smooth": None if args.smooth.lower() in ("none", "off") else float(args.smooth)}
    if args.smooth_folds:
        opts["smooth_folds"] = tuple(args.smooth_folds.split(","))
    opts["rows_concat"] = args.rows_concat
    opts.update(narrow_options(args, BENCH_NARROW))
    if args.wide_inputs:
        opts["wide_inputs"] = True
    gptq = None if args.gptq is None else args.gptq == "on"
    models = {q: load(args.model, hw=args.hw, quant=q, verbose=True, **opts, **buckets,
                      **({"gptq": gptq} if gptq is not None and q == "w4a8" else {}))
              for q in quants}
    if quants:
        print(f"smooth: {models[quants[0]].smooth} {models[quants[0]].smooth_folds}; GPTQ: "
              f"{', '.join(q for q, m in models.items() if m.gptq) or 'none'}")
    print(f"loaded in {time.perf_counter() - t0:.0f} s")
    if "accuracy" in parts:
        ref = load(args.model, quant="fp32", **buckets)
        if ref.source.tokenizer is not None:
            bf16_agreement(ref, args)
        want = log_probs(ref, ref.source.encode(pydoc_text())[:args.ppl_tokens])
        scores = {q: accuracy(dsa, ref, want, args) for q, dsa in models.items()}
        base = next(iter(scores.values())).ppl_fp32 if scores else perplexity_of(*want)
        print(f"\nperplexity over {len(want[1])} tokens of pydoc_data.topics: FP32 {base:.3f}, "
              + ", ".join(f"{q.upper()} {r.ppl:.3f} ({r.ppl / base - 1:+.1%}; NLL "
                          f"+{r.dnll:.4f} +- {r.dnll_se:.4f}, KL {r.kl:.4f})"
                          for q, r in scores.items())
              + " (goal: W8A8 within +3%)")
    if "speed" in parts:
        for dsa in models.values():
            speed(dsa, contexts, args)
    if "prefill" in parts:
        for q in quants:
            cache = sorted({min(args.prefill_cache, args.prefill), args.prefill})
            prefill(load(args.model, hw=args.hw, quant=q, **opts,
                         prefill_buckets=(args.prefill - 1,),
                         context_buckets=tuple(cache)), args.prefill)
    for q, dsa in models.items():
        print(f"{q}: buckets compiled {sorted(dsa._compiled)}")
    print(f"total {time.perf_counter() - t0:.0f} s")


def accuracy(dsa, ref, fp32: tuple[np.ndarray, np.ndarray], args) -> PairedScore:
    """Greedy agreement and step costs of ``dsa`` against ``ref``; its perplexity scored
    against ``fp32`` (``ref``'s log-probabilities and the tokens they predict)."""
    from dsa_tvm.llm.scoring import log_probs, paired_score

    name = dsa.quant.upper()
    rows, gens = [], []
    for prompt in PROMPTS[:args.prompts]:
        want = ref.generate(prompt, args.tokens)
        got = dsa.generate(prompt, args.tokens)
        share, first = agreement(got.ids, want.ids)
        forced = dsa.teacher_forced(prompt, want.ids)
        rows.append((share, first, forced))
        gens.append(got)
        print(f"{name} {prompt!r:50.50} agree {share:5.1%} first miss at {first:2d}  "
              f"teacher-forced {forced:5.1%}  {got.text[:40]!r}", flush=True)
    share = float(np.mean([r[0] for r in rows]))
    print(f"\ngreedy agreement {name} vs FP32: {share:.1%} of {args.tokens} tokens over "
          f"{len(rows)} prompts (goal >= 90%); first miss at token "
          f"{float(np.mean([r[1] for r in rows])):.1f} on average; teacher-forced (each "
          f"position after FP32's own continuation) {float(np.mean([r[2] for r in rows])):.1%}")

    ids = dsa.source.encode(pydoc_text())[:args.ppl_tokens]
    t1 = time.perf_counter()
    score = paired_score(log_probs(dsa, ids)[0], *fp32)
    print(f"{name} {score} [{time.perf_counter() - t1:.0f} s]")

    steps = [s for g in gens for s in g.steps]
    for kind in ("prefill", "decode"):
        ss = [s for s in steps if s.kind == kind]
        if not ss:
            continue
        print(f"{kind}: {len(ss)} steps, mean {np.mean([s.cycles for s in ss]):,.0f} cycles, "
              f"{np.mean([s.launches for s in ss]):.0f} launches, "
              f"{np.mean([s.dram_read for s in ss]) / 1e6:.2f} MB DRAM read, "
              f"{sum(1 for s in ss if not s.launches)} without a DSA launch, "
              f"simulator {np.mean([s.wall_s for s in ss]):.2f} s/step")
    return score


def prefill(dsa, tokens: int) -> None:
    """A ``tokens``-token prompt in one chunk: its cost and the MAC array's utilization."""
    ids = dsa.source.encode(pydoc_text())[:tokens]
    if len(ids) < tokens:
        raise SystemExit(f"--prefill {tokens}: pydoc_data.topics has only {len(ids)} tokens")
    t = time.perf_counter()
    dsa.executable(*dsa.step_shape(tokens - 1, 1))      # compile apart from the run
    compiled, t = time.perf_counter() - t, time.perf_counter()
    _, recs = dsa.prefill(ids, dsa.new_cache())
    wall = time.perf_counter() - t
    chunk = [r for r in recs if r.kind == "prefill"]
    cyc = sum(r.cycles for r in chunk)
    macs, cpu = sum(r.macs_dsa for r in chunk), sum(r.macs_cpu for r in chunk)
    util = macs / (cyc * dsa.cfg.peak_macs_per_cycle) if cyc else 0.0
    print(f"\n{dsa.quant.upper()} prefill of {tokens} tokens on {dsa.cfg.name} (sink on the "
          f"host, then {len(chunk)} chunk of {chunk[0].tokens}): {cyc:,} cycles "
          f"({cyc / dsa.cfg.mhz / 1e3:.1f} ms, {chunk[0].tokens * dsa.cfg.mhz * 1e6 / cyc:,.0f}"
          f" tokens/s), {macs / 1e6:,.1f} M MACs on the DSA, {cpu / 1e6:,.1f} M on the host, "
          f"MAC utilization {util:.1%} (goal >= 70%), {sum(r.launches for r in chunk)} "
          f"launches, {sum(r.dram_read for r in chunk) / 1e6:,.0f} MB read / "
          f"{sum(r.dram_written for r in chunk) / 1e6:,.0f} MB written; simulator "
          f"{wall:.0f} s, compile {compiled:.0f} s")


def bf16_agreement(ref, args) -> None:
    """Greedy agreement of the FP32 model run in bfloat16 (transformers) against ``ref``'s
    tokens, on the prompts the DSA is measured on: what the agreement goal asks of a scheme
    next to the format most accelerators ship LLMs in (8 significant bits, as int8's codes)."""
    import copy

    import torch

    half = copy.deepcopy(ref.hf).to(torch.bfloat16)
    rows = []
    for prompt in PROMPTS[:args.prompts]:
        want = ref.generate(prompt, args.tokens).ids
        prompt_ids = ref.source.encode(prompt)
        ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = half.generate(ids, max_new_tokens=args.tokens, do_sample=False,
                                attention_mask=torch.ones_like(ids))[0, len(prompt_ids):]
            forced = half(torch.tensor([prompt_ids + want[:-1]])).logits[0]
        picks = forced[len(prompt_ids) - 1:].argmax(-1).tolist()
        rows.append((agreement(out.tolist(), want)[0],
                     float(np.mean([a == b for a, b in zip(picks, want)]))))
    print(f"greedy agreement BF16 (transformers) vs FP32: {np.mean([r[0] for r in rows]):.1%} "
          f"of {args.tokens} tokens over {len(rows)} prompts, teacher-forced "
          f"{np.mean([r[1] for r in rows]):.1%} (the goal's 90% measured on bfloat16)\n",
          flush=True)


def transformers_tokens_per_s(model, tokens: int = 32) -> float:
    """The FP32 model's greedy tokens/s in transformers (KV cache) on this CPU."""
    import torch

    ids = torch.tensor([model.source.encode(PROMPTS[0])])
    with torch.no_grad():
        t = time.perf_counter()
        out = model.hf.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens,
                                do_sample=False, attention_mask=torch.ones_like(ids))
        return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - t)


def speed(dsa, contexts: tuple[int, ...], args) -> None:
    from dsa_tvm.llm.context_sweep import decode_point, plot_decode

    print(f"\n{dsa.quant.upper()} decode on {args.hw} ({dsa.cfg.mhz:g} MHz, DRAM "
          f"{dsa.cfg.bandwidth_bytes_per_cycle * dsa.cfg.mhz / 1e3:g} GB/s), "
          f"{dsa.dram_weight_bytes / 1e6:.1f} MB of weights per token")
    print(f"{'context':>8} {'cycles/tok':>11} {'tok/s':>8} {'roofline':>9} {'frac':>5} "
          f"{'weights MB':>10} {'KV MB':>6} {'act MB':>6} {'bw use':>6} {'launch':>6} "
          f"{'host us':>7} {'sim s/tok':>9} {'(first)':>7}")
    points = []
    for c in contexts:
        p = decode_point(dsa, c)
        points.append(p)
        print(f"{p.bucket:>8} {p.cycles:>11,.0f} {p.tokens_per_s:>8.1f} "
              f"{p.roofline_tokens_per_s:>9.1f} {p.roofline_fraction:>5.0%} "
              f"{p.read_weights / 1e6:>10.2f} {p.read_kv / 1e6:>6.2f} "
              f"{p.read_activations / 1e6:>6.2f} {p.bandwidth_use:>6.0%} {p.launches:>6} "
              f"{p.host_us:>7,.0f} {p.wall_s:>9.2f} {p.wall_first_s:>7.2f}", flush=True)
    tps = transformers_tokens_per_s(dsa)
    wall = float(np.mean([p.wall_s for p in points]))
    first = float(np.mean([p.wall_first_s for p in points]))
    print(f"simulator {wall:.2f} s per decode token once a bucket's programs are timed and "
          f"their replay plans built (goal <= 1 s; a bucket's first token {first:.2f} s: "
          f"timing simulated once, then reused); "
          f"transformers FP32 on this "
          f"CPU {tps:.1f} tokens/s ({1 / tps:.3f} s/token): the simulator is "
          f"{wall * tps:.0f}x slower")
    plot = args.plot.replace(".png", f"_{dsa.quant}.png")
    print(f"plot: {plot_decode(points, plot, f'{args.model} {dsa.quant} decode on {args.hw}')}")


if __name__ == "__main__":
    main()
