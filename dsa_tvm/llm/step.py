"""One forward step of a Llama decoder against an explicit KV cache, as FP32 ONNX.

A step reads ``T`` new tokens' embeddings and a cache of capacity ``C`` per layer, and
returns the logits of the ``T`` tokens and their keys and values (RoPE applied), which
the host writes into the cache. Shapes are static: one graph per ``(T, C)`` bucket,
compiled once and reused for every token (prefill: ``T`` = the prompt's bucket, ``C`` =
0; decode: ``T`` = 1, ``C`` = the context's bucket).

Inputs: ``x`` (1, T, hidden) embeddings (the host looks them up), ``cos``/``sin``
(T, head_dim) rotary tables of the tokens' positions, ``mask`` (1, kv_heads, g*T, C+T)
additive (0 or :data:`MASK`; ``g`` query heads share a KV head and are rows of one
matmul), then ``k{i}``/``v{i}`` (1, kv_heads, C, head_dim) per layer. Outputs:
``logits`` (1, T, vocab), then ``k{i}_new``/``v{i}_new`` (1, kv_heads, T, head_dim).

Why :data:`MASK` is finite: the integer softmax sees int8 codes, so a masked score must
sit far enough below the row's maximum that its exponential is negligible, and near
enough that the int8 grid of the softmax input still resolves real scores. Empty cache
slots hold zeros, so their raw score is 0 and their masked score exactly ``MASK``.
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass

import numpy as np

#: additive mask of a hidden key: exp(MASK) ~ 1e-14, negligible over any context
MASK = -32.0
OPSET = 17


@dataclass(frozen=True)
class Arch:
    """The decoder's shape, read from a Hugging Face Llama config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @classmethod
    def of(cls, hf) -> Arch:
        c = hf.config
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                   c.num_key_value_heads, hd, c.intermediate_size, c.vocab_size)

    def weight_bytes(self, bits: int = 8) -> int:
        """Bytes of every linear layer's weights at ``bits`` a weight (int8: 8, int4 packed
        two a byte: 4), the logits' (vocab x hidden) too: what one token must read from
        DRAM whatever the context."""
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim \
            + self.heads * self.head_dim * self.hidden
        count = self.layers * (attn + 3 * self.hidden * self.ffn) + self.vocab * self.hidden
        return count * bits // 8

    def kv_bytes(self, slots: int) -> int:
        """int8 bytes of the keys and values of ``slots`` cache slots, every layer."""
        return self.layers * 2 * self.kv_heads * slots * self.head_dim

    def cache_names(self) -> list[str]:
        return [f"{kv}{i}" for i in range(self.layers) for kv in "kv"]

    def input_names(self, cache: int) -> list[str]:
        return ["x", "cos", "sin", "mask"] + (self.cache_names() if cache else [])

    def output_names(self) -> list[str]:
        return ["logits"] + [f"{n}_new" for n in self.cache_names()]


def _step_module(hf, tokens: int, cache: int):
    """The step as a torch module. Functional pieces live in small named submodules so
    the exported node names are the same in every bucket (the quantizer's ranges are
    keyed by tensor name, and the cache concat exists only when ``cache`` > 0)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    a = Arch.of(hf)

    class Rope(nn.Module):
        def forward(self, t, cos, sin):
            h = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., h:], t[..., :h]], -1) * sin

    class Cat(nn.Module):
        def forward(self, past, new):
            return torch.cat([past, new], 2)

    class Attend(nn.Module):
        def forward(self, q, k, v, mask):
            # the g query heads of one KV head are rows of one matmul (no K/V copies)
            qg = q.reshape(1, a.kv_heads, a.group * tokens, a.head_dim)
            s = qg @ k.transpose(-1, -2) * (1.0 / math.sqrt(a.head_dim)) + mask
            o = F.softmax(s, -1) @ v
            o = o.reshape(1, a.heads, tokens, a.head_dim).transpose(1, 2)
            return o.reshape(1, tokens, a.heads * a.head_dim)

    class Block(nn.Module):
        def __init__(self, layer) -> None:
            super().__init__()
            self.layer = layer
            self.rope_q, self.rope_k, self.attend = Rope(), Rope(), Attend()
            self.cat_k, self.cat_v = Cat(), Cat()

        def forward(self, x, cos, sin, mask, past_k=None, past_v=None):
            att, t = self.layer.self_attn, tokens
            h = self.layer.input_layernorm(x)
            q = att.q_proj(h).reshape(1, t, a.heads, a.head_dim).transpose(1, 2)
            k = att.k_proj(h).reshape(1, t, a.kv_heads, a.head_dim).transpose(1, 2)
            v = att.v_proj(h).reshape(1, t, a.kv_heads, a.head_dim).transpose(1, 2)
            q, k = self.rope_q(q, cos, sin), self.rope_k(k, cos, sin)
            kk = k if past_k is None else self.cat_k(past_k, k)
            vv = v if past_v is None else self.cat_v(past_v, v)
            x = x + att.o_proj(self.attend(q, kk, vv, mask))
            mlp = self.layer.mlp
            h = self.layer.post_attention_layernorm(x)
            return x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h)), k, v

    class Step(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block(ly) for ly in hf.model.layers)
            self.norm, self.head = hf.model.norm, hf.lm_head

        def forward(self, x, cos, sin, mask, *past):
            new = []
            for i, block in enumerate(self.blocks):
                kv = (past[2 * i], past[2 * i + 1]) if cache else ()
                x, k, v = block(x, cos, sin, mask, *kv)
                new += [k, v]
            return (self.head(self.norm(x)), *new)

    return Step().eval()


def example_inputs(arch: Arch, tokens: int, cache: int) -> dict[str, np.ndarray]:
    z = np.zeros
    feeds = {"x": z((1, tokens, arch.hidden), np.float32),
             "cos": np.ones((tokens, arch.head_dim), np.float32),
             "sin": z((tokens, arch.head_dim), np.float32),
             "mask": z((1, arch.kv_heads, arch.group * tokens, cache + tokens), np.float32)}
    if cache:
        for n in arch.cache_names():
            feeds[n] = z((1, arch.kv_heads, cache, arch.head_dim), np.float32)
    return feeds


def run_step_fp32(hf, tokens: int, cache: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The FP32 step in torch (the calibration source and the float reference)."""
    import torch

    arch = Arch.of(hf)
    module = _step_module(hf, tokens, cache)
    with torch.no_grad():
        out = module(*(torch.from_numpy(np.ascontiguousarray(feeds[n]))
                       for n in arch.input_names(cache)))
    return [o.numpy() for o in out]


def export_step(hf, tokens: int, cache: int):
    """The FP32 ONNX graph of bucket ``(tokens, cache)``."""
    import onnx
    import torch

    arch = Arch.of(hf)
    names = arch.input_names(cache)
    ex = example_inputs(arch, tokens, cache)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_step_module(hf, tokens, cache),
                          tuple(torch.from_numpy(ex[n]) for n in names), buf,
                          input_names=names, output_names=arch.output_names(),
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
    return onnx.load_from_string(buf.getvalue())
