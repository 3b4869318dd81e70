"""Pictures of a run report: every DSA layer on the preset's roofline, and where each
layer's cycles went (compute / DRAM wait / token wait).

Figures are built with :class:`matplotlib.figure.Figure` and saved through the Agg
canvas, never through ``pyplot``: no global backend or figure registry is touched,
so importing this in a notebook changes nothing, and it works headless. The roof comes
from the hardware description (``peak_macs_per_cycle``, ``bandwidth_bytes_per_cycle``),
the points from the report's attributed ``cycles`` (the column that sums to the total).

A point may sit above the sloped (memory) part of the roof: attribution charges a cycle
to the layer holding the compute engine, so a layer whose DRAM transfers ran under its
neighbour's compute is charged less than its bytes take on the channel. That is overlap
across layers, which a per-layer roofline does not model, not a broken simulator: such
points are drawn hollow and flagged (``RooflinePoint.hidden``), and over its ``span``
(first start to last end, its transfers all inside) every layer is under the roof. No
point can pass the flat (compute) part: a layer holds the compute engine for at least
its MACs at the peak rate (``layers.checks`` flags any that does not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .hw.config import HardwareConfig
from .report import LayerRow, RunReport

#: colors of the breakdown's stacks, in stacking order
PARTS = (("compute", "compute", "tab:blue"), ("dram_wait", "DRAM wait", "tab:orange"),
         ("token_wait", "token wait", "tab:gray"))


@dataclass(frozen=True)
class RooflinePoint:
    name: str
    op: str
    intensity: float       # MACs per DRAM byte (compulsory bytes; measured when none recorded)
    macs_per_cycle: float  # achieved: MACs over the layer's attributed cycles
    roof: float            # min(peak, intensity * bandwidth): the most this layer could reach
    span_macs_per_cycle: float  # over its span, first start to last end: always under the roof

    @property
    def hidden(self) -> bool:
        """Above the roof: some of its DRAM time was charged to a neighbour it overlapped."""
        return self.macs_per_cycle > self.roof * (1 + 1e-9)


@dataclass
class RooflineData:
    """What :func:`roofline` draws, so a caller (or a test) can check it."""

    hardware: str
    peak: float                  # MACs per cycle
    bandwidth: float             # DRAM bytes per cycle
    points: list[RooflinePoint] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (layer, why not drawn)


def _dsa_rows(report: RunReport, what: str) -> list[LayerRow]:
    rows = [r for r in report.rows if r.target == "DSA"]
    if not rows:
        cpu = sum(r.target == "CPU" for r in report.rows)
        raise ValueError(f"nothing on the DSA to plot as {what}: the run report has no DSA "
                         f"layers ({cpu} layer(s) ran on the CPU; the compile report says why "
                         f"each region stayed there)")
    return rows


def roofline_data(report: RunReport, cfg: HardwareConfig) -> RooflineData:
    """Each DSA layer with MACs as a point under ``cfg``'s roof. Layers without MACs
    (pools, adds: vector-unit work) or without cycles have no place on a MAC roofline
    and are listed in ``skipped`` with the reason."""
    data = RooflineData(cfg.name, float(cfg.peak_macs_per_cycle),
                        float(cfg.bandwidth_bytes_per_cycle))
    for r in _dsa_rows(report, "a roofline"):
        moved = (r.min_read + r.min_written) or (r.dram_read + r.dram_written)
        if not r.macs:
            data.skipped.append((r.name, f"no MACs ({r.op} runs on the vector unit)"))
        elif not r.cycles:
            data.skipped.append((r.name, "no cycles charged to it"))
        elif not moved:
            data.skipped.append((r.name, "no DRAM bytes"))
        else:
            x = r.macs / moved
            data.points.append(RooflinePoint(r.name, r.op, x, r.macs / r.cycles,
                                             min(data.peak, x * data.bandwidth),
                                             r.macs / (r.span or r.cycles)))
    return data


def _colors(ops: list[str]) -> dict[str, str]:
    """One color per op kind, in order of first appearance (stable across runs)."""
    kinds = list(dict.fromkeys(ops))
    return {k: f"C{i % 10}" for i, k in enumerate(kinds)}


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    FigureCanvasAgg(fig)  # the figure draws through Agg whatever pyplot's backend is
    fig.savefig(path, dpi=100)
    return path


def roofline(report: RunReport, cfg: HardwareConfig, path: str | Path, model: str = "") -> Path:
    """Every DSA layer with MACs on ``cfg``'s roofline (log-log), colored by op kind."""
    data = roofline_data(report, cfg)
    if not data.points:
        raise ValueError(f"nothing on the roofline: none of the {len(data.skipped)} DSA "
                         f"layer(s) does MACs ({data.skipped[0][1]}, ...); the breakdown plot "
                         f"shows where their cycles went")
    xs = [p.intensity for p in data.points]
    ridge = data.peak / data.bandwidth
    lo = min(min(xs), ridge) / 4
    hi = max(max(xs), ridge) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(grid, [min(data.peak, x * data.bandwidth) for x in grid], color="black", lw=1.5,
            label=f"roof: {data.peak:g} MACs/cycle, {data.bandwidth:g} B/cycle")
    ax.axvline(ridge, color="black", lw=0.5, ls=":")
    colors = _colors([p.op for p in data.points])
    for op, color in colors.items():
        pts = [p for p in data.points if p.op == op]
        ax.scatter([p.intensity for p in pts], [p.macs_per_cycle for p in pts],
                   facecolors=[("none" if p.hidden else color) for p in pts],
                   edgecolors=[(color if p.hidden else "black") for p in pts],
                   label=f"{op} ({len(pts)})", s=28, linewidths=0.8, zorder=3)
    hidden = sum(p.hidden for p in data.points)
    if hidden:
        ax.scatter([], [], facecolors="none", edgecolors="black", s=28,
                   label=f"hollow: above the roof ({hidden}), DRAM time hidden under a "
                         f"neighbour's compute")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ymin = min(p.macs_per_cycle for p in data.points)
    ax.set_ylim(min(ymin, lo * data.bandwidth) / 2, data.peak * 2)
    ax.set_xlabel("operational intensity (MACs per compulsory DRAM byte)")
    ax.set_ylabel("achieved MACs per cycle (MACs / attributed cycles)")
    gops = 2 * cfg.mhz / 1e3  # GOPS per MAC/cycle at the part's clock
    ax.secondary_yaxis("right", functions=(lambda m: m * gops, lambda g: g / gops)).set_ylabel(
        f"GOPS at {cfg.mhz:g} MHz")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(loc="best", fontsize=8)
    title = f"{model + ' on ' if model else ''}'{data.hardware}': {len(data.points)} DSA layers"
    if data.skipped:
        title += f" ({len(data.skipped)} without MACs not shown)"
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def breakdown(report: RunReport, path: str | Path, top: int | None = None,
              model: str = "") -> Path:
    """A stacked bar per DSA layer, in program order: its attributed cycles split into
    compute, DRAM wait and token wait. ``top``: only the ``top`` layers with the most
    cycles (still in program order)."""
    if top is not None and top < 1:
        raise ValueError(f"top={top} would draw no layer; give 1 or more, or None for all")
    rows = _dsa_rows(report, "a cycle breakdown")
    count = len(rows)
    whole = max(report.total_cycles, 1)
    share = {key: sum(getattr(r, key) for r in rows) / whole for key, _, _ in PARTS}
    if top is not None and top < len(rows):
        keep = set(sorted(range(len(rows)), key=lambda i: -rows[i].cycles)[:top])
        rows = [r for i, r in enumerate(rows) if i in keep]
    n = len(rows)
    fig = Figure(figsize=(9, 1.6 + 0.22 * n), layout="constrained")
    ax = fig.add_subplot()
    left = [0] * n
    ys = list(range(n))
    for key, label, color in PARTS:
        widths = [getattr(r, key) for r in rows]
        ax.barh(ys, widths, left=left, color=color, height=0.75,
                label=f"{label} ({share[key]:.0%} of all cycles)")
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(ys, [r.name for r in rows], fontsize=7 if n > 30 else 8)
    ax.set_ylim(n - 0.5, -0.5)  # the first layer on top, no empty rows around the bars
    ax.set_xlabel("cycles charged to the layer (they sum to the total)")
    ax.grid(True, axis="x", lw=0.3, alpha=0.5)
    fig.legend(loc="outside lower center", ncols=3, fontsize=8)  # never over a bar
    shown = f"top {n} of {count} layers" if n < count else f"{n} layers"
    title = (f"{model + ' on ' if model else ''}'{report.hardware}': {shown}, "
             f"{report.total_cycles:,} cycles = {report.latency_us:,.1f} us")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)

