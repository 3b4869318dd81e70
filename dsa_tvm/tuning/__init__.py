"""Autotuning DSA schedules with MetaSchedule, measured on the simulator.

``dsa_tvm.tune(mod, work_dir=..., trials=...)`` tunes every DSA task of a model
into a MetaSchedule JSON database; ``with dsa_tvm.tuned(work_dir):`` (or the
database itself as a context) makes ``tvm.compile(..., target="dsa")`` use it.
Modules: :mod:`.task` (a task and its workload), :mod:`.measure` (builder and
runner), :mod:`.features` (cost-model features), :mod:`.search` (space,
postprocessor, mutator), :mod:`.tuner` (one task), :mod:`.api` (a model),
:mod:`.apply` (compile with a database), :mod:`.rpc` (measure on RPC servers).
"""

from .api import TuneReport, extract_tasks, tune
from .apply import TunedKnobs, open_database, tuned
from .task import Task
from .tuner import TaskResult, tune_task

__all__ = ["Task", "TaskResult", "TuneReport", "TunedKnobs", "extract_tasks", "open_database",
           "tune", "tune_task", "tuned"]
