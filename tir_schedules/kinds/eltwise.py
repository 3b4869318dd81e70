"""Room: the element-wise layers on the vector unit, one pixel in, one pixel out:
residual add (``add``), per-channel bias add (``scale``) and rescale (``rescale``).

Tiles of (pixels, channel blocks), channel tiles outermost so the output-stage
table is loaded once per channel tile. Zero points leave through the REQUANT
bias: ``(a - za) * am + (b - zb) * bm = a * am + b * bm - (za * am + zb * bm)``;
rescale: ``x - zp``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from tvm import s_tir, te, tirx

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.checks import inputs_read, with_weights
from dsa_tvm.layers.ir import WIDE_CLIP, Add, AddConst, BiasAdd, QTensor, Rescale
from dsa_tvm.layers.layouts import image_dims, pack_activation
from dsa_tvm.layers.reference import apply_requant, centered

from ..intrinsics import SCALAR_AXPBY, alu_intrin, axpby_intrin
from ..names import ANN_DOUBLE_BUFFER, SCOPE_ACC
from ..output_stage import place_output, requant_stage
from ..tiling import divisors, lowest_estimate
from ..vector_unit import acc_fits, check_fits, no_tiling, stream_cycles
from .base import Kind, Recipe, UnsupportedLayer, requant_table

#: kind -> (int8 inputs, ALU passes per tile: the combination and the requant)
PASSES = {"rescale": (1, 1), "scale": (1, 2), "add": (2, 3)}


@dataclass(frozen=True)
class EltwiseShape:
    """``rescale``: y = requant(x); ``add``: y = requant(a * a_mult + b * b_mult);
    ``scale``: y = requant(x * a_mult) (a per-channel constant addend rides in the
    output-stage bias); over ``p`` pixels of ``cb`` channel blocks."""

    kind: str                           # "rescale" | "add" | "scale"
    p: int
    cb: int
    block: int
    output_zp: int
    clip: tuple[int, int]
    a_mult: int = 1
    b_mult: int = 0
    a_dtype: str = "int8"               # "int16": a wide operand (ACC16 loads)
    b_dtype: str = "int8"


@dataclass(frozen=True)
class EltwiseKnobs:
    tile_p: int          # pixels per tile (divides P)
    tile_cb: int         # channel blocks per tile (divides CB)
    double_buffer: bool


def eltwise(s: EltwiseShape) -> tirx.PrimFunc:
    """``rescale``: the output stage straight on the widened input; ``add``:
    ``acc = a * a_mult + b * b_mult`` first (both int8, widened)."""
    shape = (s.p, s.cb, s.block)
    params = te.placeholder((s.cb, 3, s.block), "int32", name="params")
    if s.kind == "rescale":
        x = te.placeholder(shape, s.a_dtype, name="x")
        return te.create_prim_func([x, params, requant_stage(x, params, s.output_zp, s.clip,
                                                             widen=True)])
    if s.kind == "scale":
        x = te.placeholder(shape, s.a_dtype, name="x")
        acc = te.compute(shape, lambda *i: x(*i).astype("int32") * tirx.IntImm("int32", s.a_mult),
                         name="acc")
        return te.create_prim_func([x, params, requant_stage(acc, params, s.output_zp, s.clip)])
    if s.kind != "add":
        raise ValueError(f"eltwise kind must be 'rescale', 'add' or 'scale', got {s.kind!r}")
    a = te.placeholder(shape, s.a_dtype, name="a")
    b = te.placeholder(shape, s.b_dtype, name="b")
    acc = te.compute(shape, lambda *i: tirx.call_pure_extern(
        "int32", SCALAR_AXPBY, a(*i).astype("int32"), b(*i).astype("int32"), s.a_mult, s.b_mult),
        name="acc")
    return te.create_prim_func([a, b, params, requant_stage(acc, params, s.output_zp, s.clip)])


# ----------------------------------------------------------------------------- knobs
def acc_rows(s: EltwiseShape, k: EltwiseKnobs) -> int:
    """Accumulator rows: the tile buffers (twice when double-buffered) and the table."""
    nbuf = 2 if k.double_buffer else 1
    tiles = 2 if s.kind == "rescale" else 4  # x, requant | a, b, acc, requant
    return nbuf * tiles * k.tile_p * k.tile_cb + 3 * k.tile_cb


def eltwise_fits(cfg: HardwareConfig, s: EltwiseShape, k: EltwiseKnobs) -> str | None:
    return acc_fits(cfg, acc_rows(s, k))


def estimate_eltwise_cycles(cfg: HardwareConfig, s: EltwiseShape, k: EltwiseKnobs) -> float:
    b = s.block
    rows = k.tile_p * k.tile_cb
    tiles = (s.p // k.tile_p) * (s.cb // k.tile_cb)
    n_in, passes = PASSES[s.kind]
    once = (s.cb // k.tile_cb) * (12 * k.tile_cb * b / cfg.bandwidth_bytes_per_cycle
                                  + cfg.latency_cycles)
    loads = [(rows * b * np.dtype(d).itemsize, 1) for d in (s.a_dtype, s.b_dtype)][:n_in]
    out_bytes = rows * b * (2 if tuple(s.clip) == WIDE_CLIP else 1)
    return stream_cycles(cfg, tiles, loads, passes * rows, passes, out_bytes,
                         k.double_buffer, once)


def candidate_eltwise_knobs(cfg: HardwareConfig, s: EltwiseShape) -> list[EltwiseKnobs]:
    """Every knob setting that fits (tile sizes divide their loops)."""
    return [k for db in (True, False) for tc in divisors(s.cb)
            for k in [EltwiseKnobs(t, tc, db) for t in divisors(s.p)]
            if eltwise_fits(cfg, s, k) is None]


def default_eltwise_knobs(cfg: HardwareConfig, s: EltwiseShape) -> EltwiseKnobs:
    """The candidate with the lowest estimate (larger tiles on ties: fewer instructions)."""
    cands = candidate_eltwise_knobs(cfg, s)
    if not cands:
        raise no_tiling(cfg, s, eltwise_fits(cfg, s, EltwiseKnobs(1, 1, False)))
    return lowest_estimate(cands, lambda k: estimate_eltwise_cycles(cfg, s, k))


def eltwise_instructions(cfg: HardwareConfig, s: EltwiseShape, k: EltwiseKnobs) -> int:
    tiles = (s.p // k.tile_p) * (s.cb // k.tile_cb)
    n_in, passes = PASSES[s.kind]
    return tiles * (n_in + passes + 1) + s.cb // k.tile_cb + 1


def _first_stage(s: EltwiseShape) -> str:
    """The stage the tile loops are split on (rescale has no ``acc``)."""
    return "requant" if s.kind == "rescale" else "acc"


# ----------------------------------------------------------------------------- schedule
def schedule_eltwise(func: tirx.PrimFunc, cfg: HardwareConfig, s: EltwiseShape,
                     k: EltwiseKnobs) -> s_tir.Schedule:
    """Tiles of (pixels, channel blocks), channel tiles outermost so the output-stage
    table is loaded once per channel tile."""
    check_fits(cfg, eltwise_fits(cfg, s, k), k)
    sch = s_tir.Schedule(func)
    first = sch.get_sblock(_first_stage(s))
    inputs = [sch.cache_read(first, i, SCOPE_ACC) for i in range(PASSES[s.kind][0])]
    p, cb, c = sch.get_loops(first)
    p_o, p_i = sch.split(p, [None, k.tile_p])
    cb_o, cb_i = sch.split(cb, [None, k.tile_cb])
    sch.reorder(cb_o, p_o, p_i, cb_i, c)
    for blk in inputs:
        sch.compute_at(blk, p_o)
    if s.kind in ("add", "scale"):
        sch.set_scope(first, 0, SCOPE_ACC)
        sch.tensorize(c, axpby_intrin(s.block, s.a_mult, s.b_mult, s.a_dtype, s.b_dtype)
                      if s.kind == "add" else alu_intrin("mul", s.block, s.a_dtype, imm=s.a_mult))
        place_output(sch, s, "int32", cb_o, p_o)
    else:
        place_output(sch, s, s.a_dtype, cb_o, p_o, placed=True)
    if k.double_buffer:
        sch.annotate(p_o, ANN_DOUBLE_BUFFER, 1)
    return sch


def eltwise_perf_shape(s: EltwiseShape) -> EltwiseShape:
    clip = s.clip if tuple(s.clip) == WIDE_CLIP else (-128, 127)   # int16 stores cost more
    return dataclasses.replace(s, output_zp=0, clip=clip, a_mult=1,
                               b_mult=1 if s.kind == "add" else 0)


def eltwise_tiles(s: EltwiseShape) -> dict[str, tuple[str, int]]:
    stage = "acc" if s.kind == "add" else "requant"
    return {"tile_p": (stage, 0), "tile_cb": (stage, 1)}


# ----------------------------------------------------------------------------- layers
def _pixels(t: QTensor) -> tuple[int, int]:
    """(pixels, channels) of a tensor in the blocked layout: what element-wise layers see."""
    n, c, h, w = image_dims(t.shape)
    return n * h * w, c


def _check_mult(layer, m: int) -> None:
    if not sem.INT32_MIN <= m <= sem.INT32_MAX:
        raise UnsupportedLayer(f"{layer.name}: rescale factor {m} exceeds the 32-bit ALU "
                               f"immediate")


def _pixels_channels(layer, ins: list[QTensor]) -> tuple[int, int]:
    """(pixels, channels) of the output, which every input must share."""
    p, c = _pixels(layer.output)
    for t in ins:
        if _pixels(t) != (p, c):
            raise UnsupportedLayer(f"{layer.name}: input {t.shape} and output "
                                   f"{layer.output.shape} differ in the blocked layout")
    return p, c


def _finish(layer, cfg: HardwareConfig, consts: bool, shape: EltwiseShape, c: int, bias,
            inputs: dict[str, QTensor]) -> Recipe:
    r = Recipe(KIND, shape, inputs)
    if consts:
        r.consts["params"] = requant_table(layer, bias, c, cfg.block_out)
    return r


def add_recipe(layer: Add, cfg: HardwareConfig, consts: bool) -> Recipe:
    if not layer.a.shape == layer.b.shape == layer.output.shape:
        raise UnsupportedLayer(f"{layer.name}: operands {layer.a.shape} + {layer.b.shape} -> "
                               f"{layer.output.shape}: only same-shape adds")
    p, c = _pixels_channels(layer, [layer.a, layer.b])
    for m in (layer.a_mult, layer.b_mult):
        _check_mult(layer, m)
    rq, block = layer.requant, cfg.block_out
    shape = EltwiseShape("add", p, ceil_div(c, block), block, rq.zero_point, rq.clip,
                         int(layer.a_mult), int(layer.b_mult), layer.a.dtype, layer.b.dtype)
    bias = -(layer.a.zero_point * layer.a_mult + layer.b.zero_point * layer.b_mult)
    return _finish(layer, cfg, consts, shape, c, bias, {"a": layer.a, "b": layer.b})


def bias_add_recipe(layer: BiasAdd, cfg: HardwareConfig, consts: bool) -> Recipe:
    p, c = _pixels_channels(layer, [layer.input])
    _check_mult(layer, layer.x_mult)
    if np.shape(layer.bias) != (c,):
        raise UnsupportedLayer(f"{layer.name}: bias of shape {np.shape(layer.bias)} for "
                               f"{c} channels")
    rq, block = layer.requant, cfg.block_out
    shape = EltwiseShape("scale", p, ceil_div(c, block), block, rq.zero_point, rq.clip,
                         int(layer.x_mult))
    bias = np.asarray(layer.bias, np.int64) - layer.input.zero_point * layer.x_mult
    return _finish(layer, cfg, consts, shape, c, bias, {"x": layer.input})


def add_const_recipe(layer: AddConst, cfg: HardwareConfig, consts: bool) -> Recipe:
    """The residual add with its second operand a constant region (the codes packed like
    an activation of the output's view)."""
    p, c = _pixels_channels(layer, [layer.input])
    if np.size(layer.const) != int(np.prod(layer.output.shape)):
        raise UnsupportedLayer(f"{layer.name}: constant of {np.size(layer.const)} codes for "
                               f"an output of shape {layer.output.shape}")
    for m in (layer.x_mult, layer.c_mult):
        _check_mult(layer, m)
    rq, block = layer.requant, cfg.block_out
    shape = EltwiseShape("add", p, ceil_div(c, block), block, rq.zero_point, rq.clip,
                         int(layer.x_mult), int(layer.c_mult))
    r = _finish(layer, cfg, consts, shape, c, -layer.input.zero_point * layer.x_mult,
                {"a": layer.input})
    if consts:
        packed = pack_activation(np.asarray(layer.const, np.int8).reshape(layer.output.shape),
                                 block)
        r.consts["b"] = packed.reshape(p, ceil_div(c, block), block)
    return r


def rescale_recipe(layer: Rescale, cfg: HardwareConfig, consts: bool) -> Recipe:
    p, c = _pixels_channels(layer, [layer.input])
    rq, block = layer.requant, cfg.block_out
    shape = EltwiseShape("rescale", p, ceil_div(c, block), block, rq.zero_point, rq.clip,
                         a_dtype=layer.input.dtype)
    return _finish(layer, cfg, consts, shape, c, -layer.input.zero_point, {"x": layer.input})


def _channel_axis(x: np.ndarray) -> int:
    return 1 if x.ndim == 4 else -1


def run_add(ly: Add, env: dict[str, np.ndarray]) -> np.ndarray:
    acc = sem.wrap_int32(centered(env[ly.a.name], ly.a) * ly.a_mult
                         + centered(env[ly.b.name], ly.b) * ly.b_mult)
    return apply_requant(acc, ly.requant, axis=_channel_axis(acc))


def run_bias_add(ly: BiasAdd, env: dict[str, np.ndarray]) -> np.ndarray:
    x = env[ly.input.name]
    axis = _channel_axis(x)
    shape = [1] * x.ndim
    shape[axis] = -1
    bias = np.asarray(ly.bias, np.int64).reshape(shape)
    acc = sem.wrap_int32(centered(x, ly.input) * ly.x_mult + bias)
    return apply_requant(acc, ly.requant, axis=axis)


def run_add_const(ly: AddConst, env: dict[str, np.ndarray]) -> np.ndarray:
    x = env[ly.input.name]
    c = np.asarray(ly.const, np.int64).reshape(x.shape)
    acc = sem.wrap_int32(centered(x, ly.input) * ly.x_mult + c * ly.c_mult)
    return apply_requant(acc, ly.requant, axis=_channel_axis(acc))


def run_rescale(ly: Rescale, env: dict[str, np.ndarray]) -> np.ndarray:
    acc = centered(env[ly.input.name], ly.input)
    return apply_requant(acc, ly.requant, axis=_channel_axis(acc)).reshape(ly.output.shape)


#: layer type -> (recipe, reference)
LAYERS = {Add: (add_recipe, run_add), BiasAdd: (bias_add_recipe, run_bias_add),
          AddConst: (add_const_recipe, run_add_const), Rescale: (rescale_recipe, run_rescale)}

def _same_shape(ly) -> bool:
    """Not a broadcasting Add (the binary room's)."""
    return not isinstance(ly, Add) or tuple(ly.a.shape) == tuple(ly.b.shape)


KIND = Kind(
    name="eltwise", layers=tuple(LAYERS), claims=_same_shape,
    recipe=lambda ly, cfg, consts: LAYERS[type(ly)][0](ly, cfg, consts),
    reference=lambda ly, env: LAYERS[type(ly)][1](ly, env),
    bounds=lambda ly: with_weights(ly, inputs_read(ly)),
    shape=EltwiseShape, knobs=EltwiseKnobs, build=eltwise, schedule=schedule_eltwise,
    fits=eltwise_fits, candidates=candidate_eltwise_knobs, default=default_eltwise_knobs,
    estimate=estimate_eltwise_cycles, instructions=eltwise_instructions, tiles=eltwise_tiles,
    extents=lambda s: {"tile_p": s.p, "tile_cb": s.cb},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    perf_shape=eltwise_perf_shape)
