"""Store constant weights that fit int4 two codes a byte, and load them with WGT4.

A part with ``dram.int4_weights`` sign-extends int4 weight tiles on their way into the
weight scratchpad (``Buffer.WGT4``). A W4A8 model's weights are int8 codes in [-8, 7]
after quantization (``quantize(..., weight_bits=4)``), so their tiles can live in DRAM at
half the bytes and every load of them moves half the bytes: what a decode step, which
reads every weight once, is bound by.

The pass runs on a finished region program. It picks the constant int8 regions that only
WGT loads read and whose codes all lie in [-8, 7] (the values decide, not a flag: an int8
model whose weights happen to fit gains too, and nothing changes numerically), packs them,
lays the DRAM regions out again (a packed one takes half the bytes) and moves every
LOAD/STORE address with its region. The instructions and their order stay, so the
dependency tokens do too. The layer table follows: a packed layer's weight bytes and its
compulsory DRAM reads halve (the physics checks hold the program to them).
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..intmath import ceil_div
from ..isa.encoding import EncodeError, encode_program_words
from ..isa.instructions import Buffer, Load, Store
from ..isa.program import INT4, Program, Region
from ..isa.semantics import INT4_MAX, INT4_MIN, pack_int4

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig


def _fits_int4(r: Region) -> bool:
    if r.data is None or r.dtype != "int8" or not r.nbytes:
        return False
    codes = np.frombuffer(r.data, dtype=np.int8)
    return bool(codes.min() >= INT4_MIN and codes.max() <= INT4_MAX)


def _transfers(prog: Program, regions: list[Region], cfg: "HardwareConfig"):
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


def pack_int4_weights(prog: Program, cfg: "HardwareConfig") -> Program:
    """``prog`` with its int4-fitting weight regions packed (in place; returned)."""
    if not cfg.packs_int4_weights:
        return prog
    # empty regions sort first at a shared offset: a transfer belongs to the one after
    regions = sorted(prog.regions, key=lambda r: (r.offset, r.nbytes))
    moves = _transfers(prog, regions, cfg)
    if moves is None:
        return prog
    packable = {k for k, r in enumerate(regions) if _fits_int4(r)}
    read_as_weights: set[int] = set()
    tile = cfg.wgt_tile_bytes
    for _, ins, k, rel in moves:
        if isinstance(ins, Load) and ins.buffer == Buffer.WGT and rel % tile == 0:
            read_as_weights.add(k)
        else:
            packable.discard(k)
    packed = packable & read_as_weights
    if not packed:
        return prog
    new_offset, top = [], 0
    for k, r in enumerate(regions):
        off = ceil_div(top, cfg.dram_align) * cfg.dram_align
        new_offset.append(off)
        top = off + (ceil_div(r.nbytes, 2) if k in packed else r.nbytes)
    instructions = list(prog.instructions)
    readers: set[int] = set()
    for i, ins, k, rel in moves:
        if k in packed:
            unit = cfg.element_bytes(Buffer.WGT4)
            instructions[i] = replace(ins, buffer=Buffer.WGT4,
                                      dram_base=(new_offset[k] + rel // 2) // unit)
            readers.add(i)
        elif new_offset[k] != regions[k].offset:
            unit = cfg.element_bytes(ins.buffer)
            instructions[i] = replace(ins, dram_base=(new_offset[k] + rel) // unit)
    for k, r in enumerate(regions):
        r.offset = new_offset[k]
        if k in packed:
            r.data = pack_int4(np.frombuffer(r.data, dtype=np.int8)).tobytes()
            r.dtype = INT4
    prog.instructions = instructions
    _halve_layer_weights(prog, sorted(readers))
    try:  # the words change with the addresses: encode (and range-check) them again
        prog.mark_fields_checked(cfg, encode_program_words(instructions, cfg))
    except EncodeError:
        pass  # left unmarked: running it reports the field, as for any program
    return prog


def _halve_layer_weights(prog: Program, readers: list[int]) -> None:
    """A layer whose weight loads now read int4 reads half its weight bytes."""
    for ly in prog.meta.get("layers", []):
        k = bisect.bisect_left(readers, ly["first"])
        if k == len(readers) or readers[k] > ly["last"]:
            continue
        wb = int(ly.get("weight_bytes") or 0)
        saved = wb - ceil_div(wb, 2)
        ly["weight_bytes"] = wb - saved
        if ly.get("min_read_bytes") is not None:
            ly["min_read_bytes"] = max(0, ly["min_read_bytes"] - saved)
        ly["int4_weights"] = True
