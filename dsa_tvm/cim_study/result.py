"""The measured points of an analog study, as a table, JSON and a plot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .grid import Point, format_duration


@dataclass
class Measured:
    """What one hardware setting gave: accuracy against the FP32 model, speed, energy."""

    point: Point | None            # None: the digital baseline
    hw: str
    metrics: dict[str, float]      # cosine / top1_agreement (CNN); perplexity / agreement (LLM)
    cycles: float                  # per inference (CNN) or per decoded token (LLM)
    energy_uj: float
    note: str = ""                 # e.g. the crossbars do not fit: time-shared


@dataclass
class CimStudy:
    model: str
    hw: str
    noise_model: str
    mitigations: list[str]
    inputs: int
    unit: str                      # "inference" or "token"
    mhz: float
    digital: Measured
    points: list[Measured] = field(default_factory=list)
    reference: dict[str, float] = field(default_factory=dict)   # the FP32 model's own metrics

    @property
    def metric_names(self) -> list[str]:
        return list(self.digital.metrics)

    def table(self) -> str:
        names = self.metric_names
        head = (f"{'setting':<40}" + "".join(f"{n:>16}" for n in names)
                + f"{'cycles/' + self.unit:>18}{'uJ/' + self.unit:>14}  note")
        rows = [head, "-" * len(head)]
        for m in [self.digital] + self.points:
            label = (f"digital int8 ({m.hw})" if m.point is None else m.point.label)
            rows.append(f"{label:<40}" + "".join(f"{m.metrics.get(n, float('nan')):>16.4f}"
                                                 for n in names)
                        + f"{m.cycles:>18,.0f}{m.energy_uj:>14.3f}  {m.note}")
        return "\n".join(rows)

    def __str__(self) -> str:
        mit = ", ".join(self.mitigations) or "none"
        ref = "".join(f"; FP32 {k} {v:.4f}" for k, v in self.reference.items())
        what = "tokens" if self.unit == "token" else "inputs"
        return (f"analog study of {self.model} on {self.hw} ({self.noise_model} noise; "
                f"mitigations: {mit}) over {self.inputs} {what}, against the FP32 model"
                f"{ref}\n" + self.table())

    def to_dict(self) -> dict[str, Any]:
        def one(m: Measured) -> dict[str, Any]:
            d = asdict(m)
            d["point"] = None if m.point is None else asdict(m.point)
            return d
        return {"model": self.model, "hw": self.hw, "noise_model": self.noise_model,
                "mitigations": self.mitigations, "inputs": self.inputs, "unit": self.unit,
                "mhz": self.mhz, "reference": self.reference, "digital": one(self.digital),
                "points": [one(m) for m in self.points]}

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def plot(self, path: str | Path, metric: str | None = None) -> Path:
        """Three panels: ``metric`` against ADC bits, against noise, against time since
        programming (log scale), plain and mitigated lines, the digital part dashed."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        metric = metric or self.metric_names[0]
        axes = (("adc_bits", "ADC bits", False), ("noise", f"noise ({self.noise_model})", False),
                ("t_inference_s", "time since programming", True))
        fig, panels = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
        for ax, (key, title, log) in zip(panels, axes):
            for mitigated, style in ((False, "o-"), (True, "s--")):
                pts = _axis_points(self.points, key, mitigated)
                if len(pts) < 1:
                    continue
                xs = [getattr(m.point, key) for m in pts]
                ys = [m.metrics.get(metric, float("nan")) for m in pts]
                ax.plot(xs, ys, style, label="mitigated" if mitigated else "plain")
            ax.axhline(self.digital.metrics.get(metric, float("nan")), color="grey",
                       linestyle=":", label=f"digital int8 ({self.digital.hw})")
            ticks = sorted({getattr(m.point, key) for m in self.points})
            if log:
                ax.set_xscale("symlog", linthresh=1.0)
                ax.set_xticks(ticks, [format_duration(t) for t in ticks])
            else:
                ax.set_xticks(ticks)
            ax.set_xlabel(title)
            ax.grid(alpha=0.3)
        panels[0].set_ylabel(metric)
        panels[0].legend(fontsize=8)
        fig.suptitle(f"{self.model} on {self.hw}: {metric} against the FP32 model "
                     f"({self.inputs} inputs)")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _axis_points(measured: list[Measured], key: str, mitigated: bool) -> list[Measured]:
    """The points that vary only ``key`` from the base (the others at their base values:
    most ADC bits, least noise, shortest time), sorted along it."""
    pts = [m for m in measured if m.point is not None and m.point.mitigated == mitigated]
    if not pts:
        return []
    base = {"adc_bits": max(m.point.adc_bits for m in pts),
            "noise": min(m.point.noise for m in pts),
            "t_inference_s": min(m.point.t_inference_s for m in pts)}
    keep = [m for m in pts if all(getattr(m.point, k) == v for k, v in base.items() if k != key)]
    return sorted(keep, key=lambda m: getattr(m.point, key))
