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

A softmax with ``planes`` (its int16 results as two int8 byte planes, rows interleaved,
the operand of a planes batch matmul: attention's P @ V) splits each tile on the ALU
before it leaves: ``hi = REQUANT(y)`` (multiplier 1, shift 8, int8 clip: three more
parameter rows) into a second staging tile, stored to the even rows; ``y = CLIP(MAC(y,
hi, -256))`` stored to the odd rows (two strided ACC8 stores). The int16 probabilities
then never cross DRAM: the planes are as many bytes.

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
from dsa_tvm.isa import semantics as sem
from dsa_tvm.isa.instructions import AluOp, Buffer, NormOp
from dsa_tvm.layers.checks import elements, tensor_bytes, with_weights
from dsa_tvm.layers.intnorm import MAX_ROW, int_norm, int_softmax
from dsa_tvm.layers.ir import LayerNorm, RMSNorm, Softmax
from dsa_tvm.layers.layouts import same_bytes
from dsa_tvm.layers.reference import PLANE_SHIFT, byte_planes, centered

from ..tiling import chunks, lowest_estimate
from ..vector_unit import emitted_cycles, staged_tile_knobs, staged_tile_problem
from .base import Kind, Recipe, UnsupportedLayer

OPS: dict[type, NormOp] = {Softmax: NormOp.SOFTMAX, LayerNorm: NormOp.LAYERNORM,
                           RMSNorm: NormOp.RMSNORM}
#: passes a unit makes over each row, per layer type (the ISA's definition)
PASSES: dict[type, int] = {t: nu.PASSES[op] for t, op in OPS.items()}

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
    planes: bool = False    # int16 results stored as int8 byte planes, rows interleaved

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

def _staged(s: NormShape) -> int:
    """Staging tiles per buffer: the rows, and the high plane's beside them (``planes``)."""
    return 2 if s.planes else 1


#: the high plane's REQUANT parameter rows (bias, multiplier, shift) after the unit's
PLANE_PARAMS = (0, 1, PLANE_SHIFT)


def param_rows(s: NormShape) -> int:
    """The unit's parameter block, and the high plane's REQUANT rows (``planes``)."""
    return nu.param_rows(s.op, s.n, s.block) + len(PLANE_PARAMS) * s.planes


def acc_rows(s: NormShape, k: NormKnobs) -> int:
    """Accumulator rows: the parameter block and one or two staging areas."""
    return (param_rows(s)
            + (2 if k.double_buffer else 1) * _staged(s) * k.tile_rows * _span(s))

def norm_fits(cfg: HardwareConfig, s: NormShape, k: NormKnobs) -> str | None:
    if cfg.norm_units < 1:
        return f"'{cfg.name}' has no [norm] units (norm_units = 0)"
    return staged_tile_problem(cfg, k.tile_rows, s.rows, _span(s), acc_rows(s, k),
                               f"parameters and {k.tile_rows}-row tiles of {s.n} codes")

def candidate_norm_knobs(cfg: HardwareConfig, s: NormShape) -> list[NormKnobs]:
    return staged_tile_knobs(cfg, s.rows, param_rows(s), _staged(s), _span(s), NormKnobs,
                             lambda cfg, k: norm_fits(cfg, s, k))

def default_norm_knobs(cfg: HardwareConfig, s: NormShape) -> NormKnobs:
    """The candidate with the lowest estimate (larger tiles on ties: fewer instructions)."""
    cands = candidate_norm_knobs(cfg, s)
    if not cands:
        raise ValueError(norm_fits(cfg, s, NormKnobs(1, False)) or "no tile fits")
    return lowest_estimate(cands, lambda k: estimate_norm_cycles(cfg, s, k))

def _tiles(s: NormShape, k: NormKnobs) -> list[tuple[int, int]]:
    return chunks(s.rows, k.tile_rows)

def norm_instructions(cfg: HardwareConfig, s: NormShape, k: NormKnobs) -> int:
    return 1 + (7 if s.planes else 3) * len(_tiles(s, k))

def emit_norm(b, cfg: HardwareConfig, s: NormShape, k: NormKnobs, regions: dict) -> None:
    """Parameter block at row 0; tiles staged after it, alternating halves when
    double-buffered (the derived tokens order each half's reuse)."""
    prow = param_rows(s)
    span = _span(s)
    b.load(Buffer.ACC, 0, b.addr(regions["params"], Buffer.ACC), 1, prow)
    src = Buffer.ACC16 if s.in_wide else Buffer.ACC8
    dst = Buffer.ACC16 if s.out_wide and not s.planes else Buffer.ACC8
    x, y = b.addr(regions["x"], src), b.addr(regions["y"], dst)
    area = _staged(s) * k.tile_rows * span
    for t, (r0, m) in enumerate(_tiles(s, k)):
        base = prow + (t % 2 if k.double_buffer else 0) * area
        b.load(src, base, x + r0 * span, 1, m * span, prefetch=k.double_buffer)
        b.norm(s.op, base, base, 0, m, s.n, s.in_zp, in_wide=s.in_wide,
               out_wide=s.out_wide or s.planes)
        if s.planes:
            _store_planes(b, base, base + k.tile_rows * span, prow - len(PLANE_PARAMS),
                          y + 2 * r0 * span, m, span)
        else:
            b.store(dst, base, y + r0 * span, 1, m * span)


def _store_planes(b, rows: int, tmp: int, hi_params: int, dram: int, m: int,
                  span: int) -> None:
    """The ``m`` int16 rows at ``rows`` as byte planes (``layers.reference.byte_planes``):
    ``hi`` made in ``tmp`` by the REQUANT of ``hi_params`` and stored to the even rows
    from ``dram``, then ``lo`` in place, stored to the odd rows."""
    every = [(m * span, 1, 1, 0)]
    b.alu(AluOp.REQUANT, tmp, rows, hi_params, every,
          imm=sem.pack_requant_imm(0, sem.INT8_MIN, sem.INT8_MAX))
    b.store(Buffer.ACC8, tmp, dram, m, span, 2 * span)
    b.alu(AluOp.MAC, rows, tmp, 0, every, imm=-(1 << PLANE_SHIFT), use_imm=True)
    b.alu(AluOp.CLIP, rows, rows, 0, every,
          imm=sem.pack_clip_imm(sem.INT8_MIN, sem.INT8_MAX), use_imm=True)
    b.store(Buffer.ACC8, rows, dram + span, m, span, 2 * span)

@lru_cache(maxsize=256)
def estimate_norm_cycles(cfg: HardwareConfig, s: NormShape, k: NormKnobs) -> float:
    """The timing model on the instructions :func:`emit_norm` emits (and their tokens)."""
    rows = (s.rows * _span(s), s.block)
    return emitted_cycles(cfg, emit_norm, s, k, {
        "params": ("const", (param_rows(s), s.block), "int32"),
        "x": ("input", rows, "int16" if s.in_wide else "int8"),
        "y": ("output", (2 * rows[0], s.block) if s.planes else rows,
              "int16" if s.out_wide and not s.planes else "int8")})

# ----------------------------------------------------------------------------- layers
def norm_recipe(layer, cfg: HardwareConfig, consts: bool) -> Recipe:
    if int(cfg.norm_units) < 1:
        raise UnsupportedLayer(f"{layer.name}: '{cfg.name}' has no [norm] units (norm_units = 0)")
    shape = tuple(layer.input.shape)
    planes = bool(getattr(layer, "planes", False))
    if planes:
        why = planes_output_problem(layer)
        if why:
            raise UnsupportedLayer(f"{layer.name}: {why}")
    elif not same_bytes(shape, tuple(layer.output.shape)):
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
                               layer.input.dtype == "int16", layer.output.dtype == "int16",
                               planes), {"x": layer.input})
    if consts:
        r.consts["params"] = nu.pack_params(op, layer.params, n, block)
        if planes:
            hi = np.repeat(np.array(PLANE_PARAMS, np.int32)[:, None], block, axis=1)
            r.consts["params"] = np.concatenate([r.consts["params"], hi])
    return r

def run_norm(layer, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer reference: :mod:`dsa_tvm.isa.intnorm` on the layer's input codes."""
    x = env[layer.input.name]
    centered(x, layer.input)  # shape check
    x = np.asarray(x).reshape(layer.input.shape)
    wide = layer.output.dtype == "int16"
    if isinstance(layer, Softmax) and layer.planes:
        y = byte_planes(int_softmax(x, layer.input.zero_point, layer.params, True))
    elif isinstance(layer, Softmax):
        y = int_softmax(x, layer.input.zero_point, layer.params, wide)
    else:
        y = int_norm(x, layer.input.zero_point, layer.params, wide)
    return y.reshape(layer.output.shape)  # the output's view (rows of the same last axis)

def planes_output_problem(ly: Softmax) -> str | None:
    """None if ``ly.output`` can hold its int16 results as interleaved byte planes (int8,
    zero point 0, the input's rows twice over), else why not."""
    x, y = tuple(ly.input.shape), tuple(ly.output.shape)
    if y[-1:] != x[-1:] or elements(y) != 2 * elements(x) or len(x) < 2:
        return f"byte planes of {x} need an output of twice the rows, got {y}"
    if ly.output.dtype != "int8" or ly.output.zero_point != 0:
        return (f"byte planes are int8 with zero point 0, got {ly.output.dtype} with "
                f"{ly.output.zero_point}")
    return None


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

