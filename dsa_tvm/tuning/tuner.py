"""Tune one task with MetaSchedule: evolutionary search, XGBoost, simulator measurements.

:func:`tune_task` seeds the task's database entry with the default schedule,
measured (the search starts from it, and the result is never worse than it),
then runs ``meta_schedule.tune_tir`` with the DSA space, builder, runner,
feature extractor and the XGBoost cost model. The best record of the database
is the result; ``dsa_tvm.tuning.apply`` reads the same database at compile time.
"""

from __future__ import annotations

import os
import sys
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..target import target
from .features import KnobFeatures
from .isolate import own_loggers, seeded_rngs
from .measure import DSABuilder, SimRunner, cycles_to_secs, secs_to_cycles
from .progress import TrialProgress
from .search import searchable, space, strategy
from .task import Task, measure_knobs


@dataclass
class TaskResult:
    """What tuning one task gave (cycles are simulated, for this task's layer alone)."""

    task: Task
    default_knobs: object
    default_cycles: int
    best_knobs: object
    best_cycles: int
    trials: int            # candidates measured in this run, the default included
    seconds: float

    @property
    def speedup(self) -> float:
        return self.default_cycles / self.best_cycles


def target_of(cfg):
    return target(cfg)


def workload_records(db, task: Task) -> list:
    """Every valid record of ``task`` in ``db``, fastest first."""
    mod = task.workload()
    if not db.has_workload(mod):
        return []
    return [r for r in db.get_top_k(db.commit_workload(mod), 1 << 30)
            if r.run_secs and all(s < 1e9 for s in [float(x) for x in r.run_secs])]


def record_knobs(record, task: Task):
    """The knob setting a tuning record's trace decides."""
    from tvm import s_tir

    from tir_schedules.kinds.space import knobs_from_mod

    sch = s_tir.Schedule(task.workload())
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return knobs_from_mod(sch.mod, task.shape)


def commit_knobs(db, task: Task, knobs, cycles: int) -> None:
    """Store a measured knob setting as a tuning record (a replayable trace)."""
    from tvm import s_tir
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord

    from tir_schedules.kinds.space import sample_knobs


    mod = task.workload()
    sch = s_tir.Schedule(mod)
    sample_knobs(sch, task.shape, fixed=knobs)
    db.commit_tuning_record(TuningRecord(
        sch.trace, db.commit_workload(mod), [cycles_to_secs(task.cfg, cycles)],
        target_of(task.cfg), ArgInfo.from_prim_func(mod["main"])))


def check_budget(trials: int, workers: int | None) -> None:
    """ValueError naming the fix unless ``trials`` >= 1 and ``workers`` is None or >= 1."""
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be a whole number >= 1 (got {trials!r}); 1 measures only "
                         f"the default schedule")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool)
                                or workers < 1):
        raise ValueError(f"workers must be a whole number >= 1 (got {workers!r}); leave it unset "
                         f"for one per core")


def default_workers() -> int:
    """Worker processes for building and measuring candidates: one per core."""
    return max(1, os.cpu_count() or 1)


def tune_task(task: Task, trials: int, db, work_dir: str | Path, runner=None,
              seed: int | None = 0, per_iter: int = 16,
              workers: int | None = None, progress: bool | None = None) -> TaskResult:
    """Measure the default, then search ``trials - 1`` more candidates; the best.

    ``workers`` processes build the candidates and, with the local runner, measure
    them (default: one per core; 1 works in this process). ``progress``: a bar over
    the trials (None: only on a terminal)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.measure_callback import MeasureCallback


    check_budget(trials, workers)
    t0 = time.perf_counter()
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    workers = default_workers() if workers is None else workers
    default = task.default_knobs()
    default_cycles = measure_knobs(task, default)
    commit_knobs(db, task, default, default_cycles)
    before = len(workload_records(db, task))
    search = min(trials - 1, len([k for k in searchable(task) if k != default]))
    if search > 0:
        builder = DSABuilder(str(work_dir / "artifacts"), workers=workers)
        (work_dir / "artifacts").mkdir(exist_ok=True)
        bar = TrialProgress(task.name, search, task.cfg.mhz, default_cycles, progress)
        try:
            with without_stock_intrinsics(), own_loggers(), seeded_rngs(seed):
                ms.tune_tir(task.workload(), target_of(task.cfg), str(work_dir / "ms"),
                            max_trials_global=search, num_trials_per_iter=min(per_iter, search),
                            builder=builder, runner=runner or SimRunner(workers), database=db,
                            cost_model=XGBModel(extractor=KnobFeatures(),
                                                num_warmup_samples=per_iter,
                                                adaptive_training=False),
                            measure_callbacks=[*MeasureCallback.create("default"), bar],
                            space=space(), strategy=strategy(), task_scheduler="round-robin",
                            num_tuning_cores=1, seed=seed)
        finally:
            bar.close()
            builder.cleanup()
    records = workload_records(db, task)
    best = records[0]
    best_knobs = record_knobs(best, task)
    best_cycles = secs_to_cycles(task.cfg, float(best.run_secs[0]))
    return TaskResult(task, default, default_cycles, best_knobs, best_cycles,
                      1 + len(records) - before, time.perf_counter() - t0)


_INTRIN = "tvm.s_tir.tensor_intrin"


@contextmanager
def without_stock_intrinsics():
    """Let ``TuneContext`` skip importing TVM's stock tensor intrinsics.

    ``TuneContext.__init__`` imports ``tvm.s_tir.tensor_intrin``, which parses
    hundreds of CUDA/x86/ARM intrinsics in TVMScript: 10 s on an idle machine, over
    2 minutes on a loaded 2-core one. The DSA space uses none of them (its
    intrinsics are ``tir_schedules.intrinsics``), so while our tuning contexts are
    created an empty module stands in; it is removed afterwards, so a later real
    import still gets the real package."""
    if _INTRIN in sys.modules:
        yield
        return
    sys.modules[_INTRIN] = types.ModuleType(_INTRIN, "stand-in while DSA tuning contexts start")
    try:
        yield
    finally:
        if getattr(sys.modules.get(_INTRIN), "__doc__", "").startswith("stand-in"):
            del sys.modules[_INTRIN]
