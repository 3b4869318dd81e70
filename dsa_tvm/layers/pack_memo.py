"""Repacking a region input that changed in a few places: a decode step's KV cache.

Every decode step hands the region each layer's keys and values, which it reads as
weight tiles (each byte plane's, when the cache is int16). Between two steps of one
bucket the cache changed in one position, yet packing it from scratch costs the whole
cache: at a 2,048-token context, an eighth of the simulator's wall time a token. Those
packings are a gather of the input (or of its byte planes, elementwise functions that
keep zero) into tiles that are zero elsewhere, so :class:`PackMemo` keeps the last input
and its tiles and rewrites only the elements that changed. Every other input, and a
change of more than :data:`FULL_SHARE` of one, is packed in full by
:func:`~dsa_tvm.layers.host_pack.pack_region_input`, whose output this reproduces byte
for byte.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .host_pack import PLANES, pack_region_input, tiles_operand, weight_tiles
from .reference import split_planes

#: repack in full when more than this share of an input's elements changed
FULL_SHARE = 1 / 8
#: what one thread's memo may hold (inputs and their tiles), oldest dropped first
MEMO_BYTES = 512 << 20


def gather_spec(io: dict) -> dict | None:
    """The ``weight_tiles`` note an input's every packed array follows when its packing
    is a gather that keeps zero: weight tiles without column sums, of the input (int8)
    or of both its byte planes alike (int16); ``None`` otherwise."""
    notes = list(io[PLANES].values()) if PLANES in io else [io]
    specs = [n.get("weight_tiles") for n in notes]
    if any(s is None or s.get("column_sums") or set(n) & {PLANES, "matmul_b", "matmul_a"}
           for s, n in zip(specs, notes)):
        return None
    shapes = {json.dumps({k: v for k, v in s.items() if k != "tiles"}, sort_keys=True)
              for s in specs}
    return specs[0] if len(shapes) == 1 else None


def tile_positions(shape: tuple[int, ...], spec: dict, block_in: int,
                   block_out: int) -> np.ndarray | None:
    """Where each element of an input of ``shape`` lands in its packed tiles (flat
    indices, by the input's flat index): the packing run on the elements' numbers.
    ``None`` if some element lands twice or not at all (then no element-wise update)."""
    n = int(np.prod(shape, dtype=np.int64))
    numbers = np.arange(1, n + 1, dtype=np.int64).reshape(shape)
    flat = weight_tiles(tiles_operand(numbers, spec), block_in, block_out).reshape(-1)
    at = np.flatnonzero(flat)
    if at.size != n or np.bincount(flat[at], minlength=n + 1)[1:].min(initial=1) != 1:
        return None
    pos = np.empty(n, np.int64)
    pos[flat[at] - 1] = at
    return pos


def _read_only(tiles: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Views of the kept arrays a caller cannot write (a write would corrupt the next
    step's packing without a word)."""
    out = {}
    for name, arr in tiles.items():
        out[name] = view = arr.view()
        view.flags.writeable = False
    return out


@dataclass
class _Entry:
    x: np.ndarray                   # the input the tiles were made from
    tiles: dict[str, np.ndarray]    # region name -> packed array, updated in place
    pos: np.ndarray                 # tile_positions of the input
    planes: bool

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + sum(t.nbytes for t in self.tiles.values())


class PackMemo:
    """One thread's last packing of each (program, input) that packs by gathering. The
    arrays :meth:`pack` returns are read-only views the next call for the same key
    rewrites: copy them before that (the simulator copies its inputs into DRAM as a run
    starts)."""

    def __init__(self, max_bytes: int = MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._positions: OrderedDict[tuple, np.ndarray | None] = OrderedDict()
        self.updates = self.full_packs = 0        # counts, for tests and profiles

    def pack(self, key: bytes, name: str, x: np.ndarray, io: dict, block_in: int,
             block_out: int) -> dict[str, np.ndarray]:
        """:func:`pack_region_input`'s arrays for ``x``, from the last ones when only a
        few elements changed since."""
        entry = self._entries.get((key, name))   # kept: its program's note gathers
        if entry is None or entry.x.shape != x.shape or entry.x.dtype != x.dtype:
            spec = gather_spec(io)
            if spec is None:
                return pack_region_input(name, x, io, block_in, block_out)
            return self._full(key, name, x, io, spec, block_in, block_out)
        flat, kept = x.reshape(-1), entry.x.reshape(-1)   # kept: the memo's own copy
        changed = np.flatnonzero(flat != kept)
        if changed.size > FULL_SHARE * flat.size:
            return self._full(key, name, x, io, gather_spec(io), block_in, block_out)
        if changed.size:
            at, values = entry.pos[changed], flat[changed]
            for tiles, v in zip(entry.tiles.values(),
                                split_planes(values) if entry.planes else (values,)):
                np.put(tiles, at, v.astype(tiles.dtype))
            kept[changed] = values
        self._entries.move_to_end((key, name))
        self.updates += 1
        return _read_only(entry.tiles)

    def _full(self, key: bytes, name: str, x: np.ndarray, io: dict, spec: dict,
              block_in: int, block_out: int) -> dict[str, np.ndarray]:
        tiles = pack_region_input(name, x, io, block_in, block_out)
        self.full_packs += 1
        pos = self._positions_of(x.shape, spec, block_in, block_out)
        self._entries.pop((key, name), None)
        if pos is not None:
            self._entries[(key, name)] = _Entry(x.copy(), tiles, pos, PLANES in io)
            self._evict()
        return _read_only(tiles)

    def _positions_of(self, shape: tuple[int, ...], spec: dict, block_in: int,
                      block_out: int) -> np.ndarray | None:
        sig = (shape, json.dumps({k: v for k, v in spec.items() if k != "tiles"},
                                 sort_keys=True), block_in, block_out)
        if sig not in self._positions:
            self._positions[sig] = tile_positions(shape, spec, block_in, block_out)
            while len(self._positions) > 16:
                self._positions.popitem(last=False)
        self._positions.move_to_end(sig)
        return self._positions[sig]

    def _evict(self) -> None:
        total = sum(e.nbytes for e in self._entries.values())
        while len(self._entries) > 1 and total > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            total -= old.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self._positions.clear()
