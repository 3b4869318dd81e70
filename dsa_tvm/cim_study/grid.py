"""The points of an analog study: ADC bits, device noise and time since programming, each
with or without the mitigations, and the hardware description of each point.

``--noise`` values mean, by noise model: ``gaussian``: the programming noise's standard
deviation as a fraction of g_max (0.02 = 2 %), no read noise, every device drifting with
the description's ``drift_nu``; ``pcm``: the multiplier of aihwkit's PCM statistics for
programming and read noise (1 = as published), per-device drift.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..hw.config import HardwareConfig, load_config

#: seconds per unit of a duration ("1s", "10m", "1h", "1d", "1w", "1y")
DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0,
                  "y": 31_557_600.0}
#: mitigation name -> the description field it switches on
MITIGATIONS = {"adc": "adc_calibration", "drift": "drift_compensation",
               "bias": "bias_correction"}
#: the mitigations that need a calibration pass over data before the runs
CALIBRATED = ("adc_calibration", "bias_correction")
NOISE_MODELS = ("gaussian", "pcm")


def parse_duration(text: str) -> float:
    """Seconds of ``"1s"``, ``"1d"``, ``"1y"``, ``"3600"`` (seconds)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([smhdwy]?)\s*", str(text))
    if not m:
        raise ValueError(f"duration {text!r} is not a time; give a number with an optional "
                         f"unit ({', '.join(DURATION_UNITS)}), e.g. 1s, 1d, 1y")
    return float(m.group(1)) * DURATION_UNITS[m.group(2) or "s"]


def format_duration(seconds: float) -> str:
    """The largest unit that gives a whole-ish number: 86400 -> '1d'."""
    for unit, size in sorted(DURATION_UNITS.items(), key=lambda kv: -kv[1]):
        if seconds >= size and abs(seconds / size - round(seconds / size)) < 1e-6:
            return f"{round(seconds / size)}{unit}"
    return f"{seconds:g}s"


#: key of parse_mitigations' result that is not a field: keep the N most sensitive layers
#: digital (the study ranks them, then sets cim.digital_layers)
DIGITAL = "digital"


def parse_mitigations(names: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Description changes of ``adc``, ``drift``, ``bias``, ``reads=K``; ``digital=N``
    under the key :data:`DIGITAL`."""
    out: dict[str, Any] = {}
    for raw in names:
        name, _, val = str(raw).strip().partition("=")
        if name in MITIGATIONS and not val:
            out[MITIGATIONS[name]] = True
        elif name == "reads" and val.isdigit() and 1 <= int(val) <= 64:
            out["reads_per_mvm"] = int(val)
        elif name == DIGITAL and val.isdigit() and int(val) >= 1:
            out[DIGITAL] = int(val)
        else:
            raise ValueError(f"mitigation {raw!r} is unknown; use {', '.join(MITIGATIONS)}, "
                             f"reads=K (K = 1..64 repeated reads averaged) or digital=N (the "
                             f"N most sensitive layers on the digital array)")
    return out


@dataclass(frozen=True)
class Point:
    """One setting of the study."""

    adc_bits: int
    noise: float
    t_inference_s: float
    mitigated: bool = False

    @property
    def label(self) -> str:
        return (f"adc {self.adc_bits}, noise {self.noise:g}, t {format_duration(self.t_inference_s)}"
                + (", mitigated" if self.mitigated else ""))


def points(adc: list[int], noise: list[float], drift: list[float], grid: str = "axes",
           mitigated: bool = False) -> list[Point]:
    """``axes``: each axis swept with the others at the base (most ADC bits, least noise,
    shortest time); ``full``: every combination. With ``mitigated`` every point twice."""
    for name, vals in (("adc", adc), ("noise", noise), ("drift", drift)):
        if not vals:
            raise ValueError(f"--{name} has no values; give at least one")
    if any(not 1 <= b <= 32 for b in adc):
        raise ValueError(f"--adc {adc} is out of range; ADC bits are 1..32")
    if any(not (math.isfinite(v) and v >= 0) for v in list(noise) + list(drift)):
        raise ValueError("a --noise or --drift value is negative or not finite; give finite "
                         "values >= 0")
    if grid == "full":
        combos = [(a, n, t) for a in adc for n in noise for t in drift]
    elif grid == "axes":
        a0, n0, t0 = max(adc), min(noise), min(drift)
        combos = ([(a, n0, t0) for a in sorted(adc)] + [(a0, n, t0) for n in sorted(noise)]
                  + [(a0, n0, t) for t in sorted(drift)])
    else:
        raise ValueError(f"grid {grid!r} is unknown; use 'axes' or 'full'")
    combos = list(dict.fromkeys(combos))
    out = [Point(a, n, t) for a, n, t in combos]
    if mitigated:
        out += [Point(a, n, t, True) for a, n, t in combos]
    return out


def point_config(base: HardwareConfig, point: Point, noise_model: str,
                 mitigations: dict[str, Any]) -> HardwareConfig:
    """The description of ``point``: ``base`` (a part with crossbars) with its ADC, noise,
    time and (for a mitigated point) the mitigations set."""
    if not base.is_cim:
        raise ValueError(f"'{base.name}' has no crossbars (cim.crossbars = 0); give a CIM "
                         f"description, e.g. --hw cim-pcm")
    if noise_model not in NOISE_MODELS:
        raise ValueError(f"noise model {noise_model!r} is unknown; use "
                         f"{' or '.join(NOISE_MODELS)}")
    read = point.noise if noise_model == "pcm" else 0.0
    changes: dict[str, Any] = dict(adc_bits=point.adc_bits, noise_model=noise_model,
                                   prog_noise_scale=point.noise, read_noise_scale=read,
                                   t_inference_s=point.t_inference_s)
    if point.mitigated:
        changes.update({k: v for k, v in mitigations.items() if k != DIGITAL})
    return base.replace(**changes)


@dataclass
class Plan:
    """A study's grid, checked before any work: the base description, the mitigations'
    changes, the times since programming (seconds) and the points."""

    base: HardwareConfig
    changes: dict[str, Any]
    drifts: list[float]
    points: list[Point]


def plan(hw: Any, adc: list[int], noise: list[float], drift: list, noise_model: str,
         mitigate: list[str], grid: str) -> Plan:
    """Parse and check a study's axes; every point's description is valid before any
    model is loaded."""
    base = load_config(hw)
    changes = parse_mitigations(list(mitigate))
    drifts = [parse_duration(t) if isinstance(t, str) else float(t) for t in drift]
    pts = points(list(adc), list(noise), drifts, grid, mitigated=bool(changes))
    for p in pts:
        point_config(base, p, noise_model, changes)
    return Plan(base, changes, drifts, pts)


def measure_points(study: Any, measure: Any, grid: Plan, noise_model: str, say: Any) -> Any:
    """``measure(cfg, calibrate)`` at every point of ``grid`` into ``study.points``
    (calibrating first where a mitigation needs data)."""
    for k, p in enumerate(grid.points, 1):
        cfg = point_config(grid.base, p, noise_model, grid.changes)
        say(f"[{k}/{len(grid.points)}] {p.label}")
        m = measure(cfg, p.mitigated and any(cfg.values[f] for f in CALIBRATED))
        m.point = p
        study.points.append(m)
    return study
