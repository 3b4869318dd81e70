"""KV caches on int16 grids, kept by the host and handed to the region as byte planes.

K or V on an int16 grid reaches its attention matmul as two int8 byte planes, each the
weight tiles of its own matmul (``relay_passes.kinds.matmul_planes``). In a decode step
the planes are split from the cache concat's output: every step would split the whole
cache again (two element-wise passes over it) and move both planes. The split is
element-wise, so it commutes with the concat: the host, which holds the cache's int16
codes, splits them itself (``layers.reference.stacked_byte_planes``' arithmetic) and the
region splits only the new rows. Each plane is then an int8 cache concat like any other,
which :mod:`.cache_tiles` writes in place: the cache is read once a step, by the
attention, its bytes doubled against an int8 cache. An int16 input that only a split
reads (a prefill chunk's joined K or V, concatenated before the region) is split by the
host the same way, so the host lays each plane out as weight tiles (:mod:`.host_tiles`).
"""

from __future__ import annotations

import dataclasses

from ..layers.ir import Concat, Layer, QTensor, Region, Rescale, reader_layers
from ..layers.plane_split import is_split, split_layers

#: a plane input's name: the cache's, then this and the plane (``#hi``, ``#lo``); the
#: runtime's region names after ``#`` belong to the tensor before it (``llm.traffic``)
PLANE_TAG = "#"


def cache_planes(region: Region) -> tuple[Region, dict[str, tuple[QTensor, QTensor]]]:
    """``region`` with each int16 cache concat whose output only a byte-plane split reads
    as a split of the new rows and one int8 concat per plane, the cache's planes region
    inputs, and each int16 input only a split reads as its planes; and, by input name,
    its two plane inputs (hi, lo) the host makes."""
    inputs = {t.name for t in region.inputs}
    outputs = {t.name for t in region.outputs}
    readers = reader_layers(region.layers)
    swap: dict[str, tuple[Layer, ...]] = {}
    gone: set[str] = set()
    planes: dict[str, tuple[QTensor, QTensor]] = {}
    for c in region.layers:
        if not isinstance(c, Concat) or len(c.inputs) != 2:
            continue
        cache, new = c.inputs
        pair = readers.get(c.output.name, [])
        if (cache.name not in inputs or cache.name in outputs or cache.dtype != "int16"
                or len(readers.get(cache.name, [])) != 1 or c.output.name in outputs
                or len(pair) != 2):
            continue
        hi, lo = sorted(pair, key=lambda ly: type(ly).__name__ != "Rescale")
        if not is_split(hi, lo) or hi.output.name in outputs or lo.output.name in outputs:
            continue
        split, new_hi, new_lo = split_layers(f"{c.name}{PLANE_TAG}new", new)
        cache_hi, cache_lo = (QTensor(f"{cache.name}{PLANE_TAG}{p}", tuple(cache.shape),
                                      t.output.scale, 0) for p, t in (("hi", hi), ("lo", lo)))
        joined = tuple(c.output.shape)
        swap[c.name] = (*split,
                        Concat(f"{c.name}{PLANE_TAG}hi", (cache_hi, new_hi),
                               dataclasses.replace(hi.output, shape=joined), c.axis),
                        Concat(f"{c.name}{PLANE_TAG}lo", (cache_lo, new_lo),
                               dataclasses.replace(lo.output, shape=joined), c.axis))
        gone |= {hi.name, lo.name}
        planes[cache.name] = (cache_hi, cache_lo)
    for hi in region.layers:       # an int16 input only a split reads (a prefill's K, V)
        x = hi.input if isinstance(hi, Rescale) else None
        if x is None or x.name not in inputs or x.name in outputs or x.name in planes:
            continue
        pair = readers.get(x.name, [])
        lo = [ly for ly in pair if ly is not hi]
        if (len(pair) != 2 or len(lo) != 1 or not is_split(hi, lo[0])
                or {hi.output.name, lo[0].output.name} & outputs):
            continue
        gone |= {hi.name, lo[0].name}
        planes[x.name] = (hi.output, lo[0].output)   # the host's planes, by their names
    if not planes:
        return region, {}
    layers = [out for ly in region.layers if ly.name not in gone
              for out in swap.get(ly.name, (ly,))]
    ins = [p for t in region.inputs for p in planes.get(t.name, (t,))]
    return dataclasses.replace(region, inputs=ins, layers=layers), planes
