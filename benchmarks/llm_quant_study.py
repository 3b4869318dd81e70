"""Which W8A8 scheme SmolLM2 needs, before building it into the DSA (issue 14).

A fake-quantization study in PyTorch (not the DSA): every linear layer of the FP32
SmolLM2-135M gets its weights rounded to int8 (per output channel, or per group of input
rows) and, optionally, its input rounded per token (dynamic: one scale per row, its
absolute maximum / 127), SmoothQuant's scale migration (``s_j = max|X_j|^a /
max|W_j|^(1-a)`` from one calibration text), the K/V projections' outputs per token and
head (the int8 KV cache), or the residual stream per token. Each scheme is scored as
``bench_llm.py`` scores the DSA: perplexity over the first 256 tokens of
``pydoc_data.topics``, greedy agreement with FP32 over 32 tokens of 8 prompts, free
running (each model continues its own text) and teacher forced (each position's argmax
after FP32's own continuation).

    python benchmarks/llm_quant_study.py                 # every scheme, ~8 min on 2 cores
    python benchmarks/llm_quant_study.py "W8 A8/token SQ0.5 +KV"   # some of them
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import torch
from bench_llm import PROMPTS, pydoc_text
from torch import nn


@dataclass(frozen=True)
class Scheme:
    weight_bits: int | None = 8       # None: FP32 weights
    group: int | None = None          # input rows per weight scale (None: per output channel)
    act: bool = False                 # linear inputs int8 per token
    static: bool = False              # linear inputs int8 per tensor, calibrated (not per token)
    smooth: float | None = None       # SmoothQuant's alpha
    pow2: bool = False                # per-token scales rounded up to a power of two
    shared: bool = False              # one smoothing factor per input: Q/K/V share one,
    #                                   gate/up one (what folding into the producer allows)
    kv: bool = False                  # K/V projections' outputs int8 per token and head
    residual: bool = False            # every layer's output (the residual stream) int8 per token


SCHEMES = {
    "FP32": Scheme(weight_bits=None),
    "W8": Scheme(),
    "W8 A8/token": Scheme(act=True),
    "W8/g32 A8/token": Scheme(group=32, act=True),
    "W8 A8/token SQ0.5": Scheme(act=True, smooth=0.5),
    "W8 A8/token SQ0.8": Scheme(act=True, smooth=0.8),
    "W8/g32 A8/token SQ0.5": Scheme(group=32, act=True, smooth=0.5),
    "W8 A8/token SQ0.5 pow2": Scheme(act=True, smooth=0.5, pow2=True),
    "W8 A8/token SQ0.5 +KV": Scheme(act=True, smooth=0.5, kv=True),
    "W8 A8/token SQ0.5 shared": Scheme(act=True, smooth=0.5, shared=True),
    "W8 A8/token SQ0.5 shared +KV": Scheme(act=True, smooth=0.5, shared=True, kv=True),
    "W8/g32 A8/token SQ0.5 +KV": Scheme(group=32, act=True, smooth=0.5, kv=True),
    "W8 A8/token SQ0.5 +residual": Scheme(act=True, smooth=0.5, residual=True),
    "W8 A8/tensor": Scheme(static=True),
    "W8 A8/tensor SQ0.5": Scheme(static=True, smooth=0.5),
    "W8 A8/tensor SQ0.5 +KV": Scheme(static=True, smooth=0.5, kv=True),
    "W4/g32 A8/token SQ0.5": Scheme(weight_bits=4, group=32, act=True, smooth=0.5),
}


def per_row(x: torch.Tensor, bits: int = 8, pow2: bool = False) -> torch.Tensor:
    """``x`` rounded to ``bits``-bit codes with one symmetric scale per row (last axis)."""
    top = 2 ** (bits - 1) - 1
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / top
    if pow2:
        s = 2.0 ** torch.ceil(torch.log2(s))
    return (x / s).round().clamp(-top, top) * s


def weights(w: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """(out, in) weights rounded per output channel, or per ``group`` input rows."""
    if group is None or w.shape[1] % group:
        return per_row(w, bits)
    o, k = w.shape
    return per_row(w.reshape(o, k // group, group), bits).reshape(o, k)


class FakeQuantLinear(nn.Module):
    def __init__(self, lin: nn.Linear, scheme: Scheme, amax: torch.Tensor,
                 wmax: torch.Tensor | None = None):
        super().__init__()
        w = lin.weight.data
        self.smooth = None
        if scheme.smooth is not None:
            a = scheme.smooth
            wm = w.abs().amax(0) if wmax is None else wmax
            self.smooth = amax.clamp(min=1e-5) ** a / wm.clamp(min=1e-5) ** (1 - a)
            w = w * self.smooth
        self.weight = nn.Parameter(weights(w, scheme.weight_bits, scheme.group),
                                   requires_grad=False)
        self.bias, self.scheme = lin.bias, scheme
        # one calibrated scale for the whole (smoothed) input: the DSA's static grids
        self.step = float((amax / (self.smooth if self.smooth is not None else 1)).max()) / 127

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.smooth is not None:
            x = x / self.smooth
        if self.scheme.act:
            x = per_row(x, pow2=self.scheme.pow2)
        elif self.scheme.static:
            x = (x / self.step).round().clamp(-127, 127) * self.step
        return nn.functional.linear(x, self.weight, self.bias)


class Study:
    def __init__(self):
        from dsa_tvm.llm.source import load_source

        torch.set_num_threads(1)
        self.src = load_source("smollm2")
        self.hf = self.src.model
        self.linears = {n: m for n, m in self.hf.named_modules() if isinstance(m, nn.Linear)}
        text = self.src.encode(pydoc_text())
        self.ppl_ids, calib = text[:256], text[2000:2512]   # calibration text held apart
        self.amax = self._input_maxima(calib)
        self.hooks: list = []
        self.ref = [self.greedy(p) for p in PROMPTS]

    @torch.no_grad()
    def _input_maxima(self, ids: list[int]) -> dict[str, torch.Tensor]:
        amax: dict[str, torch.Tensor] = {}

        def hook(name):
            def record(_m, inputs, _out):
                a = inputs[0].abs().reshape(-1, inputs[0].shape[-1]).amax(0)
                amax[name] = torch.maximum(amax[name], a) if name in amax else a
            return record

        handles = [m.register_forward_hook(hook(n)) for n, m in self.linears.items()]
        self.hf(torch.tensor([ids]))
        for h in handles:
            h.remove()
        return amax

    def apply(self, scheme: Scheme) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        maxima = self._shared_maxima() if scheme.shared else {}
        for name, lin in self.linears.items():
            parent, attr = (name.rsplit(".", 1) if "." in name else ("", name))
            owner = self.hf.get_submodule(parent) if parent else self.hf
            amax, wmax = maxima.get(name, (self.amax[name], None))
            setattr(owner, attr, lin if scheme.weight_bits is None
                    else FakeQuantLinear(lin, scheme, amax, wmax))
        head = self.hf.config.head_dim
        for layer in self.hf.model.layers:
            if scheme.residual:
                self.hooks.append(layer.register_forward_hook(
                    lambda _m, _i, o: (per_row(o[0]), *o[1:]) if isinstance(o, tuple)
                    else per_row(o)))
            if scheme.kv:
                for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                    self.hooks.append(proj.register_forward_hook(
                        lambda _m, _i, o, h=head: per_row(o.reshape(*o.shape[:-1], -1, h))
                        .reshape(o.shape)))

    def _shared_maxima(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per linear layer, the input and weight-column maxima over the layers reading
        the same input (Q/K/V; gate/up): one smoothing factor each input."""
        groups: dict[str, list[str]] = {}
        for name in self.linears:
            owner, leaf = name.rsplit(".", 1) if "." in name else ("", name)
            share = "qkv" if leaf in ("q_proj", "k_proj", "v_proj") else \
                "gate_up" if leaf in ("gate_proj", "up_proj") else leaf
            groups.setdefault(f"{owner}:{share}", []).append(name)
        out = {}
        for names in groups.values():
            amax = torch.stack([self.amax[n] for n in names]).amax(0)
            wmax = torch.stack([self.linears[n].weight.data.abs().amax(0) for n in names]).amax(0)
            out.update({n: (amax, wmax) for n in names})
        return out

    @torch.no_grad()
    def greedy(self, prompt: str, n: int = 32) -> list[int]:
        ids = torch.tensor([self.src.encode(prompt)])
        out = self.hf.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)
        return out[0, ids.shape[1]:].tolist()

    @torch.no_grad()
    def perplexity(self) -> float:
        x = torch.tensor([self.ppl_ids])
        nll = nn.functional.cross_entropy(self.hf(x).logits[0, :-1], x[0, 1:])
        return math.exp(nll.item())

    @torch.no_grad()
    def teacher_forced(self) -> float:
        hits = total = 0
        for prompt, cont in zip(PROMPTS, self.ref):
            p = self.src.encode(prompt)
            am = self.hf(torch.tensor([p + cont[:-1]])).logits[0, len(p) - 1:].argmax(-1)
            hits += sum(int(a) == b for a, b in zip(am.tolist(), cont))
            total += len(cont)
        return hits / total

    def free_running(self) -> float:
        got = [self.greedy(p) for p in PROMPTS]
        same = sum(a == b for r, g in zip(self.ref, got) for a, b in zip(r, g))
        return same / sum(len(r) for r in self.ref)


def main() -> None:
    names = sys.argv[1:] or list(SCHEMES)
    unknown = [n for n in names if n not in SCHEMES]
    if unknown:
        sys.exit(f"unknown scheme(s) {unknown}; choose from {list(SCHEMES)}")
    study = Study()
    print(f"{'scheme':<30}{'perplexity':>11}{'vs FP32':>9}{'free-running':>14}"
          f"{'teacher-forced':>16}")
    base = study.perplexity()                 # Study() leaves the FP32 model in place
    for name in names:
        t0 = time.perf_counter()
        study.apply(SCHEMES[name])
        ppl = study.perplexity()
        rel = f"{ppl / base - 1:+.1%}"
        print(f"{name:<30}{ppl:>11.3f}{rel:>9}{study.free_running():>14.1%}"
              f"{study.teacher_forced():>16.1%}   [{time.perf_counter() - t0:.0f} s]",
              flush=True)


if __name__ == "__main__":
    main()
