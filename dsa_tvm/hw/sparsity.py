"""Structured (N:M) weight sparsity as a hardware description states it.

One definition of the pattern string (``array.sparsity``) and of the compressed tile's
size, shared by the schema's rule, the config, the packer in ``isa.semantics`` and the
docs: a compressed tile keeps N int8 values of every aligned group of M reduction
elements in each row, then one log2(M)-bit index per kept value.
"""

from __future__ import annotations

import math
import re


def _pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def parse_n_m(v: object) -> tuple[int, int] | None:
    """``"N:M"`` as (N, M) when it is a pattern an array can run: 1 <= N < M <= 256, M a
    power of two, N dividing M (M / N tiles share a cycle); None otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", v) if isinstance(v, str) else None
    if m is None:
        return None
    n, mm = int(m.group(1)), int(m.group(2))
    return (n, mm) if 1 <= n < mm <= 256 and _pow2(mm) and mm % n == 0 else None


def index_bits(m: int) -> int:
    """Bits of one kept value's position inside its group of M."""
    return max(1, int(math.log2(m)))


def n_m_tile_bytes(rows: int, cols: int, n: int, m: int) -> int:
    """DRAM bytes of one compressed ``rows`` x ``cols`` tile (``cols`` reduction elements,
    a multiple of M): ``rows * cols * N / M`` values, then their indices, whole bytes."""
    kept = rows * (cols // m) * n
    return kept + math.ceil(kept * index_bits(m) / 8)
