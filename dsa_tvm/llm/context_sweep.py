"""Decode speed against context length, beside the DRAM roofline.

For each context bucket the cache is filled on the host with the FP32 model over real
text (to just below the bucket's size, so the step runs in that bucket), then a few
tokens are decoded on the DSA. A decode step's timing does not depend on the cache's
contents, only on the bucket; the fill makes the numbers come from a real cache anyway.
The roofline of a token is the bytes it must read (every weight once, int8 or packed
int4 with any per-group factors: ``CompiledLLM.dram_weight_bytes``; the K and V rows of
the bucket's slots, at two bytes a code for an int16 cache: ``dram_kv_bytes``) over the
DRAM bandwidth; its fraction is that time over the
simulated one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: tokens decoded per context (their mean is reported)
STEPS = 4


@dataclass
class DecodePoint:
    context: int              # tokens in the cache before the measured steps
    bucket: int               # cache slots of the compiled step
    cycles: float             # per token
    tokens_per_s: float       # at the simulated clock
    launches: int
    read_weights: float       # DRAM bytes per token, by kind (llm.traffic)
    read_kv: float
    read_activations: float
    bandwidth_use: float      # bytes moved / what the DRAM could move in those cycles
    roofline_tokens_per_s: float
    roofline_fraction: float  # roofline time / simulated time
    host_us: float            # modelled launch overheads and CPU ops per token
    wall_s: float             # simulator wall time per token on this machine once the
    #                           bucket's programs are timed and their replay plans built
    #                           (every token after the second)
    wall_first_s: float = 0.0  # the bucket's first token: its programs' timing simulated
    #                            once (data independent, then reused) and their unpacking


def filler_ids(model, count: int) -> list[int]:
    """``count`` token ids of English text that ships with Python (pydoc's topics)."""
    from .source import pydoc_text

    ids = model.source.encode(pydoc_text()[: 8 * count + 64])
    while len(ids) < count:
        ids = ids + ids
    return ids[:count]


def decode_point(model, bucket: int, steps: int = STEPS) -> DecodePoint:
    """``steps`` DSA decode tokens with the cache filled to just below ``bucket`` slots."""
    from .model import CompiledLLM
    from .records import bandwidth_use

    if bucket not in model.context_buckets:
        raise ValueError(f"context {bucket} is not one of the model's cache buckets "
                         f"{model.context_buckets}")
    if not 1 <= steps < bucket:
        raise ValueError(f"steps must be 1..{bucket - 1} (decoded tokens within the "
                         f"{bucket}-slot bucket), got {steps}")
    fill = bucket - steps
    host = CompiledLLM(model.source, quant="fp32", prefill_buckets=model.prefill_buckets,
                       context_buckets=model.context_buckets)
    kv = model.new_cache()
    logits, _ = host.prefill(filler_ids(model, fill), kv)
    recs = []
    tok = int(np.argmax(logits[-1]))
    for _ in range(steps):
        logits, rec = model.run_step([tok], kv, "decode")
        recs.append(rec)
        tok = int(np.argmax(logits[-1]))
    cfg = model.cfg
    cyc = float(np.mean([r.cycles for r in recs]))
    must = model.dram_weight_bytes + model.dram_kv_bytes(bucket + 1)
    roof = must / cfg.bandwidth_bytes_per_cycle
    mean = {k: float(np.mean([getattr(r, k) for r in recs]))
            for k in ("read_weights", "read_kv", "read_activations", "host_us")}
    # the first token times the bucket's programs, the second builds their replay plans
    steady = float(np.mean([r.wall_s for r in (recs[2:] or recs[1:] or recs)]))
    use = bandwidth_use(recs, cfg.bandwidth_bytes_per_cycle)
    return DecodePoint(fill, recs[0].bucket[1], cyc, cfg.mhz * 1e6 / cyc if cyc else 0.0,
                       recs[-1].launches, mean["read_weights"], mean["read_kv"],
                       mean["read_activations"], use, cfg.mhz * 1e6 / roof,
                       roof / cyc if cyc else 0.0, mean["host_us"], steady, recs[0].wall_s)


def plot_decode(points: list[DecodePoint], path: str | Path, title: str = "") -> Path:
    """Two panels: tokens/s against context with the roofline, and each token's DRAM bytes
    by kind (weights, KV cache, activations)."""
    if not points:
        raise ValueError("no decode points to plot: measure at least one context first")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx = [p.bucket for p in points]
    fig, (speed, bytes_) = plt.subplots(1, 2, figsize=(11, 4.2))
    speed.plot(ctx, [p.tokens_per_s for p in points], "o-", label="simulated DSA")
    speed.plot(ctx, [p.roofline_tokens_per_s for p in points], "k--",
               label="DRAM roofline (weights + KV once)")
    for p in points:
        speed.annotate(f"{p.roofline_fraction:.0%}", (p.bucket, p.tokens_per_s),
                       textcoords="offset points", xytext=(4, -12), fontsize=8)
    speed.set_xscale("log", base=2)
    speed.set_xticks(ctx, [str(c) for c in ctx])
    speed.minorticks_off()
    speed.set(xlabel="context (cache slots)", ylabel="tokens / s", ylim=(0, None),
              title="decode speed (label: fraction of the roofline)")
    speed.legend(fontsize=8)
    x = np.arange(len(points))
    bottom = np.zeros(len(points))
    for kind, color in (("read_weights", "#4c72b0"), ("read_kv", "#dd8452"),
                        ("read_activations", "#55a868")):
        mb = np.array([getattr(p, kind) for p in points]) / 1e6
        bytes_.bar(x, mb, bottom=bottom, color=color, label=kind.removeprefix("read_"))
        bottom += mb
    bytes_.set_xticks(x, [str(c) for c in ctx])
    bytes_.set(xlabel="context (cache slots)", ylabel="MB read from DRAM per token",
               title="where each token's bytes come from")
    bytes_.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
