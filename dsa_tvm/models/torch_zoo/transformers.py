"""The zoo's transformers in plain PyTorch: ViT, BERT, GPT-2 and Llama blocks.

Attention is written out (Linear q/k/v, matmul, softmax, matmul) so the exported
graph is the one a user's model gives, not a fused op. Token models take int64
ids ``(1, S)``; the embedding and the head are part of the model (the issue's goal
is everything between them on the DSA).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, S, D) q/k/v -> (B, S, D) multi-head scaled dot-product attention."""
    b, s, d = q.shape
    hd = d // heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(b, s, heads, hd).transpose(1, 2)

    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(hd))
    if mask is not None:
        scores = scores + mask
    return (F.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, s, d)


def causal_mask(s: int) -> torch.Tensor:
    return torch.triu(torch.full((s, s), -1e4), 1)


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, bias: bool = True) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d, d, bias=bias) for _ in range(3))
        self.o = nn.Linear(d, d, bias=bias)
        self.heads = heads

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.o(attention(self.q(x), self.k(x), self.v(x), self.heads, mask))


class PreNormBlock(nn.Module):
    """x + attn(LN(x)); x + MLP(LN(x)) (ViT, GPT-2)."""

    def __init__(self, d: int, heads: int, ffn: int, gelu: str) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.gelu = gelu

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=self.gelu))


class PostNormBlock(nn.Module):
    """LN(x + attn(x)); LN(x + MLP(x)) (BERT)."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attn = SelfAttention(d, heads)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class ViT(nn.Module):
    """ViT-Tiny shape (dim 192, 3 heads, MLP 768) on small images: patch conv, class
    token, learned positions, pre-norm blocks, LayerNorm, class-token head."""

    def __init__(self, image: int = 32, patch: int = 4, dim: int = 192, depth: int = 12,
                 heads: int = 3, mlp: int = 768, num_classes: int = 100) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(PreNormBlock(dim, heads, mlp, "none") for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


class Bert(nn.Module):
    """BERT encoder: token + position embeddings, LayerNorm, post-norm blocks (erf GELU),
    tanh pooler on the first token."""

    def __init__(self, vocab: int = 1000, seq: int = 32, dim: int = 128, depth: int = 4,
                 heads: int = 2, ffn: int = 512) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.blocks = nn.ModuleList(PostNormBlock(dim, heads, ffn) for _ in range(depth))
        self.pool = nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.ln(self.tok(ids) + self.pos)
        for b in self.blocks:
            x = b(x)
        return torch.tanh(self.pool(x[:, 0]))


class GPT2(nn.Module):
    """GPT-2: token + learned positions, pre-norm causal blocks (tanh GELU), final
    LayerNorm, LM head (vocab logits of every position)."""

    def __init__(self, vocab: int = 1000, seq: int = 32, dim: int = 128, depth: int = 2,
                 heads: int = 2) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.blocks = nn.ModuleList(PreNormBlock(dim, heads, 4 * dim, "tanh") for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", causal_mask(seq), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(self.ln(x))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq: int, hd: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / base ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.arange(seq).float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class LlamaBlock(nn.Module):
    """RMSNorm -> causal attention with rotary positions -> RMSNorm -> SiLU-gated MLP."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)
        self.heads = heads

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        hd = d // self.heads
        h = self.n1(x)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, self.heads, hd).transpose(1, 2)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        att = F.softmax(q @ k.transpose(-1, -2) * (1.0 / math.sqrt(hd)) + mask, -1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(b, s, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = 1000, seq: int = 32, dim: int = 128, depth: int = 2,
                 heads: int = 4, ffn: int = 344) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, ffn) for _ in range(depth))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("mask", causal_mask(seq), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        return self.head(self.norm(x))
