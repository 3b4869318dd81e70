"""Room: depthwise conv2d (channel multiplier 1), on the vector unit or the MAC array.

It has no TIR of its own: it claims the depthwise ``Conv2d`` layers and hands each
to the window room (``dw``: an ALU MAC per tap over accumulator rows) or the conv
room (diagonal weight tiles on the array), by the ``depthwise_engine`` option;
"auto" takes the lower estimate of the two default schedules.

Both spend a cycle per output row and tap when the vector unit has a lane per
channel of a block. The array also fetches its input tiles on the load engine,
overlapped with compute, where ACC loads hold the compute engine; the vector unit
needs no weight scratchpad and no array fill/drain per instruction, and parts with
fewer lanes than the block take several cycles per vector row.
"""

from __future__ import annotations

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.checks import window_input, with_weights
from dsa_tvm.layers.ir import Conv2d

from ..options import current_options
from . import conv2d, window
from .base import Kind, Recipe, mac_ops

#: engine -> its recipe ("auto": the lower estimate; on a tie the name that sorts first)
ENGINES = {"vector": window.depthwise_recipe, "array": conv2d.depthwise_recipe}


def depthwise_recipe(layer: Conv2d, cfg: HardwareConfig, consts: bool) -> Recipe:
    wanted = current_options().depthwise_engine
    fitting, fallback = [], None
    for engine, make in ENGINES.items():
        if wanted not in ("auto", engine):
            continue
        r = make(layer, cfg, False)
        try:
            fitting.append((r.kind.estimate(cfg, r.shape, r.kind.default(cfg, r.shape)),
                            engine, make))
        except ValueError:  # no schedule fits: keep it to report why, if the other fails too
            fallback = fallback or make
    make = min(fitting)[2] if fitting else fallback
    return make(layer, cfg, consts)


KIND = Kind(
    name="depthwise", layers=(Conv2d,), claims=conv2d.is_depthwise, recipe=depthwise_recipe,
    reference=lambda ly, env: conv2d.run_conv2d(ly, env[ly.input.name]),
    bounds=lambda ly: with_weights(ly, window_input(ly, ly.weight.shape[2:], ly.dilation)),
    ops=mac_ops)
