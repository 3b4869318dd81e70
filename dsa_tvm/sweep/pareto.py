"""The designs worth having: Pareto fronts of a sweep and the picture of them.

A design is on the front when no other design of the same model is at least as good in
latency and area and better in one. Energy is the DSA's alone (the host's is not
modelled), so a design that leaves work to the host would look frugal: it is shown as
color, not ranked. The plot puts every design of each model
at (area, latency), colored by energy, and joins the front; the front's designs are
named so a reader can pick one. matplotlib's Agg canvas, no pyplot state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .evaluate import PointResult

OBJECTIVES = ("latency_us", "area_mm2")


def dominates(a: PointResult, b: PointResult, objectives: Sequence[str] = OBJECTIVES) -> bool:
    va = [getattr(a, k) for k in objectives]
    vb = [getattr(b, k) for k in objectives]
    return all(x <= y for x, y in zip(va, vb)) and any(x < y for x, y in zip(va, vb))


def pareto_front(results: Sequence[PointResult],
                 objectives: Sequence[str] = OBJECTIVES) -> list[PointResult]:
    """The non-dominated results (those without an error), in the order given."""
    ok = [r for r in results if not r.error]
    return [r for r in ok if not any(dominates(o, r, objectives) for o in ok if o is not r)]


def short_label(r: PointResult) -> str:
    """``array=16 bandwidth_bytes_per_cycle=64``: the axis values by field name alone."""
    return " ".join(f"{k.rpartition('.')[2]}={v}" for k, v in r.values.items()) or r.point


def plot_pareto(results: Sequence[PointResult], path: str | Path) -> Path:
    """One panel per model: latency against area, energy as color, the front joined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(r.model for r in results if not r.error))
    if not models:
        raise ValueError("no design point compiled, so there is nothing to plot; the CSV's "
                         "error column says why each failed")
    most = max(len(pareto_front([r for r in results if r.model == m and not r.error]))
               for m in models)
    fig = Figure(figsize=(7.2 * len(models), 5.4 + 0.13 * most), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        mine = [r for r in results if r.model == model and not r.error]
        front = sorted(pareto_front(mine), key=lambda r: r.area_mm2)
        energy = [r.energy_uj for r in mine]
        sc = ax.scatter([r.area_mm2 for r in mine], [r.latency_us for r in mine], c=energy,
                        cmap="viridis", s=36, edgecolors="black", linewidths=0.4, zorder=3)
        ax.plot([r.area_mm2 for r in front], [r.latency_us for r in front], color="crimson",
                lw=1.2, zorder=2, label=f"Pareto front ({len(front)} of {len(mine)})")
        for i, r in enumerate(front, 1):   # numbered here, named in the list below
            ax.annotate(str(i), (r.area_mm2, r.latency_us), fontsize=8, fontweight="bold",
                        xytext=(4, 3), textcoords="offset points", color="crimson")
        ax.text(0.0, -0.14, "\n".join(f"{i}: {short_label(r)}  ({r.latency_us:,.0f} us, "
                                      f"{r.area_mm2:.2f} mm$^2$)" for i, r in enumerate(front, 1)),
                transform=ax.transAxes, fontsize=7, va="top", family="monospace")
        ax.set_xlabel("area estimate (mm$^2$)")
        ax.set_ylabel("latency (us)")
        ax.set_yscale("log")
        ax.set_title(model)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
        fig.colorbar(sc, ax=ax, label="energy (uJ)" if any(energy) else "energy (not modelled)")
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
