"""Room: integer softmax, LayerNorm and RMSNorm over the last axis, on the ``[norm]`` units.

The integer semantics (and so this room's CPU reference) are
:mod:`dsa_tvm.layers.intnorm`. Each unit streams a row through a fixed number of
passes (softmax: max, exp and sum, scale; the norms: sums, normalize) at
``norm_elements_per_cycle`` and adds ``norm_row_latency_cycles`` per row for its
reciprocal / inverse-square-root table and Newton steps; rows spread over the
``norm_units`` units (:func:`norm_cycles`, the timing model's cost of these layers).

Lowering: the unit's instruction is not in the ISA yet, so :func:`norm_recipe` always
raises UnsupportedLayer with the reason and the partitioner keeps these layers on
the CPU (in float); the reference and the cost are what the compiler and the
accuracy measurements use today.
"""

from __future__ import annotations

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.layers.checks import elements, with_weights
from dsa_tvm.layers.intnorm import int_norm, int_softmax
from dsa_tvm.layers.ir import LayerNorm, RMSNorm, Softmax
from dsa_tvm.layers.reference import centered

from .base import Kind, Recipe, UnsupportedLayer

#: passes a unit makes over each row, per layer type
PASSES: dict[type, int] = {Softmax: 3, LayerNorm: 2, RMSNorm: 2}


def norm_cycles(cfg: HardwareConfig, layer: Softmax | LayerNorm | RMSNorm) -> int:
    """Cycles the ``[norm]`` units take for the layer (ValueError if the DSA has none)."""
    units = int(getattr(cfg, "norm_units", 0))
    if units < 1:
        raise ValueError(f"'{cfg.name}' has no [norm] units")
    n = int(layer.input.shape[-1])
    rows = int(np.prod(layer.input.shape[:-1], dtype=np.int64))
    per_row = PASSES[type(layer)] * ceil_div(n, cfg.norm_elements_per_cycle) \
        + cfg.norm_row_latency_cycles
    return ceil_div(rows, units) * per_row


def norm_recipe(layer, cfg: HardwareConfig, consts: bool) -> Recipe:
    if int(getattr(cfg, "norm_units", 0)) < 1:
        raise UnsupportedLayer(f"{layer.name}: '{cfg.name}' has no [norm] units (norm_units = 0)")
    raise UnsupportedLayer(f"{layer.name}: the [norm] unit's instruction is not lowered yet "
                           f"(CPU reference and cost only)")


def run_norm(layer, env: dict[str, np.ndarray]) -> np.ndarray:
    """The integer reference: :mod:`dsa_tvm.layers.intnorm` on the layer's input codes."""
    x = env[layer.input.name]
    centered(x, layer.input)  # shape check
    if isinstance(layer, Softmax):
        return int_softmax(x, layer.input.zero_point, layer.params)
    return int_norm(x, layer.input.zero_point, layer.params)


KIND = Kind(
    name="norm", layers=(Softmax, LayerNorm, RMSNorm), recipe=norm_recipe, reference=run_norm,
    bounds=lambda ly: with_weights(ly, elements(ly.input.shape)))
