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

The ``DSA:`` schemes model the DSA's own choices: the sequence's first token (the sink)
runs in FP32 and is left out of calibration, as ``dsa_tvm.llm`` does; inputs are static
per tensor unless named per token; and the residual stream is rounded where the DSA
would hold it: at each RMSNorm's input and at o_proj's and down_proj's outputs (static
int8 or int16, or int8 per token).

    python benchmarks/llm_quant_study.py                 # every scheme, ~9 min on 2 cores
    python benchmarks/llm_quant_study.py "W8 A8/token SQ0.5 +KV"   # some of them
    python benchmarks/llm_quant_study.py --dsa           # the DSA: schemes only, ~1 min
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
    sink: bool = False                # position 0 in FP32 and out of calibration (the DSA's host)
    token_layers: tuple[str, ...] = ()  # these layers' inputs per token even when static
    norm_in: str | None = None        # each RMSNorm's input: "int8", "int16", "int8/token"
    branch_out: str | None = None     # o_proj's and down_proj's outputs, the same choices


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
_DSA = dict(static=True, sink=True, shared=True)
DSA_SCHEMES = {
    "DSA: A8/tensor, residual int8": Scheme(**{**_DSA, "shared": False}, norm_in="int8",
                                             branch_out="int8"),
    "DSA: SQ0.5, residual int8": Scheme(**_DSA, smooth=0.5, norm_in="int8", branch_out="int8"),
    "DSA: SQ0.5, residual FP32": Scheme(**_DSA, smooth=0.5),
    "DSA: SQ0.5, norm in int8/token, out int8": Scheme(**_DSA, smooth=0.5,
                                                       norm_in="int8/token", branch_out="int8"),
    "DSA: SQ0.5, residual int16": Scheme(**_DSA, smooth=0.5, norm_in="int16",
                                         branch_out="int16"),
    "DSA: A8/tensor, residual int16": Scheme(**{**_DSA, "shared": False}, norm_in="int16",
                                              branch_out="int16"),
    "DSA: SQ0.5, residual FP32, down A8/token": Scheme(**_DSA, smooth=0.5,
                                                       token_layers=("down_proj",)),
    "DSA: SQ0.5, residual int16, down A8/token": Scheme(**_DSA, smooth=0.5, norm_in="int16",
                                                        branch_out="int16",
                                                        token_layers=("down_proj",)),
    "DSA: SQ0.5, norm in int8/token, out int16, down A8/token": Scheme(
        **_DSA, smooth=0.5, norm_in="int8/token", branch_out="int16",
        token_layers=("down_proj",)),
}
SCHEMES.update(DSA_SCHEMES)


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
                 wmax: torch.Tensor | None = None, per_token: bool | None = None):
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
        self.bias, self.scheme, self.fp32 = lin.bias, scheme, lin
        self.per_token = scheme.act if per_token is None else per_token
        # one calibrated scale for the whole (smoothed) input: the DSA's static grids
        self.step = float((amax / (self.smooth if self.smooth is not None else 1)).max()) / 127

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._quantized(x)
        if self.scheme.sink:    # the first token in FP32 with FP32 weights, as on the host
            y = _with_sink(y, self.fp32(x[..., :1, :]))
        return y

    def _quantized(self, x: torch.Tensor) -> torch.Tensor:
        if self.smooth is not None:
            x = x / self.smooth
        if self.per_token:
            x = per_row(x, pow2=self.scheme.pow2)
        elif self.scheme.static:
            x = (x / self.step).round().clamp(-127, 127) * self.step
        return nn.functional.linear(x, self.weight, self.bias)


#: whether the running forward pass starts at position 0 (False for generate's later steps)
_FROM_START = [True]


def _note_start(_m, _args, kwargs) -> None:
    pos = kwargs.get("cache_position")
    pos = kwargs.get("position_ids") if pos is None else pos
    _FROM_START[0] = pos is None or int(pos.reshape(-1)[0]) == 0


def _with_sink(quantized: torch.Tensor, fp32: torch.Tensor) -> torch.Tensor:
    """``quantized`` with position 0 taken from ``fp32`` when this pass starts there."""
    if not _FROM_START[0]:
        return quantized
    return torch.cat([fp32[..., :1, :], quantized[..., 1:, :]], -2)


def round_as(t: torch.Tensor, spec: str, amax: float, sink: bool) -> torch.Tensor:
    """``t`` on the grid ``spec`` names: static "int8" / "int16" over the calibrated
    ``amax``, or "int8/token"; position 0 left as it is under ``sink``."""
    if spec == "int8/token":
        r = per_row(t)
    else:
        top = {"int8": 127, "int16": 32767}[spec]
        r = (t / (amax / top)).round().clamp(-top, top) * (amax / top)
    return _with_sink(r, t) if sink else r


class Study:
    def __init__(self):
        from dsa_tvm.llm.source import load_source

        torch.set_num_threads(1)
        self.src = load_source("smollm2")
        self.hf = self.src.model
        self.linears = {n: m for n, m in self.hf.named_modules() if isinstance(m, nn.Linear)}
        text = self.src.encode(pydoc_text())
        self.ppl_ids, calib = text[:256], text[2000:2512]   # calibration text held apart
        self.points = self._residual_points()
        self.amax, self.amax_sink, self.point_max = self._maxima(calib)
        self.hooks: list = []
        self.hf.model.register_forward_pre_hook(_note_start, with_kwargs=True)
        self.ref = [self.greedy(p) for p in PROMPTS]

    def _residual_points(self) -> dict[str, tuple[str, str]]:
        """Where the DSA holds the residual stream: name -> (module, "in" or "out")."""
        pts = {"model.norm": ("model.norm", "in")}
        for i in range(len(self.hf.model.layers)):
            pre = f"model.layers.{i}"
            for m, side in (("input_layernorm", "in"), ("post_attention_layernorm", "in"),
                            ("self_attn.o_proj", "out"), ("mlp.down_proj", "out")):
                pts[f"{pre}.{m}"] = (f"{pre}.{m}", side)
        return pts

    @torch.no_grad()
    def _maxima(self, ids: list[int]):
        """Per linear layer its inputs' per-channel maxima, with and without position 0,
        and per residual point its maximum without position 0."""
        amax: dict[str, torch.Tensor] = {}
        amax_sink: dict[str, torch.Tensor] = {}
        point: dict[str, float] = {}

        def keep(d, name, x):
            a = x.abs().reshape(-1, x.shape[-1]).amax(0)
            d[name] = torch.maximum(d[name], a) if name in d else a

        def linear_hook(name):
            def record(_m, inputs, _out):
                keep(amax, name, inputs[0])
                keep(amax_sink, name, inputs[0][..., 1:, :])
            return record

        def point_hook(name, side):
            def record(_m, inputs, out):
                t = inputs[0] if side == "in" else out
                point[name] = max(point.get(name, 0.0), float(t[..., 1:, :].abs().max()))
            return record

        handles = [m.register_forward_hook(linear_hook(n)) for n, m in self.linears.items()]
        handles += [self.hf.get_submodule(m).register_forward_hook(point_hook(n, side))
                    for n, (m, side) in self.points.items()]
        self.hf(torch.tensor([ids]))
        for h in handles:
            h.remove()
        return amax, amax_sink, point

    def apply(self, scheme: Scheme) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        calibrated = self.amax_sink if scheme.sink else self.amax
        maxima = self._shared_maxima(calibrated) if scheme.shared else {}
        for name, lin in self.linears.items():
            parent, attr = (name.rsplit(".", 1) if "." in name else ("", name))
            owner = self.hf.get_submodule(parent) if parent else self.hf
            amax, wmax = maxima.get(name, (calibrated[name], None))
            per_token = scheme.act or attr in scheme.token_layers
            setattr(owner, attr, lin if scheme.weight_bits is None
                    else FakeQuantLinear(lin, scheme, amax, wmax, per_token))
        for name, (module, side) in self.points.items():
            spec = scheme.norm_in if side == "in" else scheme.branch_out
            if spec is None:
                continue
            m, a = self.hf.get_submodule(module), self.point_max[name]
            if side == "in":
                self.hooks.append(m.register_forward_pre_hook(
                    lambda _m, i, a=a, spec=spec: (round_as(i[0], spec, a, scheme.sink),)))
            else:
                self.hooks.append(m.register_forward_hook(
                    lambda _m, _i, o, a=a, spec=spec: round_as(o, spec, a, scheme.sink)))
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

    def _shared_maxima(self, calibrated: dict[str, torch.Tensor]
                       ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
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
            amax = torch.stack([calibrated[n] for n in names]).amax(0)
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
    args = sys.argv[1:]
    names = [n for n in args if n != "--dsa"] or list(DSA_SCHEMES if "--dsa" in args
                                                        else SCHEMES)
    unknown = [n for n in names if n not in SCHEMES]
    if unknown:
        sys.exit(f"unknown scheme(s) {unknown}; choose from {list(SCHEMES)}")
    study = Study()
    w = max(len(n) for n in names) + 2
    print(f"{'scheme':<{w}}{'perplexity':>11}{'vs FP32':>9}{'free-running':>14}"
          f"{'teacher-forced':>16}")
    base = study.perplexity()                 # Study() leaves the FP32 model in place
    for name in names:
        t0 = time.perf_counter()
        study.apply(SCHEMES[name])
        ppl = study.perplexity()
        rel = f"{ppl / base - 1:+.1%}"
        print(f"{name:<{w}}{ppl:>11.3f}{rel:>9}{study.free_running():>14.1%}"
              f"{study.teacher_forced():>16.1%}   [{time.perf_counter() - t0:.0f} s]",
              flush=True)


if __name__ == "__main__":
    main()
