"""A self-check on every DSA layer of a run: no layer may beat physics.

A layer cannot finish in fewer cycles than its multiply-accumulates need on the
MAC array at full rate (``MACs / peak_macs_per_cycle``: the vector unit's lanes
never exceed the array's), and cannot move fewer DRAM bytes than it must: every
input element it depends on and every weight read once, every output element
written once (int8, channel padding not counted). A layer below either bound is
computing something other than the layer (a Linear that summed over H instead of
C did 36,864 cycles' work in 2,077), so the run report flags it.

:func:`layer_bounds` runs at compile time on the integer layer and its numbers
travel in the program's layer table; :func:`violations` runs on the measured row.
"""

from __future__ import annotations

import math

import numpy as np

from .ir import (
    Add,
    BatchMatmul,
    BiasAdd,
    Conv2d,
    Dense,
    GlobalAvgPool,
    Layer,
    Pool2d,
    Rescale,
)


def _elements(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _touched(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """How many of ``size`` input positions some output window reads (pads excluded)."""
    taps = (np.arange(out)[:, None] * stride - pad + np.arange(kernel)[None, :] * dilation)
    taps = taps[(taps >= 0) & (taps < size)]
    return int(np.unique(taps).size)


def _window_input(layer: Conv2d | Pool2d) -> int:
    """Input elements a conv or pool reads: strided windows may skip rows and columns."""
    n, c, h, w = layer.input.shape
    oh, ow = layer.output.shape[2:]
    if isinstance(layer, Conv2d):
        (kh, kw), (dh, dw) = layer.weight.shape[2:], layer.dilation
    else:
        (kh, kw), (dh, dw) = layer.kernel, (1, 1)
    pt, pl = layer.padding[0], layer.padding[1]
    rows = _touched(h, oh, kh, layer.strides[0], pt, dh)
    cols = _touched(w, ow, kw, layer.strides[1], pl, dw)
    return n * c * rows * cols


def layer_bounds(layer: Layer) -> tuple[int, int]:
    """(bytes the layer must read, bytes it must write) from DRAM, all int8."""
    if isinstance(layer, (Conv2d, Pool2d)):
        read = _window_input(layer)
    elif isinstance(layer, BatchMatmul):
        read = _elements(layer.a.shape) + _elements(layer.b.shape)
    elif isinstance(layer, Add):
        read = _elements(layer.a.shape) + (_elements(layer.b.shape)
                                          if layer.b.name != layer.a.name else 0)
    elif isinstance(layer, (Dense, GlobalAvgPool, BiasAdd, Rescale)):
        read = _elements(layer.input.shape)
    else:
        raise TypeError(f"no bounds for layer type {type(layer).__name__}")
    weight = getattr(layer, "weight", None)
    if weight is not None:
        read += int(weight.size)
    return read, _elements(layer.output.shape)


def compute_bound(macs: int, peak_macs_per_cycle: int) -> int:
    """The fewest cycles ``macs`` multiply-accumulates take at the array's full rate."""
    return math.ceil(macs / peak_macs_per_cycle) if macs else 0


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
