"""Compile with tuned schedules: a MetaSchedule database in scope feeds the DSA codegen.

The TVM way to build with tuning results is to put the database in scope::

    db = ms.database.JSONDatabase(work_dir="tune")      # what dsa_tvm.tune wrote
    with db:
        ex = tvm.compile(mod, target="dsa")

or, the same, ``with dsa_tvm.tuned("tune"): ...``. The DSA pipeline asks
:func:`current_chooser` for a knob chooser; with a database in scope each layer
looks up its task's best record (layers that differ only in zero points and
clip bounds share a task, ``tir_schedules.space.perf_shape``) and takes its
knobs; a layer without a record, or whose record no longer fits the hardware,
keeps the default schedule.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from .task import Task


def open_database(work_dir: str | Path):
    """The JSON database a tuning run writes into ``work_dir``."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    return JSONDatabase(path_workload=str(work_dir / "database_workload.json"),
                        path_tuning_record=str(work_dir / "database_tuning_record.json"))


@contextmanager
def tuned(database):
    """Compile with the records of ``database`` (a Database or a tuning work_dir)."""
    db = open_database(database) if isinstance(database, (str, Path)) else database
    with db:
        yield db


class TunedKnobs:
    """A ``compile_region`` knob chooser backed by a database (see the module docstring).

    ``hits`` / ``misses`` count the layers that took a tuned / the default schedule."""

    def __init__(self, db):
        self.db = db
        self.hits = 0
        self.misses = 0
        self._cache: dict = {}

    def __call__(self, cfg, shape):
        from tir_schedules.space import check_knobs, perf_shape

        key = (cfg.fingerprint, shape)
        if key not in self._cache:
            try:
                self._cache[key] = self._lookup(Task(cfg, perf_shape(shape)))
            except (TypeError, ValueError):  # a layer kind without a tuning space: default
                self._cache[key] = None
        knobs = self._cache[key]
        if knobs is not None and check_knobs(cfg, shape, knobs) is not None:
            knobs = None
        if knobs is None:
            self.misses += 1
        else:
            self.hits += 1
        return knobs

    def _lookup(self, task: Task):
        from .tuner import record_knobs, workload_records

        records = workload_records(self.db, task)
        return record_knobs(records[0], task) if records else None


def current_chooser() -> TunedKnobs | None:
    """A chooser for the MetaSchedule database in scope, or None (default schedules)."""
    from tvm.s_tir.meta_schedule.database import Database

    db = Database.current()
    return TunedKnobs(db) if db is not None else None
