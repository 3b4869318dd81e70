"""Mixed precision: which weighted layers keep 8-bit weights when the rest go to 4.

Weight scales follow the weights at every forward pass, so a layer's width can change
without recalibrating. The sensitivity of a layer is the output cosine (against the
FP32 network, the prepared module's own ``float`` mode) with only that layer at the low
width; :func:`choose_bits` keeps the most sensitive layers wide until a target cosine
is met.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..quant.qparams import WEIGHT_BITS
from .errors import QatError
from .layers import WeightedLayer, set_mode

Batch = tuple[torch.Tensor, ...]


def weighted_layers(module: nn.Module) -> dict[str, WeightedLayer]:
    """The prepared module's convolution and linear layers by source name."""
    return {m.name: m for m in module.modules() if isinstance(m, WeightedLayer)}


def set_bits(module: nn.Module, bits: Mapping[str, int]) -> None:
    """Set the weight width of the named layers (8 or 4). A layer whose width changes
    starts its weight scales afresh and re-derives its bias correction, so the module is
    what preparing it with these widths gives."""
    layers = weighted_layers(module)
    for name, b in bits.items():
        if name not in layers:
            known = ", ".join(sorted(layers)[:8])
            raise QatError(f"no weighted layer named {name!r}; names are the source modules' "
                           f"paths, e.g. {known}")
        if b not in WEIGHT_BITS:
            raise QatError(f"layer {name!r}: bits={b!r}; pass 8 or 4")
        changed = layers[name].bits != int(b)
        layers[name].bits = int(b)
        if changed:  # the clip (searched or learned) and bias correction were the old grid's
            layers[name].clip_weights(getattr(module, "qat_weight_clip", "max"))
            layers[name].rederive_bias_correction()


def bits_of(module: nn.Module) -> dict[str, int]:
    return {n: m.bits for n, m in weighted_layers(module).items()}


def low_share(module: nn.Module, low: int = 4) -> float:
    """The share of all weights stored at ``low`` bits."""
    layers = weighted_layers(module).values()
    total = sum(m.weight.numel() for m in layers)
    return sum(m.weight.numel() for m in layers if m.bits == low) / max(total, 1)


def output_cosine(module: nn.Module, batches: Sequence[Batch],
                  reference: Sequence[torch.Tensor]) -> float:
    """Mean per-example cosine of the quantized outputs against ``reference``."""
    values = []
    with torch.no_grad():
        for b, r in zip(batches, reference):
            y = module(*b)
            values.append(nn.functional.cosine_similarity(y.flatten(1), r.flatten(1), dim=1))
    return float(torch.cat(values).mean())


def fp32_outputs(module: nn.Module, batches: Sequence[Batch]) -> list[torch.Tensor]:
    """The FP32 network's outputs (the prepared module in ``float`` mode)."""
    set_mode(module, "float")
    try:
        with torch.no_grad():
            return [module(*b) for b in batches]
    finally:
        set_mode(module, "quant")


@dataclass(frozen=True)
class Sensitivity:
    layer: str
    cosine: float   # output cosine with only this layer at the low width
    weights: int    # its weight count (what the low width halves in DRAM)

    @property
    def loss_per_weight(self) -> float:
        return (1.0 - self.cosine) / max(self.weights, 1)


def sensitivity(module: nn.Module, batches: Sequence[Batch], low: int = 4, high: int = 8,
                reference: Sequence[torch.Tensor] | None = None) -> list[Sensitivity]:
    """Each weighted layer alone at ``low`` bits (the others at ``high``), most sensitive
    (lowest cosine) first. ``reference``: the FP32 outputs, when the caller has them."""
    saved = bits_of(module)
    layers = weighted_layers(module)
    ref = reference if reference is not None else fp32_outputs(module, batches)
    out = []
    try:
        for name in saved:
            set_bits(module, {n: high for n in saved} | {name: low})
            out.append(Sensitivity(name, output_cosine(module, batches, ref),
                                   layers[name].weight.numel()))
    finally:
        set_bits(module, saved)
    return sorted(out, key=lambda s: s.cosine)


def choose_bits(module: nn.Module, batches: Sequence[Batch], target_cosine: float,
                low: int = 4, high: int = 8, ranking: Sequence[Sensitivity] | None = None
                ) -> tuple[dict[str, int], float]:
    """Every layer at ``low`` bits except the ones that lose the most accuracy per weight
    (the bytes the low width saves), added back at ``high`` one by one until the output
    cosine reaches ``target_cosine``. Sets the widths on the module and returns them with
    the cosine reached."""
    ref = fp32_outputs(module, batches)
    ranking = list(ranking) if ranking is not None else \
        sensitivity(module, batches, low, high, reference=ref)
    ranking.sort(key=lambda s: -s.loss_per_weight)
    bits = {s.layer: low for s in ranking}
    set_bits(module, bits)
    cos = output_cosine(module, batches, ref)
    for s in ranking:
        if cos >= target_cosine:
            break
        bits[s.layer] = high
        set_bits(module, {s.layer: high})
        cos = output_cosine(module, batches, ref)
    return bits, cos
