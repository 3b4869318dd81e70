"""What a room is: everything about one layer kind behind one object, :class:`Kind`.

The TIR side works on the kind's blocked shape (compute, schedule, knobs, fits,
candidates, estimate, instruction count, the tuning space's loop map); the layer
side on the integer layers it takes (``dsa_tvm.layers.ir``): their recipe (layer ->
shape, TIR inputs, packed constants, host-packed operands), their integer reference
and their compulsory DRAM bytes. The registry (``tir_schedules.kinds``) finds a
kind by layer or by shape type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.ir import Layer, QTensor, layer_inputs
from dsa_tvm.layers.layouts import pack_output_stage


class UnsupportedLayer(ValueError):
    """The codegen has no lowering for this layer (the region stays on the CPU)."""


def _any_layer(layer: Layer) -> bool:
    return True


def element_ops(layer: Layer) -> int:
    """One operation per input element read (or output element written, if more)."""
    out = int(np.prod(layer.output.shape))
    return max(out, sum(int(np.prod(t.shape)) for t in layer_inputs(layer)))


def mac_ops(layer: Layer) -> int:
    """The layer's MACs (an empty layer counts its elements)."""
    return layer.macs or element_ops(layer)


def describe_layer(layer: Layer) -> str:
    """One line per layer for the report: kind, name, shapes."""
    ins = [t.shape for t in (getattr(layer, "a", None), getattr(layer, "b", None),
                             getattr(layer, "input", None)) if t is not None]
    extra = ""
    if hasattr(layer, "weight"):
        extra = f" w{tuple(layer.weight.shape)}"
    if hasattr(layer, "groups") and layer.groups > 1:
        extra += f" groups={layer.groups}"
    if hasattr(layer, "kind"):
        extra += f" {layer.kind}"
    if hasattr(layer, "group"):    # a grouped dense: a scale and an offset per group
        extra += f" scaled per {layer.group} rows"
    if getattr(layer, "planes", False):
        extra += " on byte planes"
    ins_s = " + ".join(str(tuple(s)) for s in ins)
    return f"{type(layer).__name__} {layer.name}: {ins_s}{extra} -> {tuple(layer.output.shape)}"


@dataclass(frozen=True)
class Kind:
    """One room: a layer kind's layer side and (unless it only picks between other
    rooms, like depthwise) its TIR side."""

    name: str
    # ---- layer side
    layers: tuple[type, ...]          # the layer IR types it takes ...
    recipe: Callable                  # (layer, cfg, consts) -> Recipe; raises UnsupportedLayer
    reference: Callable               # (layer, env by tensor name) -> int8 output
    bounds: Callable                  # layer -> (bytes it must read, bytes it must write)
    claims: Callable = _any_layer     # ... those of them it takes, where a type splits
    ops: Callable = element_ops       # layer -> arithmetic in MAC equivalents
    describe: Callable = describe_layer  # layer -> one report line
    # ---- TIR side (None for a room without a shape of its own)
    shape: type | None = None
    knobs: type | None = None
    build: Callable | None = None         # shape -> PrimFunc
    schedule: Callable | None = None      # (func, cfg, shape, knobs) -> Schedule
    fits: Callable | None = None          # (cfg, shape, knobs) -> None | reason
    candidates: Callable | None = None    # (cfg, shape) -> knobs that fit
    default: Callable | None = None       # (cfg, shape) -> knobs; ValueError if none fits
    estimate: Callable | None = None      # (cfg, shape, knobs) -> cycles (analytic)
    instructions: Callable | None = None  # (cfg, shape, knobs) -> instructions of the program
    #: shape -> {tile knob: (block, loop index)} of the loop it tiles (the tuning space)
    tiles: Callable | None = None
    #: shape -> {tile knob: extent of the loop it splits}
    extents: Callable | None = None
    #: (cfg, shape, knobs) -> fill of the (inp, wgt, acc) scratchpads, 0..1
    fill: Callable | None = None
    #: shape -> the shape with value-only fields fixed (one tuning task for all of them)
    perf_shape: Callable | None = None
    #: (builder, cfg, shape, knobs, DRAM regions by parameter) -> None: a room that emits
    #: its DMA instructions itself (data movement) instead of building TIR
    emit: Callable | None = None


@dataclass
class Recipe:
    """Everything ``compile_region`` needs to lower one layer."""

    kind: Kind                      # the room whose TIR runs it
    shape: object
    inputs: dict[str, QTensor]      # TIR parameter -> region tensor
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # TIR parameter -> data
    host: dict[str, str] = field(default_factory=dict)  # TIR parameter -> host-packed region
    scratch: dict[str, tuple[int, ...]] = field(default_factory=dict)  # parameter -> int8 shape


def requant_table(layer: Layer, bias, channels: int, block: int) -> np.ndarray:
    """The layer's [CB][3][block] output-stage table with ``bias`` per channel."""
    mult, shift = layer.requant.per_channel(channels)
    bias = sem.wrap_int32(np.broadcast_to(np.asarray(bias, np.int64), (channels,)))
    return pack_output_stage(bias, mult, shift, block)


def check_out_hw(layer: Layer, out_hw: tuple[int, int]) -> None:
    """The layer's output pixels must be what its window arithmetic gives."""
    if min(out_hw) < 1 or tuple(layer.output.shape[2:]) != out_hw:
        raise UnsupportedLayer(f"{layer.name}: output {layer.output.shape} does not match the "
                               f"{out_hw} output pixels the window arithmetic gives")


def checked(layer: Layer, out: np.ndarray) -> np.ndarray:
    """``out`` if it has the layer's declared output shape and type."""
    if tuple(out.shape) != tuple(layer.output.shape):
        raise ValueError(f"{layer.name}: computed shape {out.shape}, declared {layer.output.shape}")
    if out.dtype != np.dtype(layer.output.dtype):
        raise ValueError(f"{layer.name}: computed {out.dtype}, declared {layer.output.dtype}")
    return out
