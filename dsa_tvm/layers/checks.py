"""A self-check on every DSA layer of a run: no layer may beat physics.

A layer cannot finish in fewer cycles than its multiply-accumulates need on the
MAC array at full rate (``MACs / peak_macs_per_cycle``: the vector unit's lanes
never exceed the array's), and cannot move fewer DRAM bytes than it must: every
input element it depends on and every weight read once, every output element
written once (int8, channel padding not counted). A layer below either bound is
computing something other than the layer (a Linear that summed over H instead of
C did 36,864 cycles' work in 2,077), so the run report flags it.

:func:`tir_schedules.kinds.layer_bounds` runs at compile time on the integer layer (each
room counts its own kind, with the helpers here) and its numbers travel in the
program's layer table; :func:`violations` runs on the measured row.
"""

from __future__ import annotations

import math

import numpy as np

from .ir import Layer, layer_inputs


def elements(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def touched(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """How many of ``size`` input positions some output window reads (pads excluded)."""
    taps = (np.arange(out)[:, None] * stride - pad + np.arange(kernel)[None, :] * dilation)
    taps = taps[(taps >= 0) & (taps < size)]
    return int(np.unique(taps).size)


def window_input(layer: Layer, kernel: tuple[int, int], dilation: tuple[int, int]) -> int:
    """Input elements a conv or pool reads through its ``kernel``: strided windows may
    skip rows and columns."""
    n, c, h, w = layer.input.shape
    oh, ow = layer.output.shape[2:]
    (kh, kw), (dh, dw) = kernel, dilation
    pt, pl = layer.padding[0], layer.padding[1]
    rows = touched(h, oh, kh, layer.strides[0], pt, dh)
    cols = touched(w, ow, kw, layer.strides[1], pl, dw)
    return n * c * rows * cols


def tensor_bytes(t) -> int:
    """DRAM bytes of a tensor: one a code, two for an int16 (wide) one."""
    return elements(t.shape) * (2 if getattr(t, "dtype", "int8") == "int16" else 1)


def inputs_read(layer: Layer) -> int:
    """Bytes of every distinct input tensor (one read each)."""
    seen = {t.name: t for t in layer_inputs(layer)}
    return sum(tensor_bytes(t) for t in seen.values())


def weight_bytes(layer: Layer) -> int:
    """int8 bytes of the layer's constant operands (its weight, a matmul's constant side):
    what a CIM part keeps programmed in its crossbars instead of reading."""
    total = 0
    for field in ("weight", "const"):  # a constant operand is read like a weight
        data = getattr(layer, field, None)
        if data is not None:
            total += int(np.size(data))
    return total


def with_weights(layer: Layer, read: int) -> tuple[int, int]:
    """(``read`` plus the layer's weight bytes, the output bytes): a layer's bounds."""
    return read + weight_bytes(layer), tensor_bytes(layer.output)


def compute_bound(macs: int, peak_macs_per_cycle: int) -> int:
    """The fewest cycles ``macs`` multiply-accumulates take at the array's full rate."""
    return math.ceil(macs / peak_macs_per_cycle) if macs else 0


def roofline_bound(macs: int, min_read: int | None, min_write: int | None,
                   peak_macs_per_cycle: int, bandwidth_bytes_per_cycle: float) -> int:
    """The fewest cycles a layer can take: its compute bound or its compulsory DRAM bytes
    (read + written, over the one DRAM bandwidth all transfers share), whichever is more.
    ``min_read`` is what the program's layer table says the DSA must read: for a conv
    whose input the host packs (a folded stem's im2col matrix) that is the packed
    matrix, not the unexpanded image."""
    moved = (min_read or 0) + (min_write or 0)
    return max(compute_bound(macs, peak_macs_per_cycle),
               math.ceil(moved / bandwidth_bytes_per_cycle) if moved else 0)


def violations(macs: int, cycles: int, dram_read: int, dram_written: int,
               min_read: int | None, min_written: int | None,
               peak_macs_per_cycle: int) -> list[str]:
    """Why a measured layer is impossible (empty: it is not)."""
    out = []
    bound = compute_bound(macs, peak_macs_per_cycle)
    if cycles < bound:
        out.append(f"{cycles:,} cycles < compute bound {bound:,} ({macs:,} MACs at "
                   f"{peak_macs_per_cycle} per cycle)")
    if min_read is not None and dram_read < min_read:
        out.append(f"read {dram_read:,} B < compulsory {min_read:,} B")
    if min_written is not None and dram_written < min_written:
        out.append(f"wrote {dram_written:,} B < compulsory {min_written:,} B")
    return out
