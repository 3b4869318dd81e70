"""Design-space sweeps: compile and time models over a grid of hardware descriptions.

``dsa_tvm.sweep.sweep(["resnet18"], ["array=8,16,32", "dram.bandwidth_bytes_per_cycle=4,16,64"])``
evaluates every point (``space``) on every model (``evaluate``) over a process pool or a
Ray cluster (``runner``), and returns a :class:`SweepResult` that prints as a table,
writes CSV and JSON, and draws the Pareto fronts (``pareto``). ``dsa-tvm sweep`` is the
command line of it.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..hw.config import HardwareConfig, load_config
from .evaluate import PointResult, evaluate_point
from .pareto import OBJECTIVES, pareto_front, plot_pareto
from .runner import Job, model_module, ordered_jobs, run_jobs
from .space import MAX_GRID, Axis, Point, check_axes, grid, grid_size, parse_axes

__all__ = ["Axis", "Point", "PointResult", "SweepResult", "evaluate_point", "grid",
           "pareto_front", "parse_axes", "plot_pareto", "sweep"]


@dataclass
class SweepResult:
    base: str
    axes: list[Axis]
    results: list[PointResult]
    seconds: float = 0.0
    workers: int = 1
    cache: bool = True
    search: str = "grid"         # or "optuna: N trials (seed S)"
    files: dict[str, Path] = field(default_factory=dict)

    def front(self, model: str | None = None) -> list[PointResult]:
        """The Pareto-optimal designs (latency, area) of ``model`` (the first one)."""
        model = model or (self.results[0].model if self.results else "")
        return pareto_front([r for r in self.results if r.model == model])

    def write(self, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
        """``sweep.csv`` (one row per model and point), ``sweep.json`` (with each point's
        per-layer bounds) and ``pareto.png`` into ``out_dir`` (made if missing)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        rows = [r.row() for r in self.results]
        cols = list(dict.fromkeys(k for row in rows for k in row))
        with open(out / "sweep.csv", "w", newline="") as f:
            w = csv.DictWriter(f, cols, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        self.files["csv"] = out / "sweep.csv"
        doc = {"base": self.base, "axes": {a.key: list(a.values) for a in self.axes},
               "objectives": list(OBJECTIVES), "seconds": self.seconds,
               "workers": self.workers, "program_cache": self.cache, "search": self.search,
               "pareto": {m: [r.point for r in self.front(m)] for m in self.models},
               "points": [asdict(r) for r in self.results]}
        (out / "sweep.json").write_text(json.dumps(doc, indent=1))
        self.files["json"] = out / "sweep.json"
        if plot and any(not r.error for r in self.results):
            self.files["pareto"] = plot_pareto(self.results, out / "pareto.png")
        return self.files

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(r.model for r in self.results))

    def __str__(self) -> str:
        keys = [a.key for a in self.axes]
        names = [k.rpartition(".")[2][:14] for k in keys]
        widths = [max(len(n), *(len(v) for v in a.values)) for n, a in zip(names, self.axes)]
        lines = [f"sweep of {', '.join(self.models)} over {len(self.results)} runs "
                 f"(base '{self.base}', {self.search}, {self.workers} worker(s), "
                 f"{self.seconds:.1f} s"
                 f"{', program cache on' if self.cache else ', program cache off'})"]
        head = ("  " + " ".join(f"{n:>{w}}" for n, w in zip(names, widths))
                + f" {'latency us':>11} {'host us':>9} {'area mm2':>9} {'energy uJ':>10} "
                  f"{'util':>6} {'DRAM MB':>8} {'DSA MACs':>8}  bound c/m")
        for model in self.models:
            front = {id(r) for r in self.front(model)}
            lines += [f"{model}:", head]
            for r in (x for x in self.results if x.model == model):
                vals = " ".join(f"{r.values.get(k, ''):>{w}}" for k, w in zip(keys, widths))
                mark = "*" if id(r) in front else ("!" if r.error else " ")
                if r.error:
                    lines.append(f"{mark} {vals} {r.error}")
                    continue
                lines.append(f"{mark} {vals} {r.latency_us:>11,.1f} {r.host_us:>9,.1f} "
                             f"{r.area_mm2:>9.2f} {r.energy_uj:>10.1f} {r.mac_utilization:>6.1%} "
                             f"{r.dram_bytes / 1e6:>8.2f} {r.dsa_mac_share:>8.1%}  "
                             f"{r.compute_bound_layers}/{r.memory_bound_layers}")
        lines.append("* on the Pareto front (latency, area); latency: DSA time + launch "
                     "overheads + the host's estimate for what stays on it (host us); energy: the "
                     "DSA's; bound c/m: layers whose roofline bound is the MAC array / DRAM")
        notes = sorted({r.note for r in self.results if r.note})
        lines += [f"note: {n} (some points)" for n in notes]
        return "\n".join(lines)


def sweep(models: Sequence[str], axes: Sequence[str] | list[Axis],
          hw: str | Path | HardwareConfig | None = None, workers: int | None = None,
          cache: bool = True, ray_address: str | None = None, progress: bool = True,
          search: str = "grid", trials: int | None = None, seed: int = 0) -> SweepResult:
    """Every model at every point of the grid of ``axes`` (``"dram.bandwidth_bytes_per_cycle=4,16"``
    texts or :class:`Axis`) over the description ``hw``; ``workers`` processes (default: all
    cores, at most one per two points); ``ray_address`` runs the points on a Ray cluster.
    ``search="optuna"`` evaluates ``trials`` designs chosen by Optuna's NSGA-II instead of
    the whole grid (for spaces too large to grid). With ``workers > 1`` the pool spawns
    processes that import the calling script: call it under ``if __name__ == "__main__":``
    in a script (as ``multiprocessing`` requires)."""
    import os

    base = load_config(hw)
    axes = (list(axes) if all(isinstance(a, Axis) for a in axes)
            else parse_axes([str(a) for a in axes]))
    check_axes(base, axes)
    if not models:
        raise ValueError("no model to sweep; name a bundled model or a QDQ ONNX file")
    if search not in ("grid", "optuna"):
        raise ValueError(f"search must be 'grid' or 'optuna', got {search!r}")
    n = grid_size(axes)
    if search == "grid" and n > MAX_GRID:
        raise ValueError(f"the grid has {n:,} points (more than {MAX_GRID:,}); sweep fewer "
                         f"values per axis, or search it: --search optuna --trials N")
    if search == "optuna" and (trials is None or trials < 1):
        raise ValueError("--search optuna needs --trials N (how many designs to evaluate)")
    for m in models:   # a missing or FP32 model fails here, before any worker starts
        model_module(m)
    t0 = time.perf_counter()
    if search == "optuna":
        if ray_address is not None:
            raise ValueError("--search optuna runs on the local process pool; drop --ray")
        workers = workers or min(os.cpu_count() or 1, trials)
        results = _searched(models, axes, base, trials, workers, cache, seed, progress)
        return SweepResult(base.name, axes, results, time.perf_counter() - t0, workers, cache,
                           f"optuna NSGA-II: {trials} trials of {n:,} designs (seed {seed})")
    jobs: list[Job] = ordered_jobs(models, grid(axes), base, axes)
    workers = workers or min(os.cpu_count() or 1, max(1, len(jobs) // 2))
    results = run_jobs(jobs, base, axes, workers, cache, ray_address, progress)
    order = {p: i for i, p in enumerate(grid(axes))}
    rank = {m: i for i, m in enumerate(dict.fromkeys(r.model for r in results))}
    results.sort(key=lambda r: (rank[r.model], order.get(_point_of(r), 0)))
    return SweepResult(base.name, axes, results, time.perf_counter() - t0, workers, cache)


def _searched(models, axes, base, trials, workers, cache, seed, progress) -> list[PointResult]:
    import sys

    from tqdm import tqdm

    from .search import optuna_search

    with tqdm(total=trials * len(models), desc="search", unit="run", disable=not progress,
              file=sys.stderr) as bar:
        return optuna_search(models, axes, base, trials, workers, cache, seed,
                             done=lambda _r: bar.update(1))


def _point_of(r: PointResult) -> Point:
    return Point(tuple(r.values.items()))
