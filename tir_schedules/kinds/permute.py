"""Room: reshape and transpose inside a region (``Permute`` layers), DMA only.

Both tensors live in the blocked layout (``dsa_tvm.layers.layouts``): a row per pixel
of an NCHW image or per row of a ``(..., K)`` matrix, ``ceil(C / block)`` blocks of
``block`` lanes each. A movement is a copy of whole blocks when every output element
keeps its lane inside its block and every output block is one input block with the
same valid lanes: the head split ``(B*S, H*D) -> (B*H, S, D)`` with ``D`` a multiple of
the block, the merge back, a transpose of the row axes (``(B,S,H,D) -> (B,H,S,D)`` seen
as rows of ``D``), the flatten of an NCHW image to rows ``(N*H*W, C)``. The room works
out the block map once (``block_map``), cuts it into runs of consecutive source blocks
and emits each group of equal runs at a constant source stride as one strided LOAD and
one contiguous STORE through the accumulator scratchpad. A movement that moves lanes
(the K transpose of ``Q K^T`` with ``K`` rows of head width, a reshape that splits a
block) has no DMA form: the layer is unsupported and the region stays on the CPU with
the reason.

Cost: DMA bytes at the DRAM bandwidth plus one latency per transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.instructions import Buffer
from dsa_tvm.layers.checks import inputs_read, with_weights
from dsa_tvm.layers.ir import Permute
from dsa_tvm.layers.layouts import image_dims

from ..vector_unit import MAX_DMA, staged_rows_knobs
from .base import Kind, Recipe, UnsupportedLayer


@dataclass(frozen=True)
class PermShape:
    """``runs``: the output's blocks in order as (first source block, run length) pieces
    of consecutive source blocks; ``blocks``: the output's block count."""

    blocks: int
    block: int
    runs: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class PermKnobs:
    rows: int                 # accumulator rows one transfer stages


def _blocks(shape: tuple[int, ...], block: int) -> tuple[np.ndarray, np.ndarray]:
    """(block index, lane) of every element of ``shape`` in row-major order."""
    n, c, h, w = image_dims(tuple(shape))
    size = n * c * h * w
    if len(shape) == 4:
        nn, cc, hh, ww = np.unravel_index(np.arange(size), (n, c, h, w))
        row = (nn * h + hh) * w + ww
    else:
        row, cc = np.divmod(np.arange(size), c)
    return row * ceil_div(c, block) + cc // block, cc % block


def block_map(layer: Permute, block: int) -> np.ndarray | str:
    """Source block of every output block, or why the movement is no block copy."""
    x, y = tuple(layer.input.shape), tuple(layer.output.shape)
    if int(np.prod(layer.view)) != int(np.prod(x)) or sorted(layer.perm) != list(
            range(len(layer.view))):
        return f"view {layer.view} / perm {layer.perm} do not fit the input {x}"
    if tuple(layer.view[p] for p in layer.perm) != y and int(np.prod(y)) != int(np.prod(x)):
        return f"the output {y} does not hold the input's {int(np.prod(x))} elements"
    src = layer.apply(np.arange(int(np.prod(x)))).reshape(-1)
    bx, lx = _blocks(x, block)
    by, ly = _blocks(y, block)
    if not np.array_equal(lx[src], ly):
        return (f"{x} -> {y} moves elements between lanes (the DSA moves whole {block}-lane "
                f"blocks; only the row axes may be permuted or regrouped)")
    nby = int(by.max()) + 1 if by.size else 0
    bm = np.full(nby, -1, np.int64)
    bm[by] = bx[src]
    if not np.array_equal(bm[by], bx[src]):
        return f"{x} -> {y} mixes input blocks in one output block"
    if not np.array_equal(np.bincount(by, minlength=nby),
                          np.bincount(bx, minlength=int(bx.max()) + 1)[bm]):
        return f"{x} -> {y} changes a block's valid lanes (a partial channel block)"
    return bm


def _runs(bm: np.ndarray) -> tuple[tuple[int, int], ...]:
    cut = np.flatnonzero(np.diff(bm) != 1) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [bm.size]])
    return tuple((int(bm[s]), int(e - s)) for s, e in zip(starts, ends))


def _transfers(s: PermShape, k: PermKnobs) -> list[tuple[int, int, int, int, int]]:
    """(source block, source stride, runs, run length, output block) per transfer."""
    cap = max(1, k.rows // 2 if k.rows >= 2 else k.rows)
    pieces: list[tuple[int, int]] = []
    for x0, n in s.runs:  # runs longer than the staging area, or a DMA row, in pieces
        step = min(cap, MAX_DMA)
        pieces += [(x0 + i, min(step, n - i)) for i in range(0, n, step)]
    out, y0, i = [], 0, 0
    while i < len(pieces):
        x0, n = pieces[i]
        g, d = 1, n
        if i + 1 < len(pieces) and pieces[i + 1][1] == n:
            d = pieces[i + 1][0] - x0
            if n <= d <= MAX_DMA:
                while (i + g < len(pieces) and pieces[i + g] == (x0 + g * d, n)
                       and (g + 1) * n <= cap and g < MAX_DMA):
                    g += 1
            else:
                d = n
        out.append((x0, d, g, n, y0))
        y0 += g * n
        i += g
    return out


def perm_fits(cfg: HardwareConfig, s: PermShape, k: PermKnobs) -> str | None:
    if k.rows > cfg.acc_depth or k.rows < 1:
        return f"{k.rows} staged rows do not fit the {cfg.acc_depth}-row accumulator"
    return None


candidate_perm_knobs, default_perm_knobs = staged_rows_knobs(PermKnobs, perm_fits)


def estimate_perm_cycles(cfg: HardwareConfig, s: PermShape, k: PermKnobs) -> float:
    """Every byte in and out at the DRAM bandwidth, one latency per transfer."""
    return sum(2 * g * n * s.block / cfg.bandwidth_bytes_per_cycle + 2 * cfg.latency_cycles
               for _, _, g, n, _ in _transfers(s, k))


def perm_instructions(cfg: HardwareConfig, s: PermShape, k: PermKnobs) -> int:
    return 2 * len(_transfers(s, k))


def emit_perm(b, cfg: HardwareConfig, s: PermShape, k: PermKnobs, regions: dict) -> None:
    """One strided LOAD and one STORE per transfer; staging alternates between two halves
    of the rows so the next load can overlap the previous store."""
    buf = Buffer.ACC8
    half = k.rows // 2 if k.rows >= 2 else 0
    x, y = regions["x"], regions["y"]
    for i, (x0, d, g, n, y0) in enumerate(_transfers(s, k)):
        base = (i % 2) * half
        b.load(buf, base, b.addr(x, buf) + x0, g, n, d)
        b.store(buf, base, b.addr(y, buf) + y0, 1, g * n, g * n)


def permute_recipe(layer: Permute, cfg: HardwareConfig, consts: bool) -> Recipe:
    if (layer.input.scale, layer.input.zero_point) != (layer.output.scale,
                                                       layer.output.zero_point):
        raise UnsupportedLayer(f"{layer.name}: input and output scale/zero point differ "
                               f"(a copy needs one grid)")
    bm = block_map(layer, cfg.block_out)
    if isinstance(bm, str):
        raise UnsupportedLayer(f"{layer.name}: {bm}")
    return Recipe(KIND, PermShape(int(bm.size), cfg.block_out, _runs(bm)), {"x": layer.input})


def run_permute(ly: Permute, env: dict[str, np.ndarray]) -> np.ndarray:
    return ly.apply(env[ly.input.name].reshape(ly.input.shape))


def _describe(ly: Permute) -> str:
    return (f"Permute {ly.name}: {tuple(ly.input.shape)} view {ly.view} perm {ly.perm} -> "
            f"{tuple(ly.output.shape)}")


def _bounds(ly: Permute) -> tuple[int, int]:
    return with_weights(ly, inputs_read(ly))


KIND = Kind(
    name="permute", layers=(Permute,), recipe=permute_recipe, reference=run_permute,
    bounds=_bounds, describe=_describe, shape=PermShape, knobs=PermKnobs,
    fits=perm_fits, candidates=candidate_perm_knobs, default=default_perm_knobs,
    estimate=estimate_perm_cycles, instructions=perm_instructions,
    tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, k.rows / cfg.acc_depth],
    emit=emit_perm)
