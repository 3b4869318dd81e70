"""How well the cost model ranks candidates: rank correlations on held-out measurements.

:func:`cost_model_check` measures random candidates of a task on the simulator,
trains MetaSchedule's XGBoost model (with :class:`.features.KnobFeatures`) on
some and reports how its predictions on the others rank against the measured
cycles (Spearman's rho and Kendall's tau-b; 0 is chance, 1 a perfect order),
next to the analytic estimate's ranking as a reference point.
"""

from __future__ import annotations

import random

import numpy as np

from .features import KnobFeatures
from .measure import cycles_to_secs, measure_many
from .search import space, strategy
from .task import Task
from .tuner import target_of, without_stock_intrinsics


def ranks(x) -> np.ndarray:
    """Ranks from 0, ties sharing their average rank."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x), np.float64)
    r[order] = np.arange(len(x))
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            r[tie] = r[tie].mean()
    return r


def spearman(a, b) -> float:
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / den) if den else 0.0


def kendall_tau(a, b) -> float:
    """Kendall's tau-b (ties in either sequence accounted for)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    iu = np.triu_indices(len(a), 1)
    da, db = da[iu], db[iu]
    den = np.sqrt((da != 0).sum() * (db != 0).sum())
    return float((da * db).sum() / den) if den else 0.0


def cost_model_check(task: Task, n_train: int = 48, n_test: int = 48, seed: int = 0,
                     workers: int = 1) -> dict:
    """Train the XGB cost model on ``n_train`` measured random candidates, rank ``n_test``
    others; the rank correlations of its predictions (and of the analytic estimate)."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from tir_schedules.kinds import kind_of
    from tir_schedules.kinds.space import sample_knobs


    cands = task.candidates()
    picked = random.Random(seed).sample(cands, min(len(cands), n_train + n_test))
    if len(picked) < 8:
        raise ValueError(f"{task.name}: {len(picked)} candidates are too few to rank")
    n_train = min(n_train, len(picked) // 2)
    mod = task.workload()
    args = ArgInfo.from_prim_func(mod["main"])
    with without_stock_intrinsics():
        ctx = ms.TuneContext(mod=mod, target=target_of(task.cfg), space_generator=space(),
                             search_strategy=strategy(), task_name="main", num_threads=1)

    def candidate(knobs):
        sch = s_tir.Schedule(mod)
        sample_knobs(sch, task.shape, fixed=knobs)
        return ms.MeasureCandidate(sch, args)

    cycles = measure_many(task, picked, workers)
    model = XGBModel(extractor=KnobFeatures(), num_warmup_samples=0, adaptive_training=False)
    train, test = picked[:n_train], picked[n_train:]
    model.update(ctx, [candidate(k) for k in train],
                 [RunnerResult([cycles_to_secs(task.cfg, c)], None) for c in cycles[:n_train]])
    pred = np.asarray(model.predict(ctx, [candidate(k) for k in test]))
    speed = [1.0 / c for c in cycles[n_train:]]            # higher is better, like the model
    est = [-kind_of(task.shape).estimate(task.cfg, task.shape, k) for k in test]
    return {"task": task.name, "n_train": n_train, "n_test": len(test),
            "spearman": spearman(pred, speed), "kendall": kendall_tau(pred, speed),
            "estimate_spearman": spearman(est, speed)}
