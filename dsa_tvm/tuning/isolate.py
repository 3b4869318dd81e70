"""Run MetaSchedule inside the host's process without borrowing the host's state.

* :func:`own_loggers` — ``ms.tune_tir`` configures logging with ``dictConfig``:
  it lists the handlers already on logger ``tvm.s_tir.meta_schedule`` by
  ``handler.get_name()``, so one unnamed handler there (a user's
  ``StreamHandler``; pytest >= 9.1 puts its capture handler on every
  non-propagating logger) fails the tuning run with ``'NoneType' object has no
  attribute 'format'``; and ``dictConfig`` closes every handler of the process
  and adds a console handler printing each iteration. While our tuning runs,
  its task loggers are made here instead: plain loggers below
  ``tvm.s_tir.meta_schedule.dsa`` writing to ``<work_dir>/logs``, nothing else
  touched.
* :func:`seeded_rngs` — what makes a seed reproduce a run (checked with one
  worker, ``tests/tuning/test_tuning_repro.py``): MetaSchedule seeds its own random
  state (sampling, evolution) from ``seed``, and the XGBoost booster has a fixed
  seed and one thread, but ``XGBModel.predict`` scores candidates with numpy's
  *global* generator (``np.random.uniform``) until it has its warm-up samples,
  so the first batches measured depended on whatever the process drew before.
  numpy's and Python's global generators are seeded from ``seed`` for the run
  and restored afterwards.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

GLOBAL_LOGGER = "tvm.s_tir.meta_schedule"
TASK_LOGGERS = GLOBAL_LOGGER + ".dsa"


@contextmanager
def own_loggers() -> Iterator[None]:
    """Within: ``ms.tune_tir`` gets task loggers from :func:`_task_loggers`, and the global
    MetaSchedule logger, if the host left its level unset, shows warnings only."""
    from tvm.s_tir.meta_schedule import tir_integration

    made: list[logging.Handler] = []
    original = tir_integration.get_loggers_from_work_dir
    tir_integration.get_loggers_from_work_dir = lambda work_dir, names: _task_loggers(
        work_dir, names, made)
    root = logging.getLogger(GLOBAL_LOGGER)
    level = root.level
    if level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        tir_integration.get_loggers_from_work_dir = original
        root.setLevel(level)
        for h in made:
            logging.getLogger(h.get_name()).removeHandler(h)
            h.close()


def _task_loggers(work_dir: str, names: list[str], made: list) -> list[logging.Logger]:
    """One file-logging logger per task (what MetaSchedule's own setup would give)."""
    log_dir = Path(work_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for i, name in enumerate(names):
        logger = logging.getLogger(f"{TASK_LOGGERS}.task_{i}_{name[:100]}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        h = logging.FileHandler(log_dir / f"task_{i}_{name[:100]}.log", mode="a")
        h.set_name(logger.name)
        h.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s",
                                         "%Y-%m-%d %H:%M:%S"))
        logger.addHandler(h)
        made.append(h)
        out.append(logger)
    return out


@contextmanager
def seeded_rngs(seed: int | None) -> Iterator[None]:
    """numpy's and Python's global generators seeded from ``seed`` within, restored after
    (``seed=None``: left alone, the run is not reproducible)."""
    if seed is None:
        yield
        return
    np_state, py_state = np.random.get_state(), random.getstate()
    np.random.seed(seed % 2**32)
    random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
