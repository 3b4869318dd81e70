"""Room: weaving ``sh * sw`` phase images into one (:class:`~dsa_tvm.layers.ir.Interleave`),
the data movement after the per-phase convs of a transposed conv whose kernel equals its
stride: DMA only.

Phase ``(a, b)`` holds the output pixels ``(i * sh + a, j * sw + b)``. Each of its rows
is loaded in chunks into the accumulator scratchpad (double-buffered) and stored with
``x_stride = sw * CB`` at pixel ``b`` of output row ``i * sh + a``: whole pixels move,
so any channel count works. Every output pixel is written exactly once.

Cost: every byte in and out at the DRAM bandwidth plus one latency per transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.formats import DRAM_SIZE_BITS
from dsa_tvm.isa.instructions import Buffer
from dsa_tvm.layers.checks import inputs_read, with_weights
from dsa_tvm.layers.ir import Interleave

from ..vector_unit import MAX_DMA, staged_rows_knobs
from .base import Kind, Recipe, UnsupportedLayer


@dataclass(frozen=True)
class WeaveShape:
    """``sh * sw`` phases of ``n x h x w`` pixels, ``cb`` channel blocks each."""

    n: int
    h: int
    w: int
    cb: int
    block: int
    factor: tuple[int, int]


@dataclass(frozen=True)
class WeaveKnobs:
    rows: int                 # accumulator rows staged (two halves when two pixels fit)


def _chunk(s: WeaveShape, k: WeaveKnobs) -> tuple[int, int]:
    """(pixels per transfer, buffers)."""
    if k.rows >= 2 * s.cb:
        return max(1, (k.rows // 2) // s.cb), 2
    return max(1, k.rows // s.cb), 1


def _transfers(s: WeaveShape, k: WeaveKnobs) -> list[int]:
    """Rows of each load (each one stored once), in program order."""
    wc, _ = _chunk(s, k)
    row = [min(wc, s.w - w0) * s.cb for w0 in range(0, s.w, wc)]
    return row * (s.n * s.h * s.factor[0] * s.factor[1])


def weave_fits(cfg: HardwareConfig, s: WeaveShape, k: WeaveKnobs) -> str | None:
    if k.rows > cfg.acc_depth:
        return f"{k.rows} staged rows exceed the {cfg.acc_depth}-row accumulator"
    if s.cb > k.rows:
        return f"one pixel's {s.cb} channel blocks exceed {k.rows} staged rows"
    if s.factor[1] * s.cb > MAX_DMA:
        return f"DMA stride {s.factor[1] * s.cb} exceeds the {DRAM_SIZE_BITS}-bit DMA fields"
    return None


candidate_weave_knobs, default_weave_knobs = staged_rows_knobs(WeaveKnobs, weave_fits)


def estimate_weave_cycles(cfg: HardwareConfig, s: WeaveShape, k: WeaveKnobs) -> float:
    """Every byte in and out at the DRAM bandwidth, one latency per transfer."""
    return sum(2 * rows * s.block / cfg.bandwidth_bytes_per_cycle + 2 * cfg.latency_cycles
               for rows in _transfers(s, k))


def weave_instructions(cfg: HardwareConfig, s: WeaveShape, k: WeaveKnobs) -> int:
    return 2 * len(_transfers(s, k))


def emit_weave(b, cfg: HardwareConfig, s: WeaveShape, k: WeaveKnobs, regions: dict) -> None:
    """Per phase, input row and chunk: one LOAD, one strided STORE."""
    buf = Buffer.ACC8
    sh, sw = s.factor
    wc, nbuf = _chunk(s, k)
    half = wc * s.cb
    ow, cb = s.w * sw, s.cb
    y = b.addr(regions["y"], buf)
    slot = 0
    for a in range(sh):
        for bb in range(sw):
            x = b.addr(regions[f"x{a * sw + bb}"], buf)
            for n in range(s.n):
                for i in range(s.h):
                    out_row = (n * s.h * sh + i * sh + a) * ow
                    for w0 in range(0, s.w, wc):
                        m = min(wc, s.w - w0)
                        base = slot * half
                        slot = (slot + 1) % nbuf
                        b.load(buf, base, x + ((n * s.h + i) * s.w + w0) * cb, 1, m * cb, m * cb)
                        b.store(buf, base, y + (out_row + w0 * sw + bb) * cb, m, cb, sw * cb)


# ----------------------------------------------------------------------------- layer side
def weave_recipe(layer: Interleave, cfg: HardwareConfig, consts: bool) -> Recipe:
    sh, sw = layer.factor
    y = tuple(layer.output.shape)
    if len(layer.inputs) != sh * sw or min(sh, sw) < 1:
        raise UnsupportedLayer(f"{layer.name}: {len(layer.inputs)} phases for factor {(sh, sw)}")
    x = tuple(layer.inputs[0].shape)
    for t in layer.inputs:
        if tuple(t.shape) != x or len(x) != 4 or y != (x[0], x[1], x[2] * sh, x[3] * sw):
            raise UnsupportedLayer(f"{layer.name}: phase {t.shape} does not weave into {y}")
        if (t.scale, t.zero_point) != (layer.output.scale, layer.output.zero_point):
            raise UnsupportedLayer(f"{layer.name}: phase '{t.name}' and the output differ in "
                                   f"scale/zero point (a copy needs one grid)")
    shape = WeaveShape(x[0], x[2], x[3], ceil_div(x[1], cfg.block_out), cfg.block_out, (sh, sw))
    return Recipe(KIND, shape, {f"x{i}": t for i, t in enumerate(layer.inputs)})


def run_weave(ly: Interleave, env: dict[str, np.ndarray]) -> np.ndarray:
    sh, sw = ly.factor
    y = np.empty(ly.output.shape, np.int8)
    for i, t in enumerate(ly.inputs):
        y[:, :, i // sw::sh, i % sw::sw] = env[t.name].reshape(t.shape)
    return y


def _describe(ly: Interleave) -> str:
    return (f"Interleave {ly.name}: {len(ly.inputs)} x {tuple(ly.inputs[0].shape)} "
            f"x{ly.factor} -> {tuple(ly.output.shape)}")


def _bounds(ly: Interleave) -> tuple[int, int]:
    return with_weights(ly, inputs_read(ly))


KIND = Kind(
    name="interleave", layers=(Interleave,), recipe=weave_recipe, reference=run_weave,
    bounds=_bounds, describe=_describe,
    shape=WeaveShape, knobs=WeaveKnobs,
    fits=weave_fits, candidates=candidate_weave_knobs, default=default_weave_knobs,
    estimate=estimate_weave_cycles, instructions=weave_instructions,
    tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, k.rows / cfg.acc_depth],
    emit=emit_weave)
