"""Room: zero insertion (:class:`~dsa_tvm.layers.ir.Dilate`), the data movement that lets a
transposed conv run as a stride-1 conv inside its region: DMA and one vector fill.

The output ``[N][OH][OW][CB][block]`` (``OH = (H - 1) * sh + 1``) is written exactly
once, in pieces that never overlap:

* one ALU ``MOV`` fills the low half of the staged accumulator rows with the input's
  zero point (what the conv must read as "nothing here": it subtracts that zero point);
* each input row is loaded in chunks into the other half (double-buffered) and stored
  with ``x_stride = sw * CB``: every ``sw``-th pixel of output row ``i * sh``;
* the ``sw - 1`` pixels between two of them come from the zero-point rows (one STORE
  per chunk, ``x_size = (sw - 1) * CB``, same stride), and the ``sh - 1`` all-zero-point
  output rows below come from them too, as contiguous stores.

Cost: every byte in and out at the DRAM bandwidth plus one latency per transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.formats import DRAM_SIZE_BITS
from dsa_tvm.isa.instructions import AluOp, Buffer
from dsa_tvm.layers.checks import inputs_read, with_weights
from dsa_tvm.layers.ir import Dilate

from ..vector_unit import MAX_DMA, staged_rows_knobs
from .base import Kind, Recipe, UnsupportedLayer


@dataclass(frozen=True)
class DilateShape:
    """``n x h x w`` input pixels of ``cb`` channel blocks, zeros inserted by ``factor``;
    ``zero_point`` is what the inserted pixels hold."""

    n: int
    h: int
    w: int
    cb: int
    block: int
    factor: tuple[int, int]
    zero_point: int


@dataclass(frozen=True)
class DilateKnobs:
    rows: int                 # accumulator rows staged: half zero-point rows, half data


def _ow(s: DilateShape) -> int:
    return (s.w - 1) * s.factor[1] + 1


def _areas(s: DilateShape, k: DilateKnobs) -> tuple[int, int, int]:
    """(zero-point rows, data rows per buffer, data buffers): the zero area is whole
    pixels, the data area the rest, split in two when two pixels fit in each half."""
    zero = max(s.cb, (k.rows // 2) // s.cb * s.cb)
    data = k.rows - zero
    return (zero, data // 2, 2) if data >= 2 * s.cb else (zero, data, 1)


def _transfers(s: DilateShape, k: DilateKnobs) -> list[tuple[str, int]]:
    """(engine op, rows moved) per transfer, in program order (one row = block bytes)."""
    sh, sw = s.factor
    zero, half, _ = _areas(s, k)
    ow, cb = _ow(s), s.cb
    wc, zc = max(1, half // cb), max(1, zero // (cb * max(sw - 1, 1)))
    row: list[tuple[str, int]] = []
    for w0 in range(0, s.w, wc):
        m = min(wc, s.w - w0)
        row += [("load", m * cb), ("store", m * cb)]
    if sw > 1:
        row += [("store", min(zc, s.w - 1 - j0) * (sw - 1) * cb) for j0 in range(0, s.w - 1, zc)]
    gap = (sh - 1) * ow * cb
    gaps = [("store", min(zero, gap - r0)) for r0 in range(0, gap, zero)]
    return [("alu", zero)] + (row + gaps) * (s.n * (s.h - 1)) + row * s.n


def dilate_fits(cfg: HardwareConfig, s: DilateShape, k: DilateKnobs) -> str | None:
    if k.rows > cfg.acc_depth:
        return f"{k.rows} staged rows exceed the {cfg.acc_depth}-row accumulator"
    if 2 * s.cb > k.rows:
        return f"a zero-point pixel and a data pixel ({2 * s.cb} rows) exceed {k.rows} staged rows"
    zero = _areas(s, k)[0]
    if (s.factor[1] - 1) * s.cb > zero:
        return (f"the {s.factor[1] - 1} zero-point pixels between two data pixels "
                f"({(s.factor[1] - 1) * s.cb} rows) exceed the {zero} zero-point rows staged")
    if s.factor[1] * s.cb > MAX_DMA:
        return f"DMA stride {s.factor[1] * s.cb} exceeds the {DRAM_SIZE_BITS}-bit DMA fields"
    return None


candidate_dilate_knobs, default_dilate_knobs = staged_rows_knobs(DilateKnobs, dilate_fits)


def estimate_dilate_cycles(cfg: HardwareConfig, s: DilateShape, k: DilateKnobs) -> float:
    """Every byte in and out at the DRAM bandwidth, one latency per transfer."""
    cycles = 0.0
    for op, rows in _transfers(s, k):
        if op == "alu":
            cycles += rows
        else:
            cycles += rows * s.block / cfg.bandwidth_bytes_per_cycle + cfg.latency_cycles
    return cycles


def dilate_instructions(cfg: HardwareConfig, s: DilateShape, k: DilateKnobs) -> int:
    return len(_transfers(s, k))


def emit_dilate(b, cfg: HardwareConfig, s: DilateShape, k: DilateKnobs, regions: dict) -> None:
    """The fill, then per input row its data stores, the zero-point pixels between them
    and the zero-point rows below (``_transfers`` lists the same transfers)."""
    buf = Buffer.ACC8
    sh, sw = s.factor
    zero, half, nbuf = _areas(s, k)
    ow, cb = _ow(s), s.cb
    wc, zc = max(1, half // cb), max(1, zero // (cb * max(sw - 1, 1)))
    x, y = b.addr(regions["x"], buf), b.addr(regions["y"], buf)
    b.alu(AluOp.MOV, 0, 0, 0, [(zero, 1, 1, 0)], imm=int(s.zero_point), use_imm=True)
    slot = 0
    for n in range(s.n):
        for i in range(s.h):
            out_row = (n * ((s.h - 1) * sh + 1) + i * sh) * ow
            for w0 in range(0, s.w, wc):
                m = min(wc, s.w - w0)
                base = zero + slot * half
                slot = (slot + 1) % nbuf
                b.load(buf, base, x + ((n * s.h + i) * s.w + w0) * cb, 1, m * cb, m * cb)
                b.store(buf, base, y + (out_row + w0 * sw) * cb, m, cb, sw * cb)
            if sw > 1:
                for j0 in range(0, s.w - 1, zc):
                    m = min(zc, s.w - 1 - j0)
                    b.store(buf, 0, y + (out_row + j0 * sw + 1) * cb, m, (sw - 1) * cb, sw * cb)
            if i == s.h - 1:
                continue
            gap, start = (sh - 1) * ow * cb, y + (out_row + ow) * cb
            for r0 in range(0, gap, zero):
                m = min(zero, gap - r0)
                b.store(buf, 0, start + r0, 1, m, m)


# ----------------------------------------------------------------------------- layer side
def dilate_recipe(layer: Dilate, cfg: HardwareConfig, consts: bool) -> Recipe:
    x, y = layer.input.shape, layer.output.shape
    sh, sw = layer.factor
    if len(x) != 4 or min(sh, sw) < 1 or tuple(y) != (x[0], x[1], (x[2] - 1) * sh + 1,
                                                      (x[3] - 1) * sw + 1):
        raise UnsupportedLayer(f"{layer.name}: {x} -> {y} is not a zero insertion by {(sh, sw)}")
    if (layer.input.scale, layer.input.zero_point) != (layer.output.scale,
                                                       layer.output.zero_point):
        raise UnsupportedLayer(f"{layer.name}: input and output grids differ (a copy needs one)")
    shape = DilateShape(x[0], x[2], x[3], ceil_div(x[1], cfg.block_out), cfg.block_out,
                        (sh, sw), int(layer.input.zero_point))
    return Recipe(KIND, shape, {"x": layer.input})


def run_dilate(ly: Dilate, env: dict[str, np.ndarray]) -> np.ndarray:
    x = env[ly.input.name].reshape(ly.input.shape)
    sh, sw = ly.factor
    y = np.full(ly.output.shape, ly.input.zero_point, np.int8)
    y[:, :, ::sh, ::sw] = x
    return y


def _describe(ly: Dilate) -> str:
    return (f"Dilate {ly.name}: {tuple(ly.input.shape)} zeros x{ly.factor} -> "
            f"{tuple(ly.output.shape)}")


def _bounds(ly: Dilate) -> tuple[int, int]:
    """Every input element read once, every output element (zero points too) written."""
    return with_weights(ly, inputs_read(ly))


KIND = Kind(
    name="dilate", layers=(Dilate,), recipe=dilate_recipe, reference=run_dilate,
    bounds=_bounds, describe=_describe,
    shape=DilateShape, knobs=DilateKnobs,
    fits=dilate_fits, candidates=candidate_dilate_knobs, default=default_dilate_knobs,
    estimate=estimate_dilate_cycles, instructions=dilate_instructions,
    tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, k.rows / cfg.acc_depth],
    emit=emit_dilate)
