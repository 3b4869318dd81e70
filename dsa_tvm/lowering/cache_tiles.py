"""KV-cache concats that write the attention's weight tiles in place.

A decode step's region joins each layer's K or V cache (a region input) with the new
token's rows (a rows :class:`Concat`) and lays the joined rows out as the attention
matmul's weight tiles (a ``weight_tiles`` :class:`Permute`): the cache crosses DRAM
three more times than the attention reads it (read and written by the concat, read by
the movement). When the cache's length is a whole number of tiles, the host lays the
cache out in the joined operand's tiles itself (it holds the cache) and the region writes
only the tiles the new rows fill (:class:`TilesAppend`): the cache is read once, by the
attention, in one launch.
"""

from __future__ import annotations

import dataclasses

from tir_schedules.kinds import UnsupportedLayer, recipe

from ..hw.config import HardwareConfig
from ..layers.host_pack import APPEND
from ..layers.ir import Concat, Permute, Region, TilesAppend
from .host_tiles import tiles_note


def cache_appends(region: Region, cfg: HardwareConfig) -> Region:
    """``region`` with each cache concat and the weight-tiles movement after it as one
    :class:`TilesAppend` where that lowers (else as they were)."""
    inputs = {t.name for t in region.inputs}
    outputs = {t.name for t in region.outputs}
    readers = region.readers()
    made = {ly.output.name: ly for ly in region.layers}
    merged: dict[str, TilesAppend] = {}   # the Concat's name -> its replacement
    gone: set[str] = set()
    for p in region.layers:
        c = made.get(p.input.name) if isinstance(p, Permute) and p.weight_tiles else None
        if not isinstance(c, Concat) or len(c.inputs) != 2:
            continue
        cache = c.inputs[0]
        if (cache.name not in inputs or cache.name in outputs or readers.get(cache.name) != 1
                or c.output.name in outputs or readers.get(c.output.name) != 1):
            continue
        ta = TilesAppend(p.name, cache, c.inputs[1], p.output, tuple(c.output.shape), c.axis,
                         p.steps(), p.column_sums)
        try:
            recipe(ta, cfg, consts=False)
        except UnsupportedLayer:
            continue
        merged[c.name] = ta   # where the concat was: as soon as the new rows are made
        gone.add(p.name)
    if not merged:
        return region
    return dataclasses.replace(region, layers=[merged.get(ly.name, ly) for ly in region.layers
                                               if ly.name not in gone])


def io_entry(ta: TilesAppend) -> dict:
    """The cache input's ``io`` note: the host pads it with zero rows to the joined shape
    (``APPEND``), does the movement's steps and lays out the tiles (``host_pack``)."""
    return {**tiles_note(ta.output, ta.column_sums, ta.steps),
            APPEND: {"cache": list(ta.cache.shape), "joined": list(ta.joined),
                     "axis": int(ta.axis)}}
