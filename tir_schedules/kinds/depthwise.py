"""Room: depthwise conv2d (channel multiplier 1), on the vector unit or the MAC array.

It has no TIR of its own: it claims the depthwise ``Conv2d`` layers and hands each
to the window room (``dw``: an ALU MAC per tap over accumulator rows) or the conv
room (diagonal weight tiles on the array), by the ``depthwise_engine`` option;
"auto" takes the lower estimate of the two default schedules.

Both spend a compute-engine cycle per output row and tap when the vector unit has a
lane per channel of a block (a GEMM step on a diagonal tile does ``block_out`` useful
MACs: an input row holds one pixel, so each output lane has one useful input), plus
the requant step; measured, the default schedules come within 2-10% of that ceiling
(``benchmarks/bench_depthwise.py``, column ``x floor``). A 3x3 stride-1 layer then
takes ``(9 + 1) / 2`` = 5x its DRAM bound at 16 B/cycle, whichever engine. A vector unit
wider than a row (``vector.lanes > block_out``) runs ``lanes / block_out`` rows per
cycle and makes the layer DRAM-bound; parts with fewer lanes than the block take
several cycles per vector row, where the array wins. Dot-product lanes (``[vector]
mac8_ways``: the ALU's MAC8 adds that many int8 products a step) take a kernel row's
taps together when the window room's ``taps_inside`` knob puts the row inside each
instruction: what 5x5 and 7x7 kernels need (``default``: 4 ways, 64 lanes, the array's
256 MACs a cycle). The array fetches its input tiles on the load engine; the vector
unit needs no weight scratchpad and no array fill/drain per instruction.
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
