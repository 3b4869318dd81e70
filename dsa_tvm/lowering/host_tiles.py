"""Second operands of on-device batch matmuls that the host lays out as weight tiles.

An on-device matmul reads its second operand as the array's weight tiles, made in the
region by a ``weight_tiles`` :class:`Permute`: a DRAM round trip (read the rows, write the
tiles, read them back). When that operand is a region input that nothing else reads, the
host can move it (the Permute's steps: K^T's transpose, V's re-layout) and hand it over
as tiles already, as it does for a host-packed matmul's operand, and the movement goes: decode's V
cache is read once, in the layout the attention reads (``host_pack``'s ``weight_tiles``
entry; the column sums for the first operand's zero point come with it).
"""

from __future__ import annotations

import dataclasses

from ..layers.ir import Permute, QTensor, Region


def host_tiled_inputs(region: Region) -> dict[str, Permute]:
    """Region input name -> the weight-tiles movement the host can do instead."""
    inputs = {t.name for t in region.inputs}
    outputs = {t.name for t in region.outputs}
    readers = region.readers()
    out = {}
    for ly in region.layers:
        if (isinstance(ly, Permute) and ly.weight_tiles and ly.input.name in inputs
                and ly.input.name not in outputs and readers.get(ly.input.name) == 1):
            out[ly.input.name] = ly
    return out


def without_movements(region: Region, tiled: dict[str, Permute]) -> Region:
    """The region without the movements the host does."""
    gone = {p.name for p in tiled.values()}
    return dataclasses.replace(region, layers=[ly for ly in region.layers
                                               if ly.name not in gone])


def io_entry(p: Permute) -> dict:
    """The program's ``io`` note the runtime packs the input by (``host_pack``): the
    movement's (view, perm) steps (a transpose such as K^T's is the host's to do as well),
    then the tiles."""
    return tiles_note(p.output, p.column_sums, p.steps())


def tiles_note(output: QTensor, column_sums: int, steps) -> dict:
    """A ``weight_tiles`` io note: the steps, then the tiles of ``output`` (named so the
    region finds them), with their column sums times ``column_sums``."""
    return {"shape": list(output.shape), "column_sums": int(column_sums),
            "tiles": output.name,
            "steps": [[list(view), list(perm)] for view, perm in steps]}
