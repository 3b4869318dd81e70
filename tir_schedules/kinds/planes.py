"""Room: int16 codes split into two int8 byte planes stacked on the rows axis
(:class:`~dsa_tvm.layers.ir.BytePlanes`), the input of a plane dense (down_proj's W8A16,
``Dense.planes``).

The room emits its program itself, no TIR, as the norm room does: the REQUANT parameter
rows once (multiplier 1, shift 8), then per tile of rows an ACC16 load, ``hi =
REQUANT(x)`` (int8 clip) into a second staging tile, stored as the hi plane's rows, then
``lo = CLIP(MAC(x, hi, -256))`` in place, stored as the lo plane's rows (the same ops as
a softmax's planes, ``norm._store_planes``, with the planes stacked instead of
interleaved). Every code is read once (two bytes) and written once as two int8 codes:
the Rescale, Add and Concat this replaces moved eleven bytes per code.

Cost: the estimate is the timing model run on exactly the instructions
:func:`emit_planes` emits, so it equals the layer's simulated cycles on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa import semantics as sem
from dsa_tvm.isa.instructions import AluOp, Buffer
from dsa_tvm.layers.checks import elements, tensor_bytes, with_weights
from dsa_tvm.layers.ir import BytePlanes
from dsa_tvm.layers.reference import PLANE_SHIFT, centered, stacked_byte_planes

from ..tiling import chunks, lowest_estimate
from ..vector_unit import emitted_cycles, staged_tile_knobs, staged_tile_problem
from .base import Kind, Recipe, UnsupportedLayer

#: the hi plane's REQUANT parameter rows: bias 0, multiplier 1, shift 8
PARAMS = (0, 1, PLANE_SHIFT)


@dataclass(frozen=True)
class PlanesShape:
    """``n`` leading indices of ``m`` rows, ``span`` accumulator rows (channel blocks) a
    row, ``block`` lanes."""

    n: int
    m: int
    span: int
    block: int


@dataclass(frozen=True)
class PlanesKnobs:
    tile_rows: int       # rows per tile (one load, two stores)
    double_buffer: bool  # two staging halves, loads prefetched on the load engine


def acc_rows(s: PlanesShape, k: PlanesKnobs) -> int:
    """The parameter rows and the staging tiles: the rows and the hi plane beside them."""
    return len(PARAMS) + (2 if k.double_buffer else 1) * 2 * k.tile_rows * s.span


def planes_fits(cfg: HardwareConfig, s: PlanesShape, k: PlanesKnobs) -> str | None:
    return staged_tile_problem(cfg, k.tile_rows, s.m, s.span, acc_rows(s, k),
                               f"{k.tile_rows}-row tiles of {s.span} blocks and their hi planes")


def candidate_planes_knobs(cfg: HardwareConfig, s: PlanesShape) -> list[PlanesKnobs]:
    return staged_tile_knobs(cfg, s.m, len(PARAMS), 2, s.span, PlanesKnobs,
                             lambda cfg, k: planes_fits(cfg, s, k))


def default_planes_knobs(cfg: HardwareConfig, s: PlanesShape) -> PlanesKnobs:
    cands = candidate_planes_knobs(cfg, s)
    if not cands:
        raise ValueError(planes_fits(cfg, s, PlanesKnobs(1, False)) or "no tile fits")
    return lowest_estimate(cands, lambda k: estimate_planes_cycles(cfg, s, k))


def _tiles(s: PlanesShape, k: PlanesKnobs) -> list[tuple[int, int, int]]:
    """(leading index, first row, rows) of every tile."""
    return [(i, r0, m) for i in range(s.n) for r0, m in chunks(s.m, k.tile_rows)]


def planes_instructions(cfg: HardwareConfig, s: PlanesShape, k: PlanesKnobs) -> int:
    """The parameter load, six a tile (load, REQUANT, store, MAC, CLIP, store), the finish
    (the dependency pass may add a sync between a tile's stores)."""
    return 2 + 6 * len(_tiles(s, k))


def emit_planes(b, cfg: HardwareConfig, s: PlanesShape, k: PlanesKnobs, regions: dict) -> None:
    """Parameter rows at row 0; each tile's rows and hi plane staged after them, alternating
    halves when double-buffered."""
    prow, span = len(PARAMS), s.span
    b.load(Buffer.ACC, 0, b.addr(regions["params"], Buffer.ACC), 1, prow)
    x, y = b.addr(regions["x"], Buffer.ACC16), b.addr(regions["y"], Buffer.ACC8)
    area = 2 * k.tile_rows * span
    for t, (i, r0, m) in enumerate(_tiles(s, k)):
        rows = prow + (t % 2 if k.double_buffer else 0) * area
        tmp = rows + k.tile_rows * span
        b.load(Buffer.ACC16, rows, x + (i * s.m + r0) * span, 1, m * span,
               prefetch=k.double_buffer)
        every = [(m * span, 1, 1, 0)]
        b.alu(AluOp.REQUANT, tmp, rows, 0, every,
              imm=sem.pack_requant_imm(0, sem.INT8_MIN, sem.INT8_MAX))
        first = y + (2 * i * s.m + r0) * span                  # this tile's hi rows
        b.store(Buffer.ACC8, tmp, first, 1, m * span)
        b.alu(AluOp.MAC, rows, tmp, 0, every, imm=-(1 << PLANE_SHIFT), use_imm=True)
        b.alu(AluOp.CLIP, rows, rows, 0, every,
              imm=sem.pack_clip_imm(sem.INT8_MIN, sem.INT8_MAX), use_imm=True)
        b.store(Buffer.ACC8, rows, first + s.m * span, 1, m * span)   # its lo rows


@lru_cache(maxsize=256)
def estimate_planes_cycles(cfg: HardwareConfig, s: PlanesShape, k: PlanesKnobs) -> float:
    """The timing model on the instructions :func:`emit_planes` emits."""
    rows = s.n * s.m * s.span
    return emitted_cycles(cfg, emit_planes, s, k, {
        "params": ("const", (len(PARAMS), s.block), "int32"),
        "x": ("input", (rows, s.block), "int16"),
        "y": ("output", (2 * rows, s.block), "int8")})


# ----------------------------------------------------------------------------- layers
def planes_recipe(layer: BytePlanes, cfg: HardwareConfig, consts: bool) -> Recipe:
    x, y = layer.input, layer.output
    shape = tuple(x.shape)
    want = shape[:-2] + (2 * shape[-2], shape[-1]) if len(shape) >= 2 else None
    if len(shape) not in (2, 3) or tuple(y.shape) != want:
        raise UnsupportedLayer(f"{layer.name}: byte planes of a (..., M, K) rows tensor of "
                               f"rank 2 or 3 into (..., 2M, K); got {shape} -> {tuple(y.shape)}")
    if elements(shape) == 0:
        raise UnsupportedLayer(f"{layer.name}: an empty tensor {shape} has no planes to make")
    if (x.dtype, x.zero_point, y.dtype, y.zero_point) != ("int16", 0, "int8", 0):
        raise UnsupportedLayer(f"{layer.name}: byte planes take int16 codes with zero point 0 "
                               f"into int8 with zero point 0; got {x.dtype} (zero point "
                               f"{x.zero_point}) -> {y.dtype} (zero point {y.zero_point})")
    block = cfg.block_out
    s = PlanesShape(elements(shape[:-2]), shape[-2], ceil_div(shape[-1], block), block)
    r = Recipe(KIND, s, {"x": x})
    if consts:
        r.consts["params"] = np.repeat(np.array(PARAMS, np.int32)[:, None], block, axis=1)
    return r


def run_planes(layer: BytePlanes, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer reference (``layers.reference.stacked_byte_planes``)."""
    return stacked_byte_planes(centered(env[layer.input.name], layer.input))


KIND = Kind(
    name="planes", layers=(BytePlanes,), recipe=planes_recipe, reference=run_planes,
    bounds=lambda ly: with_weights(ly, tensor_bytes(ly.input)),
    shape=PlanesShape, knobs=PlanesKnobs,
    fits=planes_fits, candidates=candidate_planes_knobs, default=default_planes_knobs,
    estimate=estimate_planes_cycles, instructions=planes_instructions,
    tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    perf_shape=lambda s: s, emit=emit_planes)
