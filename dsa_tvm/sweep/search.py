"""Spaces too large to grid: Optuna's multi-objective search picks the points to evaluate.

Each trial takes one value per axis (``suggest_categorical``), is evaluated on every
model like a grid point, and reports two objectives to minimize: the geometric mean of
the models' latencies and the area. NSGA-II (seeded) proposes the next designs from the
front found so far; a design proposed twice is answered from the first evaluation. Up to
``workers`` trials run at once in a process pool (Optuna's ask/tell interface), so the
search uses the cores as the grid does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..hw.config import HardwareConfig
from .evaluate import PointResult
from .runner import Job, _chunk_pool, run_job
from .space import Axis, Point


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ValueError("--search optuna needs Optuna, which is not installed; "
                         "pip install optuna") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def objectives(results: Sequence[PointResult]) -> list[float] | None:
    """(geometric-mean latency over the models, area), or None when a model failed."""
    if not results or any(r.error for r in results):
        return None
    lat = math.exp(sum(math.log(max(r.latency_us, 1e-9)) for r in results) / len(results))
    return [lat, results[0].area_mm2]


def optuna_search(models: Sequence[str], axes: list[Axis], base: HardwareConfig, trials: int,
                  workers: int = 1, cache: bool = True, seed: int = 0,
                  done: Callable[[PointResult], None] | None = None) -> list[PointResult]:
    """Evaluate ``trials`` designs chosen by NSGA-II; every result, in evaluation order."""
    optuna = _optuna()
    from optuna.trial import TrialState

    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=optuna.samplers.NSGAIISampler(seed=seed))
    seen: dict[Point, list[PointResult]] = {}
    out: list[PointResult] = []

    def ask() -> tuple[object, Point]:
        trial = study.ask()
        return trial, Point(tuple((a.key, str(trial.suggest_categorical(a.key, list(a.values))))
                                  for a in axes))

    def tell(trial, results: list[PointResult]) -> None:
        values = objectives(results)
        if values is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, values)

    def evaluate(point: Point) -> list[PointResult]:
        return [run_job(Job(m, point), base, axes, cache) for m in models]

    def record(results: list[PointResult]) -> None:
        out.extend(results)
        for r in results:
            if done is not None:
                done(r)

    if workers <= 1:
        for _ in range(trials):
            trial, point = ask()
            if point not in seen:
                seen[point] = evaluate(point)
                record(seen[point])
            tell(trial, seen[point])
        return out
    with _chunk_pool(models, workers) as submit:
        pending: dict = {}                       # future -> point
        waiting: dict[Point, list] = {}          # point being evaluated -> trials asking it
        asked = 0
        while asked < trials or pending:
            while asked < trials and len(pending) < workers:
                trial, point = ask()
                asked += 1
                if point in seen:
                    tell(trial, seen[point])
                elif point in waiting:
                    waiting[point].append(trial)
                else:
                    waiting[point] = [trial]
                    pending[submit([Job(m, point) for m in models], base, axes, cache)] = point
            if not pending:
                continue
            fut = next(iter(_first_done(pending)))
            point = pending.pop(fut)
            seen[point] = fut.result()
            record(seen[point])
            for trial in waiting.pop(point):
                tell(trial, seen[point])
    return out


def _first_done(pending: dict):
    from concurrent.futures import FIRST_COMPLETED, wait

    finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
    return finished
