"""Tuning as a library in someone else's process: a seed repeats the run exactly (one
worker), whatever the host drew from numpy before; the host's logging setup neither
breaks tuning nor is changed by it; arguments that cannot mean anything are refused.

The reference for "the same run" is the database itself: the same knob settings
measured in the same order with the same simulated cycles.
"""

from __future__ import annotations

import io
import logging
import random

import numpy as np
import pytest

from dsa_tvm.hw.config import load_config
from dsa_tvm.tuning import Task, open_database, tune, tune_task, tuned
from dsa_tvm.tuning.measure import secs_to_cycles
from dsa_tvm.tuning.tuner import record_knobs
from tir_schedules.kinds.conv2d import ConvShape

DEFAULT = load_config("default")
MS_LOGGER = "tvm.s_tir.meta_schedule"


def small_task() -> Task:
    b = DEFAULT.block_in
    return Task(DEFAULT, ConvShape(1, 14, 14, 2, 4, 3, 3, (1, 1), (1,) * 4, (1, 1), b, b, 0, 0,
                                   (-128, 127)))


def measured_in_order(work, task: Task) -> list[tuple]:
    """(knobs, cycles) of every record, in the order the run committed them."""
    from tvm.s_tir.meta_schedule.database import TuningRecord

    db = open_database(work)
    workload = db.commit_workload(task.workload())
    out = []
    for line in (work / "database_tuning_record.json").read_text().splitlines():
        import json

        _, rec = json.loads(line)
        r = TuningRecord.from_json(rec, workload)
        out.append((record_knobs(r, task), secs_to_cycles(DEFAULT, float(r.run_secs[0]))))
    return out


def test_a_seed_repeats_the_run_whatever_numpy_drew_before(tmp_path):
    """Same seed, one worker: the same candidates measured in the same order, although
    the host's global numpy and random state differ between the two runs (MetaSchedule's
    XGB model drew its warm-up scores from numpy's global generator: the old code picked
    different candidates here). The host's generator state is given back unchanged."""
    task = small_task()
    runs = []
    for i, host_seed in enumerate((1, 2)):
        np.random.seed(host_seed)
        random.seed(host_seed)
        np.random.random(host_seed * 7)   # some other work in the host process
        state = np.random.get_state()[1].copy()
        work = tmp_path / f"run{i}"
        r = tune_task(task, 8, open_database(work), work / "task", seed=3, workers=1,
                      progress=False)
        assert np.array_equal(np.random.get_state()[1], state)   # host state restored
        runs.append((r.best_knobs, r.best_cycles, measured_in_order(work, task)))
    assert runs[0] == runs[1]
    assert len(runs[0][2]) == 8 and len({k for k, _ in runs[0][2]}) >= 7


def test_tuning_works_with_an_unnamed_handler_on_metaschedules_logger(tmp_path):
    """A plain (unnamed) StreamHandler on MetaSchedule's logger, as a host program or
    pytest >= 9.1 sets up, failed ``tune_tir`` ('NoneType' object has no attribute
    'format'). Now tuning runs, writes its task log into the work dir, and leaves the
    host's handlers as they were (MetaSchedule's dictConfig closed them all)."""
    ms_log = logging.getLogger(MS_LOGGER)
    root = logging.getLogger()
    host = logging.StreamHandler(io.StringIO())
    host_root = logging.StreamHandler(io.StringIO())
    assert host.get_name() is None
    ms_log.addHandler(host)
    root.addHandler(host_root)
    try:
        before = (list(ms_log.handlers), ms_log.level, ms_log.propagate, list(root.handlers))
        task = small_task()
        r = tune_task(task, 4, open_database(tmp_path), tmp_path / "task", seed=0, workers=1,
                      progress=False)
        assert r.trials == 4 and r.best_cycles <= r.default_cycles
        assert (list(ms_log.handlers), ms_log.level, ms_log.propagate,
                list(root.handlers)) == before
        logs = list((tmp_path / "task" / "ms" / "logs").glob("*.log"))
        assert logs and any(p.stat().st_size for p in logs)
        logging.getLogger(MS_LOGGER).warning("host still logs")
        assert "host still logs" in host.stream.getvalue()
    finally:
        ms_log.removeHandler(host)
        root.removeHandler(host_root)


def test_tuned_refuses_a_folder_without_a_database(tmp_path):
    """``dsa_tvm.tuned("typo_dir")`` compiled with the default schedules, silently."""
    with pytest.raises(FileNotFoundError, match="no tuning database: .*typo_dir' does not exist"):
        with tuned(tmp_path / "typo_dir"):
            pass
    assert not (tmp_path / "typo_dir").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no database_tuning_record.json"):
        with tuned(tmp_path / "empty"):
            pass


@pytest.mark.parametrize("kw", [{"trials": -3}, {"trials": 0}, {"trials": 2, "workers": -2},
                                {"trials": 2, "workers": 0}])
def test_tune_refuses_budgets_below_one(tmp_path, kw):
    with pytest.raises(ValueError, match="must be a whole number >= 1"):
        tune(None, work_dir=tmp_path, **kw)
    with pytest.raises(ValueError, match="must be a whole number >= 1"):
        tune_task(small_task(), db=None, work_dir=tmp_path, **{"workers": None, **kw})
