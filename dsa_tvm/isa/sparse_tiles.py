"""The compressed N:M weight tile a WGTS load reads (``array.sparsity``).

A weight tile is ``rows`` (block_out) x ``cols`` (block_in) int8 codes, a row per output
lane, the reduction along ``cols``. It is N:M when every row has at most N nonzero codes
in each aligned group of M consecutive columns. Compressed, it is

* the kept values, int8, row-major, N per group (groups left to right), then
* one ``log2(M)``-bit index per kept value (its column inside the group), packed
  little-endian (the first index in the low bits of the first byte), padded to a byte.

A group with fewer than N nonzeros keeps its lowest zero positions as well, so every
group has exactly N entries and the layout is fixed. Decompression writes the values at
their columns and zeros elsewhere: the weight scratchpad holds the dense tile, the array
reads the indices to pick the N inputs of each group it multiplies.
"""

from __future__ import annotations

import numpy as np

from ..hw.sparsity import index_bits, n_m_tile_bytes


def is_n_m(tiles: np.ndarray, n: int, m: int) -> bool:
    """Whether every row of every tile (last axis: columns, a multiple of M) has at most
    N nonzero codes in each aligned group of M."""
    t = np.asarray(tiles)
    if t.shape[-1] % m:
        return False
    groups = t.reshape(t.shape[:-1] + (t.shape[-1] // m, m))
    return bool((np.count_nonzero(groups, axis=-1) <= n).all())


def _kept_columns(groups: np.ndarray, n: int) -> np.ndarray:
    """The N positions kept in each group: the nonzero ones, then the lowest zero ones,
    in ascending order."""
    order = np.argsort(groups == 0, axis=-1, kind="stable")[..., :n]
    return np.sort(order, axis=-1)


def pack_n_m(tiles: np.ndarray, n: int, m: int) -> np.ndarray:
    """int8 tiles (..., rows, cols) -> uint8 (..., tile bytes), one compressed tile each.
    Raises ValueError when a group holds more than N nonzeros (it would not round-trip)."""
    t = np.asarray(tiles, dtype=np.int8)
    rows, cols = t.shape[-2:]
    if cols % m or not is_n_m(t, n, m):
        raise ValueError(f"weight tiles are not {n}:{m} sparse: some row has more than {n} "
                         f"nonzero codes in an aligned group of {m} columns")
    lead = t.shape[:-2]
    groups = t.reshape(lead + (rows, cols // m, m))
    cols_kept = _kept_columns(groups, n)
    values = np.take_along_axis(groups, cols_kept, axis=-1).reshape(lead + (-1,))
    b = index_bits(m)
    bits = (cols_kept.reshape(lead + (-1, 1)) >> np.arange(b)) & 1
    index = np.packbits(bits.reshape(lead + (-1,)).astype(np.uint8), axis=-1, bitorder="little")
    out = np.concatenate([values.view(np.uint8), index], axis=-1)
    assert out.shape[-1] == n_m_tile_bytes(rows, cols, n, m)
    return out


def unpack_n_m(raw: np.ndarray, rows: int, cols: int, n: int, m: int) -> np.ndarray:
    """uint8 (..., tile bytes) -> int8 tiles (..., rows, cols): the inverse of
    :func:`pack_n_m`."""
    r = np.asarray(raw, dtype=np.uint8)
    lead = r.shape[:-1]
    kept = rows * (cols // m) * n
    b = index_bits(m)
    values = r[..., :kept].view(np.int8).reshape(lead + (rows, cols // m, n))
    bits = np.unpackbits(r[..., kept:], axis=-1, count=kept * b, bitorder="little")
    weights = (1 << np.arange(b)).astype(np.int64)
    cols_kept = (bits.reshape(lead + (kept, b)) * weights).sum(-1)
    cols_kept = cols_kept.reshape(lead + (rows, cols // m, n))
    out = np.zeros(lead + (rows, cols // m, m), np.int8)
    np.put_along_axis(out, cols_kept, values, axis=-1)
    return out.reshape(lead + (rows, cols))
