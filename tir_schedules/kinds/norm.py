"""Room: integer softmax, LayerNorm and RMSNorm over the last axis, on the ``[norm]`` units.

The integer semantics (and so this room's CPU reference) are :mod:`dsa_tvm.isa.intnorm`;
the units' instruction is ``NORM`` (:mod:`dsa_tvm.isa.norm_unit`: parameter block and
cost). A row of ``n`` codes is ``ceil(n / block)`` consecutive blocks in the channels-last
layout ``[rows][CB][block]`` the DSA keeps every non-image tensor in, so the room emits
its program itself, no TIR: the parameter block once (an ACC load of a constant region),
then per tile of rows an ACC8 load (ACC16 for int16 rows, a wide residual stream: NORM's
``in_wide``), one NORM in place and an ACC8 store (ACC16 for int16 results, NORM's
``out_wide``: e.g. attention probabilities); with double
buffering the loads are prefetched on the load engine into alternating halves, so the
next tile's load overlaps this tile's NORM and store.

Cost: the estimate is the timing model run on exactly the instructions :func:`emit_norm`
emits (the NORM's own cycles are ``norm_unit.norm_cycles``), so it equals the simulated
cycles of the layer on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa import norm_unit as nu
from dsa_tvm.isa.formats import DRAM_SIZE_BITS, EXTENT_BITS
from dsa_tvm.isa.instructions import Buffer, NormOp
from dsa_tvm.layers.checks import elements, tensor_bytes, with_weights
from dsa_tvm.layers.intnorm import MAX_ROW, int_norm, int_softmax
from dsa_tvm.layers.ir import LayerNorm, RMSNorm, Softmax
from dsa_tvm.layers.layouts import same_bytes
from dsa_tvm.layers.reference import centered

from ..tiling import chunks, lowest_estimate
from ..vector_unit import emitted_cycles, tile_sizes
from .base import Kind, Recipe, UnsupportedLayer

OPS: dict[type, NormOp] = {Softmax: NormOp.SOFTMAX, LayerNorm: NormOp.LAYERNORM,
                           RMSNorm: NormOp.RMSNORM}
#: passes a unit makes over each row, per layer type (the ISA's definition)
PASSES: dict[type, int] = {t: nu.PASSES[op] for t, op in OPS.items()}
_MAX_FIELD = min((1 << DRAM_SIZE_BITS) - 1, (1 << EXTENT_BITS) - 1)

@dataclass(frozen=True)
class NormShape:
    """``rows`` rows of ``n`` codes through ``op``, ``block`` lanes per accumulator row."""

    op: NormOp
    rows: int
    n: int
    block: int
    in_zp: int = 0
    in_wide: bool = False   # int16 input rows (ACC16 loads, NORM's in_wide)
    out_wide: bool = False  # int16 results (NORM's out_wide, ACC16 stores)

@dataclass(frozen=True)
class NormKnobs:
    tile_rows: int       # rows per NORM (one load and one store each)
    double_buffer: bool  # two staging halves, loads prefetched on the load engine

def norm_cycles(cfg: HardwareConfig, layer: Softmax | LayerNorm | RMSNorm) -> int:
    """Cycles the ``[norm]`` units take for the layer (ValueError if the DSA has none)."""
    rows = int(np.prod(layer.input.shape[:-1], dtype=np.int64))
    return nu.norm_cycles(cfg, OPS[type(layer)], int(layer.input.shape[-1]), rows)

# ----------------------------------------------------------------------------- knobs
def _span(s: NormShape) -> int:
    return nu.row_span(s.n, s.block)

def acc_rows(s: NormShape, k: NormKnobs) -> int:
    """Accumulator rows: the parameter block and one or two staging tiles."""
    return nu.param_rows(s.op, s.n, s.block) + (2 if k.double_buffer else 1) * k.tile_rows * _span(s)

def norm_fits(cfg: HardwareConfig, s: NormShape, k: NormKnobs) -> str | None:
    if cfg.norm_units < 1:
        return f"'{cfg.name}' has no [norm] units (norm_units = 0)"
    if not 1 <= k.tile_rows <= s.rows:
        return f"tile of {k.tile_rows} rows for {s.rows} rows"
    if k.tile_rows * _span(s) > _MAX_FIELD:
        return f"a tile of {k.tile_rows * _span(s)} accumulator rows exceeds the DMA fields"
    need = acc_rows(s, k)
    if need > cfg.acc_depth:
        return (f"{need} accumulator rows (parameters and {k.tile_rows}-row tiles of "
                f"{s.n} codes) exceed the {cfg.acc_depth}-row accumulator")
    return None

def candidate_norm_knobs(cfg: HardwareConfig, s: NormShape) -> list[NormKnobs]:
    """Powers of two up to the largest tile that fits, and that one, single and double
    buffered."""
    out = []
    for db in (True, False):
        free = cfg.acc_depth - nu.param_rows(s.op, s.n, s.block)
        most = min(s.rows, free // ((2 if db else 1) * _span(s)), _MAX_FIELD // _span(s))
        out += [k for t in tile_sizes(most) for k in [NormKnobs(t, db)]
                if norm_fits(cfg, s, k) is None]
    return out

def default_norm_knobs(cfg: HardwareConfig, s: NormShape) -> NormKnobs:
    """The candidate with the lowest estimate (larger tiles on ties: fewer instructions)."""
    cands = candidate_norm_knobs(cfg, s)
    if not cands:
        raise ValueError(norm_fits(cfg, s, NormKnobs(1, False)) or "no tile fits")
    return lowest_estimate(cands, lambda k: estimate_norm_cycles(cfg, s, k))

def _tiles(s: NormShape, k: NormKnobs) -> list[tuple[int, int]]:
    return chunks(s.rows, k.tile_rows)

def norm_instructions(cfg: HardwareConfig, s: NormShape, k: NormKnobs) -> int:
    return 1 + 3 * len(_tiles(s, k))

def emit_norm(b, cfg: HardwareConfig, s: NormShape, k: NormKnobs, regions: dict) -> None:
    """Parameter block at row 0; tiles staged after it, alternating halves when
    double-buffered (the derived tokens order each half's reuse)."""
    prow = nu.param_rows(s.op, s.n, s.block)
    span = _span(s)
    b.load(Buffer.ACC, 0, b.addr(regions["params"], Buffer.ACC), 1, prow)
    src = Buffer.ACC16 if s.in_wide else Buffer.ACC8
    dst = Buffer.ACC16 if s.out_wide else Buffer.ACC8
    x, y = b.addr(regions["x"], src), b.addr(regions["y"], dst)
    for t, (r0, m) in enumerate(_tiles(s, k)):
        base = prow + (t % 2 if k.double_buffer else 0) * k.tile_rows * span
        b.load(src, base, x + r0 * span, 1, m * span, prefetch=k.double_buffer)
        b.norm(s.op, base, base, 0, m, s.n, s.in_zp, in_wide=s.in_wide, out_wide=s.out_wide)
        b.store(dst, base, y + r0 * span, 1, m * span)

@lru_cache(maxsize=256)
def estimate_norm_cycles(cfg: HardwareConfig, s: NormShape, k: NormKnobs) -> float:
    """The timing model on the instructions :func:`emit_norm` emits (and their tokens)."""
    rows = (s.rows * _span(s), s.block)
    return emitted_cycles(cfg, emit_norm, s, k, {
        "params": ("const", (nu.param_rows(s.op, s.n, s.block), s.block), "int32"),
        "x": ("input", rows, "int16" if s.in_wide else "int8"),
        "y": ("output", rows, "int16" if s.out_wide else "int8")})

# ----------------------------------------------------------------------------- layers
def norm_recipe(layer, cfg: HardwareConfig, consts: bool) -> Recipe:
    if int(cfg.norm_units) < 1:
        raise UnsupportedLayer(f"{layer.name}: '{cfg.name}' has no [norm] units (norm_units = 0)")
    shape = tuple(layer.input.shape)
    if not same_bytes(shape, tuple(layer.output.shape)):
        raise UnsupportedLayer(f"{layer.name}: input {shape} and output "
                               f"{tuple(layer.output.shape)} differ")
    if len(shape) == 4:
        raise UnsupportedLayer(f"{layer.name}: a 4-D tensor {shape} is an NCHW image on the "
                               f"DSA; the [norm] units normalize rows of the channels-last "
                               f"layout (give the layer a (rows, n) view)")
    n = int(shape[-1])
    rows = elements(shape[:-1])
    if not 1 <= n <= MAX_ROW:
        raise UnsupportedLayer(f"{layer.name}: rows of {n} codes (the units take 1..{MAX_ROW})")
    if not -128 <= layer.input.zero_point <= 127:
        raise UnsupportedLayer(f"{layer.name}: input zero point {layer.input.zero_point} "
                               f"is not int8")
    op = OPS[type(layer)]
    block = cfg.block_out
    r = Recipe(KIND, NormShape(op, rows, n, block, int(layer.input.zero_point),
                               layer.input.dtype == "int16", layer.output.dtype == "int16"),
               {"x": layer.input})
    if consts:
        r.consts["params"] = nu.pack_params(op, layer.params, n, block)
    return r

def run_norm(layer, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer reference: :mod:`dsa_tvm.isa.intnorm` on the layer's input codes."""
    x = env[layer.input.name]
    centered(x, layer.input)  # shape check
    x = np.asarray(x).reshape(layer.input.shape)
    wide = layer.output.dtype == "int16"
    if isinstance(layer, Softmax):
        y = int_softmax(x, layer.input.zero_point, layer.params, wide)
    else:
        y = int_norm(x, layer.input.zero_point, layer.params, wide)
    return y.reshape(layer.output.shape)  # the output's view (rows of the same last axis)

def norm_bounds(ly) -> tuple[int, int]:
    """Every code read and written once (the parameter block is not counted)."""
    return with_weights(ly, tensor_bytes(ly.input))

def describe_norm(ly) -> str:
    return (f"{type(ly).__name__} {ly.name}: {tuple(ly.input.shape)} over the last axis "
            f"-> {tuple(ly.output.shape)}")

KIND = Kind(
    name="norm", layers=(Softmax, LayerNorm, RMSNorm), recipe=norm_recipe, reference=run_norm,
    bounds=norm_bounds, describe=describe_norm,
    shape=NormShape, knobs=NormKnobs,
    fits=norm_fits, candidates=candidate_norm_knobs, default=default_norm_knobs,
    estimate=estimate_norm_cycles, instructions=norm_instructions,
    tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    perf_shape=lambda s: replace(s, in_zp=0),
    emit=emit_norm)

