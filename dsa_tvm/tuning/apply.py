"""Compile with tuned schedules: a MetaSchedule database in scope feeds the DSA codegen.

The TVM way to build with tuning results is to put the database in scope::

    db = ms.database.JSONDatabase(work_dir="tune")      # what dsa_tvm.tune wrote
    with db:
        ex = tvm.compile(mod, target="dsa")

or, the same, ``with dsa_tvm.tuned("tune"): ...``. The DSA pipeline asks
:func:`current_chooser` for a knob chooser; with a database in scope each layer
looks up its task's best record (layers that differ only in zero points and
clip bounds share a task, ``tir_schedules.kinds.space.perf_shape``) and takes its
knobs; a layer without a record, or whose record no longer fits the hardware,
keeps the default schedule.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

from .task import Task
from .tuner import record_knobs, workload_records

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"


class DatabaseError(ValueError):
    """A tuning work_dir cannot be used; the message names the file and the fix."""


def open_database(work_dir: str | Path):
    """The JSON database a tuning run writes into ``work_dir`` (made if missing).

    DatabaseError if ``work_dir`` is a file, cannot be written, or a line of its
    database files is not JSON (a run killed mid-write): the message names the file
    and line."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    work_dir = Path(work_dir)
    if work_dir.exists() and not work_dir.is_dir():
        raise DatabaseError(f"tuning work dir '{work_dir}' is a file; pass a folder "
                            f"(it is made if missing)")
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        for name in (WORKLOADS, RECORDS):
            (work_dir / name).touch()    # JSONDatabase would make them; fail here, clearly
    except OSError as e:
        raise DatabaseError(f"cannot write the tuning database in '{work_dir}' "
                            f"({e.strerror or e}); pass a folder you can write to") from e
    for name in (WORKLOADS, RECORDS):
        check_json_lines(work_dir / name)
    return JSONDatabase(path_workload=str(work_dir / WORKLOADS),
                        path_tuning_record=str(work_dir / RECORDS))


def check_json_lines(path: Path) -> None:
    """DatabaseError naming the first line of ``path`` that is not one JSON value."""
    import json

    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except json.JSONDecodeError as e:
                raise DatabaseError(
                    f"{path}, line {i}: not a complete database record ({e.msg}; the tuning "
                    f"run writing it was probably interrupted); delete that line (or the "
                    f"file, to start over)") from None


@contextmanager
def tuned(database):
    """Compile with the records of ``database`` (a Database or a tuning work_dir).

    A work_dir must hold a tuning database (FileNotFoundError otherwise: a
    mistyped path would silently compile with the default schedules)."""
    if isinstance(database, (str, Path)):
        folder = Path(database)
        if not (folder / RECORDS).is_file():
            what = ("does not exist" if not folder.exists() else
                    f"has no {RECORDS}" if folder.is_dir() else "is not a folder")
            raise FileNotFoundError(f"no tuning database: '{folder}' {what}; pass the "
                                    f"work_dir a tuning run wrote (dsa_tvm.tune(mod, "
                                    f"work_dir=...) or dsa-tvm tune --work-dir)")
        database = open_database(folder)
    with database:
        yield database


class TunedKnobs:
    """A ``compile_region`` knob chooser backed by a database (see the module docstring).

    ``hits`` / ``misses`` count the layers that took a tuned / the default schedule."""

    def __init__(self, db):
        self.db = db
        self.hits = 0
        self.misses = 0
        self._cache: dict = {}

    def __call__(self, cfg, shape):
        from tir_schedules.kinds.space import MissingKnob, check_knobs, perf_shape

        key = (cfg.fingerprint, shape)
        if key not in self._cache:
            try:
                self._cache[key] = self._lookup(Task(cfg, perf_shape(shape)))
            except MissingKnob as e:  # tuned before the room gained a knob: default
                warnings.warn(f"tuning record for {type(shape).__name__} ignored ({e}); the "
                              f"layer takes its default schedule: tune again (dsa-tvm tune) "
                              f"to search the current knobs", stacklevel=2)
                self._cache[key] = None
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
        records = workload_records(self.db, task)
        return record_knobs(records[0], task) if records else None


def current_chooser() -> TunedKnobs | None:
    """A chooser for the MetaSchedule database in scope, or None (default schedules)."""
    from tvm.s_tir.meta_schedule.database import Database

    db = Database.current()
    return TunedKnobs(db) if db is not None else None
