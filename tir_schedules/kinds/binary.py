"""Room: two-input element-wise layers on the vector unit whose second operand may
broadcast: the product of two activations (``mul``: an SE channel gate, SiLU's
``x * sigmoid(x)``) and the broadcasting add (``add``: ``[N, C, 1, 1] + [N, C, H, W]``).

Both operands are int8 (a product's may be int16) tiles in the accumulator. The full
operand ``a`` is ``(n, hw, cb, block)``; ``b`` is ``(nb, hwb, cb, block)`` with ``nb`` in
``{n, 1}`` and ``hwb`` in ``{hw, 1}``, so a broadcast is an ALU source stride of 0 along
the pixel (or image) loop and its tile is one row per channel block: no data is
repeated in DRAM or in the scratchpad. ``mul``: ``(a - za) * (b - zb) = (a - za) * b - zb * a +
za * zb`` as SUB (immediate), MUL (tensor), MAC (immediate), the constant ``za * zb``
in the REQUANT bias (no temporary tile; a zero point of 0 drops its op). ``add``:
``a * am + b * bm`` (MUL, MAC immediates), zero points in the bias as in the
``eltwise`` room, which keeps every same-shape add (its programs do not change).

A product quantized to int16 (REQUANT's wide mode: the layer's clip is ``WIDE_CLIP``)
is stored as int16 (ACC16); its int16 bytes count in the bounds and the estimate. A
product's operands may be int16 too (ACC16 loads; an LLM's ``silu(gate) * up`` on int16
grids): the ALU's lanes are int32 and hold two int16 codes' product (with zero points,
the wrap-around is the reference's too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache

import numpy as np
import tvm
from tvm import s_tir, te, tirx
from tvm.script import tirx as T

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.checks import inputs_read, with_weights
from dsa_tvm.layers.ir import WIDE_CLIP, Add, Mul, QTensor
from dsa_tvm.layers.layouts import broadcast_dims, image_dims
from dsa_tvm.layers.reference import apply_requant, centered

from ..intrinsics import SCALAR_AXPBY, _alu_call, _Script, _widen, axpby_intrin
from ..names import ANN_DOUBLE_BUFFER, SCOPE_ACC
from ..output_stage import place_output, requant_stage
from ..tiling import divisors, lowest_estimate
from ..vector_unit import acc_fits, check_fits, no_tiling, stream_cycles
from .base import Kind, Recipe, UnsupportedLayer, describe_layer, requant_table

#: scalar body of the product stage, ``(a - za) * b - zb * a`` (opaque: the simplifier
#: must not rewrite it away from the intrinsic's description)
SCALAR_MUL = "dsa.mul_scalar"


@dataclass(frozen=True)
class BinaryShape:
    """``mul``: y = requant((a - k1) * b - k2 * a); ``add``: y = requant(a * k1 + b * k2);
    ``a`` over ``n`` images of ``hw`` pixels, ``b`` over ``nb`` x ``hwb``, ``cb`` channel
    blocks of ``block`` lanes."""

    kind: str                           # "mul" | "add"
    n: int
    hw: int
    nb: int
    hwb: int
    cb: int
    block: int
    output_zp: int
    clip: tuple[int, int]
    k1: int = 0
    k2: int = 0
    a_dtype: str = "int8"               # "int16": a wide operand (ACC16 loads), mul only
    b_dtype: str = "int8"


@dataclass(frozen=True)
class BinaryKnobs:
    tile_p: int          # pixels per tile (divides hw)
    tile_cb: int         # channel blocks per tile (divides cb)
    double_buffer: bool


def _ops(s: BinaryShape) -> int:
    """ALU passes of the combination (the requant is one more)."""
    if s.kind == "add":
        return 2
    return 1 + (s.k1 != 0) + (s.k2 != 0)


@cache
def mul_intrin(block: int, za: int, zb: int, b_dtype: str = "int8",
               a_dtype: str = "int8") -> str:
    """``d = (a - za) * b - zb * a`` on one accumulator row: SUB imm, MUL, MAC imm (the ops
    of a zero point of 0 dropped)."""
    bo = block
    name = f"dsa.binmul_{bo}_{za}_{zb}_{b_dtype}" + ("" if a_dtype == "int8" else f"_{a_dtype}")

    @_Script.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, d: T.handle):
        A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
        B = T.match_buffer(b, (bo,), b_dtype, offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(A[0:bo], B[0:bo])
            T.writes(D[0:bo])
            for o in T.serial(bo):
                with T.sblock("mul"):
                    vo = T.axis.remap("S", [o])
                    D[vo] = T.call_pure_extern("int32", SCALAR_MUL, _widen(A[vo], a_dtype),
                                               _widen(B[vo], b_dtype), za, zb)

    calls = [("sub", "A", za, 1), ("mul", "D", 0, 0)] if za else [("mul", "A", 0, 0)]
    calls += [("mac", "A", -zb, 1)] if zb else []
    impl = _impl(bo, b_dtype, tuple(calls), a_dtype)
    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name


def _impl(bo: int, b_dtype: str, calls: tuple, a_dtype: str = "int8"):
    """The implementation of :func:`mul_intrin`: 1 to 3 ALU calls (TVMScript has no loops
    over Python lists of statements, so one function per count)."""
    def call(op, src, imm, use_imm, A, B, D):
        a = {"A": A, "D": D}[src]
        return _alu_call(op, D, a, a if use_imm else B, imm, use_imm)

    (o1, s1, i1, u1) = calls[0]
    if len(calls) == 1:
        @_Script.prim_func(s_tir=True)
        def impl1(a: T.handle, b: T.handle, d: T.handle):
            A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
            B = T.match_buffer(b, (bo,), b_dtype, offset_factor=1, scope=SCOPE_ACC)
            D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
            with T.sblock("root"):
                T.reads(A[0:bo], B[0:bo])
                T.writes(D[0:bo])
                T.evaluate(call(o1, s1, i1, u1, A, B, D))
        return impl1
    (o2, s2, i2, u2) = calls[1]
    if len(calls) == 2:
        @_Script.prim_func(s_tir=True)
        def impl2(a: T.handle, b: T.handle, d: T.handle):
            A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
            B = T.match_buffer(b, (bo,), b_dtype, offset_factor=1, scope=SCOPE_ACC)
            D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
            with T.sblock("root"):
                T.reads(A[0:bo], B[0:bo])
                T.writes(D[0:bo])
                T.evaluate(call(o1, s1, i1, u1, A, B, D))
                T.evaluate(call(o2, s2, i2, u2, A, B, D))
        return impl2
    (o3, s3, i3, u3) = calls[2]

    @_Script.prim_func(s_tir=True)
    def impl3(a: T.handle, b: T.handle, d: T.handle):
        A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
        B = T.match_buffer(b, (bo,), b_dtype, offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(A[0:bo], B[0:bo])
            T.writes(D[0:bo])
            T.evaluate(call(o1, s1, i1, u1, A, B, D))
            T.evaluate(call(o2, s2, i2, u2, A, B, D))
            T.evaluate(call(o3, s3, i3, u3, A, B, D))
    return impl3


def binary(s: BinaryShape) -> tirx.PrimFunc:
    """``acc`` from the two tiles (b read at image 0 / pixel 0 where it broadcasts), then
    the output stage."""
    a = te.placeholder((s.n, s.hw, s.cb, s.block), s.a_dtype, name="a")
    b = te.placeholder((s.nb, s.hwb, s.cb, s.block), s.b_dtype, name="b")
    params = te.placeholder((s.cb, 3, s.block), "int32", name="params")
    if s.kind not in ("mul", "add"):
        raise ValueError(f"binary kind must be 'mul' or 'add', got {s.kind!r}")
    fn = SCALAR_MUL if s.kind == "mul" else SCALAR_AXPBY

    def value(i, p, o, c):
        bv = b[i if s.nb > 1 else 0, p if s.hwb > 1 else 0, o, c]
        return tirx.call_pure_extern("int32", fn, a[i, p, o, c].astype("int32"),
                                     bv.astype("int32"), s.k1, s.k2)

    acc = te.compute(a.shape, value, name="acc")
    return te.create_prim_func([a, b, params, requant_stage(acc, params, s.output_zp, s.clip)])


# ----------------------------------------------------------------------------- knobs
def acc_rows(s: BinaryShape, k: BinaryKnobs) -> int:
    """Accumulator rows: a, b, acc and requant tiles (twice when double-buffered), the table."""
    nbuf = 2 if k.double_buffer else 1
    rows = k.tile_p * k.tile_cb
    b_rows = rows if s.hwb > 1 else k.tile_cb
    return nbuf * (3 * rows + b_rows) + 3 * k.tile_cb


def binary_fits(cfg: HardwareConfig, s: BinaryShape, k: BinaryKnobs) -> str | None:
    return acc_fits(cfg, acc_rows(s, k))


def estimate_binary_cycles(cfg: HardwareConfig, s: BinaryShape, k: BinaryKnobs) -> float:
    bl = s.block
    rows = k.tile_p * k.tile_cb
    b_rows = rows if s.hwb > 1 else k.tile_cb
    tiles = s.n * (s.hw // k.tile_p) * (s.cb // k.tile_cb)
    passes = _ops(s) + 1
    once = (s.cb // k.tile_cb) * (12 * k.tile_cb * bl / cfg.bandwidth_bytes_per_cycle
                                  + cfg.latency_cycles)
    out_bytes = rows * bl * (2 if tuple(s.clip) == WIDE_CLIP else 1)   # an int16 store
    size = {d: np.dtype(d).itemsize for d in (s.a_dtype, s.b_dtype)}   # ACC16 loads: 2 bytes
    return stream_cycles(cfg, tiles, [(rows * bl * size[s.a_dtype], 1),
                                      (b_rows * bl * size[s.b_dtype], 1)],
                         passes * rows, passes, out_bytes, k.double_buffer, once)


def candidate_binary_knobs(cfg: HardwareConfig, s: BinaryShape) -> list[BinaryKnobs]:
    """Every knob setting that fits (tile sizes divide their loops)."""
    return [k for db in (True, False) for tc in divisors(s.cb)
            for k in [BinaryKnobs(t, tc, db) for t in divisors(s.hw)]
            if binary_fits(cfg, s, k) is None]


def default_binary_knobs(cfg: HardwareConfig, s: BinaryShape) -> BinaryKnobs:
    """The candidate with the lowest estimate (larger tiles on ties: fewer instructions)."""
    cands = candidate_binary_knobs(cfg, s)
    if not cands:
        raise no_tiling(cfg, s, binary_fits(cfg, s, BinaryKnobs(1, 1, False)))
    return lowest_estimate(cands, lambda k: estimate_binary_cycles(cfg, s, k))


def binary_instructions(cfg: HardwareConfig, s: BinaryShape, k: BinaryKnobs) -> int:
    tiles = s.n * (s.hw // k.tile_p) * (s.cb // k.tile_cb)
    return tiles * (2 + _ops(s) + 2) + s.cb // k.tile_cb + 1


# ----------------------------------------------------------------------------- schedule
def schedule_binary(func: tirx.PrimFunc, cfg: HardwareConfig, s: BinaryShape,
                    k: BinaryKnobs) -> s_tir.Schedule:
    """Tiles of (pixels, channel blocks) per image, channel tiles outermost so the
    output-stage table is loaded once per channel tile; ``b``'s tile is loaded with
    ``a``'s and read with stride 0 along what it broadcasts over."""
    check_fits(cfg, binary_fits(cfg, s, k), k)
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("acc")
    tiles = [sch.cache_read(acc, i, SCOPE_ACC) for i in range(2)]
    i, p, o, c = sch.get_loops(acc)
    p_o, p_i = sch.split(p, [None, k.tile_p])
    o_o, o_i = sch.split(o, [None, k.tile_cb])
    sch.reorder(o_o, i, p_o, p_i, o_i, c)
    for blk in tiles:
        sch.compute_at(blk, p_o)
    sch.set_scope(acc, 0, SCOPE_ACC)
    sch.tensorize(c, mul_intrin(s.block, s.k1, s.k2, s.b_dtype, s.a_dtype) if s.kind == "mul"
                  else axpby_intrin(s.block, s.k1, s.k2))
    place_output(sch, s, "int32", o_o, p_o)
    if k.double_buffer:
        sch.annotate(p_o, ANN_DOUBLE_BUFFER, 1)
    return sch


def binary_perf_shape(s: BinaryShape) -> BinaryShape:
    clip = s.clip if tuple(s.clip) == WIDE_CLIP else (-128, 127)   # int16 stores cost more
    return dataclasses.replace(s, output_zp=0, clip=clip,
                               k1=1 if s.kind == "add" else int(s.k1 != 0),
                               k2=1 if s.kind == "add" else int(s.k2 != 0))


# ----------------------------------------------------------------------------- layers
def _dims(layer) -> tuple[int, int, int, int]:
    if tuple(layer.output.shape) != tuple(layer.a.shape):
        raise UnsupportedLayer(f"{layer.name}: output {layer.output.shape} is not the first "
                               f"operand's shape {layer.a.shape}")
    d = broadcast_dims(layer.a.shape, layer.b.shape)
    if isinstance(d, str):
        raise UnsupportedLayer(f"{layer.name}: {d}")
    return d


def _check_imm(layer, *vals: int) -> None:
    for v in vals:
        if not sem.INT32_MIN <= v <= sem.INT32_MAX:
            raise UnsupportedLayer(f"{layer.name}: factor {v} exceeds the 32-bit ALU immediate")


def mul_recipe(layer: Mul, cfg: HardwareConfig, consts: bool) -> Recipe:
    n, hw, nb, hwb = _dims(layer)
    c = image_dims(layer.a.shape)[1]
    rq, block = layer.requant, cfg.block_out
    za, zb = layer.a.zero_point, layer.b.zero_point
    dtypes = (layer.a.dtype, layer.b.dtype)
    if any(d not in ("int8", "int16") for d in dtypes):
        raise UnsupportedLayer(f"{layer.name}: operands {dtypes}; a product reads int8 or "
                               f"int16 codes")
    shape = BinaryShape("mul", n, hw, nb, hwb, ceil_div(c, block), block, rq.zero_point,
                        rq.clip, za, zb, *dtypes)
    r = Recipe(KIND, shape, {"a": layer.a, "b": layer.b})
    if consts:
        r.consts["params"] = requant_table(layer, za * zb, c, block)
    return r


def add_recipe(layer: Add, cfg: HardwareConfig, consts: bool) -> Recipe:
    n, hw, nb, hwb = _dims(layer)
    _check_imm(layer, layer.a_mult, layer.b_mult)
    c = image_dims(layer.a.shape)[1]
    rq, block = layer.requant, cfg.block_out
    shape = BinaryShape("add", n, hw, nb, hwb, ceil_div(c, block), block, rq.zero_point,
                        rq.clip, int(layer.a_mult), int(layer.b_mult))
    r = Recipe(KIND, shape, {"a": layer.a, "b": layer.b})
    if consts:
        bias = -(layer.a.zero_point * layer.a_mult + layer.b.zero_point * layer.b_mult)
        r.consts["params"] = requant_table(layer, bias, c, block)
    return r


def _broadcast(b: np.ndarray, bt: QTensor, a_shape: tuple[int, ...]) -> np.ndarray:
    return centered(b, bt).reshape((1,) * (len(a_shape) - b.ndim) + b.shape)


def run_mul(ly: Mul, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer semantics of :class:`~dsa_tvm.layers.ir.Mul`, defined here once."""
    a = centered(env[ly.a.name], ly.a)
    acc = sem.wrap_int32(a * _broadcast(env[ly.b.name], ly.b, a.shape))
    return apply_requant(acc, ly.requant, axis=1 if acc.ndim == 4 else -1)


def is_broadcast_add(layer) -> bool:
    """An Add whose second operand broadcasts (the eltwise room takes the others)."""
    return isinstance(layer, Add) and tuple(layer.a.shape) != tuple(layer.b.shape)


def _run_add(ly: Add, env: dict[str, np.ndarray]) -> np.ndarray:
    a = centered(env[ly.a.name], ly.a)
    acc = sem.wrap_int32(a * ly.a_mult + _broadcast(env[ly.b.name], ly.b, a.shape) * ly.b_mult)
    return apply_requant(acc, ly.requant, axis=1 if acc.ndim == 4 else -1)


def describe(layer) -> str:
    """The report line: a product reads ``a * b``."""
    line = describe_layer(layer)
    return line.replace(" + ", " * ", 1) if isinstance(layer, Mul) else line


#: layer type -> (recipe, reference)
LAYERS = {Mul: (mul_recipe, run_mul), Add: (add_recipe, _run_add)}

KIND = Kind(
    name="binary", layers=tuple(LAYERS),
    claims=lambda ly: isinstance(ly, Mul) or is_broadcast_add(ly), describe=describe,
    recipe=lambda ly, cfg, consts: LAYERS[type(ly)][0](ly, cfg, consts),
    reference=lambda ly, env: LAYERS[type(ly)][1](ly, env),
    bounds=lambda ly: with_weights(ly, inputs_read(ly)),
    shape=BinaryShape, knobs=BinaryKnobs, build=binary, schedule=schedule_binary,
    fits=binary_fits, candidates=candidate_binary_knobs, default=default_binary_knobs,
    estimate=estimate_binary_cycles, instructions=binary_instructions,
    tiles=lambda s: {"tile_p": ("acc", 1), "tile_cb": ("acc", 2)},
    extents=lambda s: {"tile_p": s.hw, "tile_cb": s.cb},
    fill=lambda cfg, s, k: [0.0, 0.0, acc_rows(s, k) / cfg.acc_depth],
    perf_shape=binary_perf_shape)
