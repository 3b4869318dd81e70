"""How each layer kind lowers: its TIR shape, compute, schedule and DRAM constants.

:func:`recipe` maps an integer layer (``dsa_tvm.layers.ir``) to a :class:`Recipe`:
the blocked TIR shape of the layer, the functions that build and schedule its
TIR, how default knobs are picked, and the constants (packed weights,
output-stage table) its TIR parameters read. ``region.compile_region`` runs the
recipes; ``region.lowering_supports`` asks them whether a layer can be lowered
at all, so the partitioner and the codegen cannot disagree.

Zero points are folded into the REQUANT bias here, once per layer, so the TIR
stages compute on raw int8 values (padding included, as the LOAD writes it):

* conv / dense / depthwise: ``sum((x - zp) * w) = sum(x * w) - zp * sum(w)``;
* average pool and global average pool: ``sum(x - zp) = sum(x) - count * zp``;
* max pool: ``max(x - zp) = max(x) - zp`` (pads are -128 and never win);
* add: ``(a - za) * am + (b - zb) * bm = a * am + b * bm - (za * am + zb * bm)``;
* rescale: ``x - zp``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tir_schedules.compute import ConvShape, conv2d
from tir_schedules.compute_vector import (
    EltwiseShape,
    GlobalSumShape,
    WindowShape,
    eltwise,
    global_sum,
    window,
)
from tir_schedules.matmul import (
    MatmulShape,
    batch_matmul,
    candidate_matmul_knobs,
    default_matmul_knobs,
    schedule_batch_matmul,
)
from tir_schedules.schedule import candidate_knobs, default_conv_knobs, estimate_cycles, schedule_conv2d
from tir_schedules.schedule_vector import (
    candidate_vector_knobs,
    default_vector_knobs,
    estimate_vector_cycles,
    schedule_eltwise,
    schedule_global_sum,
    schedule_window,
)

from ..hw.config import HardwareConfig
from ..intmath import ceil_div
from ..isa import semantics as sem
from ..layers.ir import (
    Add,
    BatchMatmul,
    BiasAdd,
    Conv2d,
    Dense,
    GlobalAvgPool,
    Layer,
    Pool2d,
    QTensor,
    Rescale,
)
from .host_pack import PARAMS, ROWSUM, batch_dims
from .layouts import image_dims, pack_conv_weights, pack_output_stage
from .options import current_options


class UnsupportedLayer(ValueError):
    """The codegen has no lowering for this layer (the region stays on the CPU)."""


@dataclass
class Recipe:
    """Everything ``compile_region`` needs to lower one layer."""

    shape: object
    build: Callable                 # shape -> PrimFunc
    schedule: Callable              # (func, cfg, shape, knobs) -> Schedule
    default_knobs: Callable         # (cfg, shape) -> knobs; raises ValueError if none fits
    candidates: Callable            # (cfg, shape) -> list of knobs that fit
    inputs: dict[str, QTensor]      # TIR parameter -> region tensor
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # TIR parameter -> data
    host: dict[str, str] = field(default_factory=dict)  # TIR parameter -> host-packed region


def _rq_table(layer: Layer, bias: np.ndarray, channels: int, block: int) -> np.ndarray:
    mult, shift = layer.requant.per_channel(channels)
    bias = sem.wrap_int32(np.broadcast_to(np.asarray(bias, np.int64), (channels,)))
    return pack_output_stage(bias, mult, shift, block)


def _check_out_hw(layer: Layer, out_hw: tuple[int, int]) -> None:
    if min(out_hw) < 1 or tuple(layer.output.shape[2:]) != out_hw:
        raise UnsupportedLayer(f"{layer.name}: output {layer.output.shape} does not match the "
                               f"{out_hw} output pixels the window arithmetic gives")


def _conv_recipe(layer: Conv2d | Dense, cfg: HardwareConfig, consts: bool,
                 depthwise: bool = False) -> Recipe:
    bi, bo = cfg.block_in, cfg.block_out
    rq = layer.requant
    if depthwise:
        n, c, h, wd = layer.input.shape
        _, _, kh, kw = layer.weight.shape
        shape = ConvShape(n, h, wd, 1, ceil_div(c, bo), kh, kw, tuple(layer.strides),
                          tuple(layer.padding), tuple(layer.dilation), bi, bo,
                          layer.input.zero_point, rq.zero_point, rq.clip, depthwise=True)
        _check_out_hw(layer, shape.out_hw)
        w = layer.weight
    elif isinstance(layer, Dense):
        if len(layer.input.shape) == 4 or len(layer.output.shape) == 4:
            raise UnsupportedLayer(f"{layer.name}: dense on 4-D {layer.input.shape}: the DSA "
                                   f"lays 4-D tensors out as NCHW images; give the layer the "
                                   f"(rows, K) view (relay_passes.to_layers does)")
        _, k, rows, _ = image_dims(layer.input.shape)
        shape = ConvShape(1, rows, 1, ceil_div(k, bi), ceil_div(layer.weight.shape[0], bo), 1, 1,
                          (1, 1), (0, 0, 0, 0), (1, 1), bi, bo, layer.input.zero_point,
                          rq.zero_point, rq.clip)
        w = layer.weight[:, :, None, None]
    else:
        n, c, h, wd = layer.input.shape
        o, _, kh, kw = layer.weight.shape
        shape = ConvShape(n, h, wd, ceil_div(c, bi), ceil_div(o, bo), kh, kw,
                          tuple(layer.strides), tuple(layer.padding), tuple(layer.dilation), bi,
                          bo, layer.input.zero_point, rq.zero_point, rq.clip)
        w = layer.weight
        _check_out_hw(layer, shape.out_hw)
    r = Recipe(shape, conv2d, schedule_conv2d, default_conv_knobs, candidate_knobs,
               {"x": layer.input})
    if consts:
        # the array multiplies raw int8 inputs, pads included as the input zero point
        bias = np.asarray(layer.bias, np.int64) - layer.input.zero_point * w.astype(
            np.int64).sum(axis=(1, 2, 3))
        r.consts = {"w": _diagonal_tiles(w, bo) if depthwise else pack_conv_weights(w, bi, bo),
                    "params": _rq_table(layer, bias, w.shape[0], bo)}
    return r


def _diagonal_tiles(w: np.ndarray, block: int) -> np.ndarray:
    """Depthwise int8 [C, 1, KH, KW] -> [CB][KH][KW][1][block][block] weight tiles whose
    diagonal holds each channel's tap: the array then multiplies lane i by lane i only."""
    c, _, kh, kw = w.shape
    cb = ceil_div(c, block)
    taps = np.zeros((cb * block, kh, kw), np.int8)
    taps[:c] = w[:, 0]
    tiles = np.zeros((cb, kh, kw, 1, block, block), np.int8)
    lane = np.arange(block)
    tiles[:, :, :, 0, lane, lane] = taps.reshape(cb, block, kh, kw).transpose(0, 2, 3, 1)
    return tiles


def _depthwise_recipe(layer: Conv2d, cfg: HardwareConfig, consts: bool) -> Recipe:
    """The vector-unit or the MAC-array lowering of a depthwise conv (the
    ``depthwise_engine`` option; "auto" takes the lower estimate of the two default
    schedules).

    Both spend a cycle per output row and tap when the vector unit has a lane per
    channel of a block. The array also fetches its input tiles on the load engine,
    overlapped with compute, where ACC loads hold the compute engine; the vector unit
    needs no weight scratchpad and no array fill/drain per instruction, and parts with
    fewer lanes than the block take several cycles per vector row."""
    wanted = current_options().depthwise_engine
    fitting, fallback = [], None
    for engine, make, estimate in (
            ("vector", _window_recipe, estimate_vector_cycles),
            ("array", lambda *a: _conv_recipe(*a, depthwise=True), estimate_cycles)):
        if wanted not in ("auto", engine):
            continue
        r = make(layer, cfg, False)
        try:
            fitting.append((estimate(cfg, r.shape, r.default_knobs(cfg, r.shape)), engine, make))
        except ValueError:  # no schedule fits: keep it to report why, if the other fails too
            fallback = fallback or make
    make = min(fitting)[2] if fitting else fallback
    return make(layer, cfg, consts)


def _vector(shape, build, schedule, inputs: dict[str, QTensor]) -> Recipe:
    return Recipe(shape, build, schedule, default_vector_knobs, candidate_vector_knobs, inputs)


def _window_recipe(layer: Conv2d | Pool2d, cfg: HardwareConfig, consts: bool) -> Recipe:
    block = cfg.block_out
    if len(layer.input.shape) != 4 or len(layer.output.shape) != 4:
        raise UnsupportedLayer(f"{layer.name}: window layers need NCHW tensors")
    n, c, h, w = layer.input.shape
    zp = layer.input.zero_point
    if isinstance(layer, Conv2d):
        kind, (kh, kw), dil = "dw", layer.weight.shape[2:], tuple(layer.dilation)
    else:
        if layer.kind not in ("max", "avg"):
            raise UnsupportedLayer(f"{layer.name}: unknown pool kind '{layer.kind}'")
        kind, (kh, kw), dil = layer.kind, layer.kernel, (1, 1)
        pt, pl, pb, pr = layer.padding
        if kind == "max" and (max(pt, pb) >= kh or max(pl, pr) >= kw):
            raise UnsupportedLayer(f"{layer.name}: padding {layer.padding} >= the {kh}x{kw} "
                                   f"window (a window of padding only has no maximum)")
    rq = layer.requant
    shape = WindowShape(kind, n, h, w, ceil_div(c, block), int(kh), int(kw),
                        tuple(layer.strides), tuple(layer.padding), dil, block,
                        sem.INT8_MIN if kind == "max" else zp, rq.zero_point, rq.clip)
    _check_out_hw(layer, shape.out_hw)
    r = _vector(shape, window, schedule_window, {"x": layer.input})
    if consts:
        if kind == "dw":
            wt = np.zeros((shape.cb * block, kh, kw), np.int8)
            wt[:c] = layer.weight[:, 0]
            r.consts["w"] = np.ascontiguousarray(
                wt.reshape(shape.cb, block, kh, kw).transpose(0, 2, 3, 1))
            bias = np.asarray(layer.bias, np.int64) - zp * layer.weight.astype(np.int64).sum(
                axis=(1, 2, 3))
        else:
            bias = np.full(c, -zp * (kh * kw if kind == "avg" else 1), np.int64)
        r.consts["params"] = _rq_table(layer, bias, c, block)
    return r


def _global_recipe(layer: GlobalAvgPool, cfg: HardwareConfig, consts: bool) -> Recipe:
    block = cfg.block_out
    if len(layer.input.shape) != 4:
        raise UnsupportedLayer(f"{layer.name}: global average pool needs an NCHW input")
    n, c, h, w = layer.input.shape
    on, oc, oh, ow = image_dims(layer.output.shape)
    if (on * oh * ow, oc) != (n, c):
        raise UnsupportedLayer(f"{layer.name}: output {layer.output.shape} is not (N, C[, 1, 1])")
    rq = layer.requant
    shape = GlobalSumShape(n, h * w, ceil_div(c, block), block, rq.zero_point, rq.clip)
    r = _vector(shape, global_sum, schedule_global_sum, {"x": layer.input})
    if consts:
        r.consts["params"] = _rq_table(layer, -h * w * layer.input.zero_point, c, block)
    return r


def _pixels(t: QTensor) -> tuple[int, int]:
    """(pixels, channels) of a tensor in the blocked layout: what element-wise layers see."""
    n, c, h, w = image_dims(t.shape)
    return n * h * w, c


def _eltwise_recipe(layer: Add | BiasAdd | Rescale, cfg: HardwareConfig,
                    consts: bool) -> Recipe:
    block = cfg.block_out
    ins = [layer.a, layer.b] if isinstance(layer, Add) else [layer.input]
    if isinstance(layer, Add) and not layer.a.shape == layer.b.shape == layer.output.shape:
        raise UnsupportedLayer(f"{layer.name}: operands {layer.a.shape} + {layer.b.shape} -> "
                               f"{layer.output.shape}: only same-shape adds")
    p, c = _pixels(layer.output)
    for t in ins:
        if _pixels(t) != (p, c):
            raise UnsupportedLayer(f"{layer.name}: input {t.shape} and output "
                                   f"{layer.output.shape} differ in the blocked layout")
    rq = layer.requant
    if isinstance(layer, Add):
        for m in (layer.a_mult, layer.b_mult):
            if not sem.INT32_MIN <= m <= sem.INT32_MAX:
                raise UnsupportedLayer(f"{layer.name}: rescale factor {m} exceeds the "
                                       f"32-bit ALU immediate")
        shape = EltwiseShape("add", p, ceil_div(c, block), block, rq.zero_point, rq.clip,
                             int(layer.a_mult), int(layer.b_mult))
        bias = -(layer.a.zero_point * layer.a_mult + layer.b.zero_point * layer.b_mult)
        inputs = {"a": layer.a, "b": layer.b}
    elif isinstance(layer, BiasAdd):
        if not sem.INT32_MIN <= layer.x_mult <= sem.INT32_MAX:
            raise UnsupportedLayer(f"{layer.name}: rescale factor {layer.x_mult} exceeds the "
                                   f"32-bit ALU immediate")
        if np.shape(layer.bias) != (c,):
            raise UnsupportedLayer(f"{layer.name}: bias of shape {np.shape(layer.bias)} for "
                                   f"{c} channels")
        shape = EltwiseShape("scale", p, ceil_div(c, block), block, rq.zero_point, rq.clip,
                             int(layer.x_mult))
        bias = np.asarray(layer.bias, np.int64) - layer.input.zero_point * layer.x_mult
        inputs = {"x": layer.input}
    else:
        shape = EltwiseShape("rescale", p, ceil_div(c, block), block, rq.zero_point, rq.clip)
        bias = -layer.input.zero_point
        inputs = {"x": layer.input}
    r = _vector(shape, eltwise, schedule_eltwise, inputs)
    if consts:
        r.consts["params"] = _rq_table(layer, bias, c, block)
    return r


def _matmul_recipe(layer: BatchMatmul, cfg: HardwareConfig) -> Recipe:
    """Both operands arrive host-packed (``host_pack``): ``a`` as rows plus correction
    rows, ``b`` as weight tiles plus the output-stage table (nothing is constant)."""
    a, b = tuple(layer.a.shape), tuple(layer.b.shape)
    if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[-1] != b[-2]:
        raise UnsupportedLayer(f"{layer.name}: batch matmul needs (B, M, K) x (B, K, N) "
                               f"operands (leading dimensions flattened), got {a} x {b}")
    if tuple(layer.output.shape) != a[:-1] + b[-1:]:
        raise UnsupportedLayer(f"{layer.name}: output {layer.output.shape} is not "
                               f"{a[:-1] + b[-1:]}")
    bt, m, k = batch_dims(a)
    rq = layer.requant
    shape = MatmulShape(bt, m, ceil_div(k, cfg.block_in), ceil_div(b[-1], cfg.block_out),
                        cfg.block_in, cfg.block_out, rq.zero_point, rq.clip)
    return Recipe(shape, batch_matmul, schedule_batch_matmul, default_matmul_knobs,
                  candidate_matmul_knobs, {"x": layer.a},
                  host={"w": layer.b.name, "params": layer.b.name + PARAMS,
                        "r": layer.a.name + ROWSUM})


def recipe(layer: Layer, cfg: HardwareConfig, consts: bool = True) -> Recipe:
    """The lowering of ``layer`` (constants packed only when ``consts``); raises
    UnsupportedLayer with the reason when there is none."""
    if cfg.block_in != cfg.block_out:
        raise UnsupportedLayer(f"'{cfg.name}': layers chain only when block_in == block_out")
    if isinstance(layer, Dense):
        return _conv_recipe(layer, cfg, consts)
    if isinstance(layer, Conv2d):
        if layer.groups == 1:
            return _conv_recipe(layer, cfg, consts)
        if layer.depthwise and layer.weight.shape[1] == 1:
            return _depthwise_recipe(layer, cfg, consts)
        raise UnsupportedLayer(f"{layer.name}: grouped conv2d (groups={layer.groups}, weight "
                               f"{layer.weight.shape}) is not lowered; only groups=1 and "
                               f"depthwise with channel multiplier 1")
    if isinstance(layer, Pool2d):
        return _window_recipe(layer, cfg, consts)
    if isinstance(layer, GlobalAvgPool):
        return _global_recipe(layer, cfg, consts)
    if isinstance(layer, (Add, BiasAdd, Rescale)):
        return _eltwise_recipe(layer, cfg, consts)
    if isinstance(layer, BatchMatmul):
        return _matmul_recipe(layer, cfg)
    raise UnsupportedLayer(f"{layer.name}: no DSA lowering for {type(layer).__name__}")
