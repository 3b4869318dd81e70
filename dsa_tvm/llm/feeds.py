"""Host side of a step: embeddings, rotary tables, masks, and the KV cache.

The host looks up embeddings and computes the rotary tables of the step's positions (a
few hundred floats); the cache rows it writes are the DSA's ``k{i}_new``/``v{i}_new``
outputs, stored where the next step's attention reads them. Empty slots stay zero (see
:mod:`.step` on why that makes :data:`~.step.MASK` exact).
"""

from __future__ import annotations

import numpy as np

from .step import MASK, Arch


def rope_tables(hf, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of shape (len(positions), head_dim), as the model's own rotary module."""
    import torch

    pos = torch.as_tensor(np.asarray(positions, np.int64))[None]
    x = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = hf.model.rotary_emb(x, pos)
    return cos[0].numpy().astype(np.float32), sin[0].numpy().astype(np.float32)


def step_mask(arch: Arch, tokens: int, cache: int, cached: int, valid: int) -> np.ndarray:
    """(1, kv_heads, g*tokens, cache+tokens): the first ``cached`` cache slots and, per new
    token, itself and the earlier of the ``valid`` new tokens are visible."""
    m = np.full((tokens, cache + tokens), MASK, np.float32)
    m[:, :cached] = 0.0
    causal = np.tril(np.ones((tokens, tokens), bool))
    causal[:, valid:] = False
    m[:, cache:][causal] = 0.0
    rows = np.tile(m, (arch.group, 1))
    return np.ascontiguousarray(np.broadcast_to(rows, (1, arch.kv_heads, *rows.shape)))


class KVCache:
    """Keys and values of every layer, (1, kv_heads, capacity, head_dim) float32 each."""

    def __init__(self, arch: Arch, capacity: int) -> None:
        self.arch, self.capacity, self.length = arch, capacity, 0
        shape = (1, arch.kv_heads, capacity, arch.head_dim)
        self.tensors = {n: np.zeros(shape, np.float32) for n in arch.cache_names()}

    def view(self, slots: int) -> dict[str, np.ndarray]:
        """The first ``slots`` slots of every layer (the bucket's cache inputs)."""
        if slots > self.capacity:
            raise ValueError(f"a cache bucket of {slots} slots exceeds the capacity "
                             f"{self.capacity}")
        return {n: np.ascontiguousarray(t[:, :, :slots]) for n, t in self.tensors.items()}

    def append(self, new: dict[str, np.ndarray], count: int) -> None:
        """Write the first ``count`` rows of each ``{name}_new`` output at the end."""
        if self.length + count > self.capacity:
            raise ValueError(f"the context of {self.length + count} tokens exceeds the "
                             f"cache capacity {self.capacity}")
        for n, t in self.tensors.items():
            t[:, :, self.length:self.length + count] = new[f"{n}_new"][:, :, :count]
        self.length += count


def step_feeds(hf, arch: Arch, ids: list[int], start: int, tokens: int, cache: int,
               kv: KVCache | None) -> dict[str, np.ndarray]:
    """Inputs of one step: ``ids`` at positions ``start``... padded to ``tokens``, the
    first ``start`` cache slots visible (``kv`` None for a step without a cache)."""
    import torch

    n = len(ids)
    if not 1 <= n <= tokens:
        raise ValueError(f"{n} tokens for a step of {tokens}")
    padded = np.zeros(tokens, np.int64)
    padded[:n] = ids
    with torch.no_grad():
        x = hf.model.embed_tokens(torch.from_numpy(padded))[None].numpy()
    cos, sin = rope_tables(hf, np.arange(start, start + tokens))
    feeds = {"x": x.astype(np.float32), "cos": cos, "sin": sin,
             "mask": step_mask(arch, tokens, cache, start if cache else 0, n)}
    if cache:
        feeds.update(kv.view(cache))
    return feeds
