"""Which layers an analog part hurts most: each layer kept digital alone.

The same measurement as the quantizer's sensitivity analysis (``quant.accuracy
.sensitivity``: each layer kept in FP32 alone, the output cosine that buys), with the
crossbars in the place of int8: every layer with GEMMs on crossbars is run once on the
digital array (``cim.digital_layers``) while the rest stay analog, and the layers are
ranked by the output cosine against the FP32 model that buys. The mitigation
``digital=N`` keeps the first N digital.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..hw.config import HardwareConfig


@dataclass(frozen=True)
class LayerGain:
    layer: str
    cosine: float       # the output cosine with this layer digital
    gain: float         # over every layer analog


def analog_layers(launches: list) -> list[str]:
    """Names of the layers that read crossbars in a run's launches, in program order."""
    out = []
    for la in launches:
        cim = la.result.cim
        if cim is None:
            continue
        for ly in la.program.meta.get("layers", []):
            if any(ly["first"] <= i <= ly["last"] for i in cim.analog):
                out.append(ly["name"])
    return out


def sensitivity(bench, cfg: HardwareConfig, limit: int | None = 2,
                say: Callable[[str], None] = lambda _m: None) -> list[LayerGain]:
    """Every analog layer of ``bench``'s model on ``cfg`` kept digital alone, over its first
    ``limit`` evaluation inputs: most sensitive (largest gain) first."""
    base = bench.measure(cfg, limit=limit)
    layers = analog_layers(bench.last_launches)
    say(f"sensitivity: {len(layers)} analog layers, all analog cosine "
        f"{base.metrics['cosine']:.4f}")
    rows = []
    for name in layers:
        c = bench.measure(cfg.replace(digital_layers=name), limit=limit).metrics["cosine"]
        rows.append(LayerGain(name, c, c - base.metrics["cosine"]))
    rows.sort(key=lambda r: -r.gain)
    return rows


def analog_share(launches: list, names: list[str]) -> tuple[float, float]:
    """(share of MACs, share of weight bytes) of a run's analog layers that ``names`` holds:
    what keeping them digital takes back from the crossbars."""
    analog, chosen = set(analog_layers(launches)), set(names)
    layers = [ly for la in launches for ly in la.program.meta.get("layers", [])
              if ly["name"] in analog]
    kept = [ly for ly in layers if ly["name"] in chosen]

    def share(key: str) -> float:
        return sum(ly[key] for ly in kept) / max(sum(ly[key] for ly in layers), 1)

    return share("macs"), share("weight_bytes")
