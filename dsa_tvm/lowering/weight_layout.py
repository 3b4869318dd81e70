"""Re-encode constant weight regions of a finished program and lay DRAM out again.

What the weight packers share (``int4_weights``: two codes a byte; ``sparse_weights``:
compressed N:M tiles): find the constant regions that only tile-aligned WGT loads read,
give some of them new bytes, place every region again (a packed one is smaller; each
starts at an address its loads' element size divides), move every LOAD/STORE address with
its region, switch the packed regions' loads to the packed buffer and shrink the layer
table's weight bytes (the physics checks hold the program to them). The instructions and
their order stay, so the dependency tokens do too.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..intmath import ceil_div
from ..isa.encoding import EncodeError, encode_program_words
from ..isa.instructions import Buffer, Load, Store
from ..isa.program import Program, Region, region_alignment

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig


@dataclass(frozen=True)
class Packing:
    """How packed regions are stored: the buffer their loads switch to, their new bytes
    and dtype, and where a byte offset of the int8 tiles lands in the packed bytes."""

    buffer: Buffer
    encode: Callable[[Region], tuple[bytes, str]]
    offset: Callable[[int], int]


Move = tuple[int, "Load | Store", int, int]  # instruction index, it, region number, offset


def transfers(prog: Program, regions: list[Region], cfg: "HardwareConfig") -> list[Move] | None:
    """(index, instruction, region number, byte offset in the region) of every DMA; None
    when one does not lie inside a single region (then the layout is left alone)."""
    starts = [r.offset for r in regions]
    out = []
    for i, ins in enumerate(prog.instructions):
        if not isinstance(ins, (Load, Store)):
            continue
        unit = cfg.element_bytes(ins.buffer)
        first = ins.dram_base * unit
        end = (ins.dram_base + (ins.y_size - 1) * ins.x_stride + ins.x_size) * unit
        k = bisect.bisect_right(starts, first) - 1
        if k < 0 or end > regions[k].offset + regions[k].nbytes:
            return None
        out.append((i, ins, k, first - regions[k].offset))
    return out


def weight_only(regions: list[Region], moves: list[Move], cfg: "HardwareConfig") -> set[int]:
    """Regions that are read, and only read, by WGT loads starting at whole tiles."""
    tile = cfg.wgt_tile_bytes
    read, other = set(), set()
    for _, ins, k, rel in moves:
        if isinstance(ins, Load) and ins.buffer == Buffer.WGT and rel % tile == 0:
            read.add(k)
        else:
            other.add(k)
    return read - other


def _relocate(prog: Program, cfg: "HardwareConfig", regions: list[Region], moves: list[Move],
              packed: set[int], how: Packing) -> list[int]:
    """Pack ``packed`` (indices into ``regions``, sorted by offset) as ``how`` says and
    relocate everything; returns the indices of the loads that now read packed bytes."""
    for k in packed:
        regions[k].data, regions[k].dtype = how.encode(regions[k])
    new_offset, top = [], 0
    for r in regions:
        align = region_alignment(cfg, r.dtype)
        off = ceil_div(top, align) * align
        new_offset.append(off)
        top = off + r.nbytes
    instructions = list(prog.instructions)
    readers: list[int] = []
    for i, ins, k, rel in moves:
        if k in packed:
            instructions[i] = replace(ins, buffer=how.buffer, dram_base=(
                new_offset[k] + how.offset(rel)) // cfg.element_bytes(how.buffer))
            readers.append(i)
        elif new_offset[k] != regions[k].offset:
            unit = cfg.element_bytes(ins.buffer)
            instructions[i] = replace(ins, dram_base=(new_offset[k] + rel) // unit)
    for k, r in enumerate(regions):
        r.offset = new_offset[k]
    prog.instructions = instructions
    return readers


def pack_weights(prog: Program, cfg: "HardwareConfig", fits: Callable[[Region], bool],
                 how: Packing, then: Callable[[Program], None] | None = None) -> list[int]:
    """Pack, as ``how`` says, every constant region that only tile-aligned WGT loads read
    and that ``fits``; relocate the rest; run ``then`` on the result (instruction changes
    that follow from the packing), then encode the words once. Returns the loads that now
    read packed bytes (none: the program is unchanged)."""
    # empty regions sort first at a shared offset: a transfer belongs to the one after
    regions = sorted(prog.regions, key=lambda r: (r.offset, r.nbytes))
    moves = transfers(prog, regions, cfg)
    if moves is None:
        return []
    packed = {k for k in weight_only(regions, moves, cfg) if fits(regions[k])}
    if not packed:
        return []
    readers = _relocate(prog, cfg, regions, moves, packed, how)
    if then is not None:
        then(prog)
    try:  # the words change with the addresses: encode (and range-check) them again
        prog.mark_fields_checked(cfg, encode_program_words(prog.instructions, cfg))
    except EncodeError:
        pass  # left unmarked: running it reports the field, as for any program
    return readers


def layers_holding(prog: Program, indices: list[int]) -> list[dict]:
    """The layer-table entries whose instruction span holds one of ``indices``."""
    indices = sorted(indices)
    out = []
    for ly in prog.meta.get("layers", []):
        k = bisect.bisect_left(indices, ly["first"])
        if k < len(indices) and indices[k] <= ly["last"]:
            out.append(ly)
    return out


def shrink_layer_weights(prog: Program, readers: list[int], packed_bytes: Callable[[int], int],
                         mark: dict) -> None:
    """A layer whose weight loads now read packed bytes reads ``packed_bytes(weight
    bytes)``; its compulsory reads shrink as much, and ``mark`` joins its entry."""
    for ly in layers_holding(prog, readers):
        wb = int(ly.get("weight_bytes") or 0)
        saved = wb - packed_bytes(wb)
        ly["weight_bytes"] = wb - saved
        if ly.get("min_read_bytes") is not None:
            ly["min_read_bytes"] = max(0, ly["min_read_bytes"] - saved)
        ly.update(mark)
