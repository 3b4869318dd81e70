"""MetaSchedule builder and runner for the DSA: lower to a program, time it on the simulator.

* :class:`DSABuilder` lowers each candidate (a sampled module, see
  ``tir_schedules.kinds.space``) to a DSA program with the existing schedule, walker
  and dependency pass: no LLVM. The artifact is a folder of its own (MetaSchedule
  deletes it after the measurement) holding the program container and the
  hardware description it was built for. A candidate whose knobs do not fit is
  a build error naming the reason, so it is never run.
* :class:`SimRunner` runs each artifact on the simulator in timing-only mode and
  reports the cycles as seconds at the hardware clock.

Both work in this process, or, with ``workers`` > 1, on a pool of worker
processes shared by every builder and runner of this process (lowering and
simulation are pure Python: threads would not run them side by side). A job
carries the task as its JSON text and the knob dataclass, never a TVM object.

:func:`measure_bytes` is the measurement itself; the RPC servers (:mod:`.rpc`)
call the same function.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from concurrent.futures import Future
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerInput, RunnerResult
from tvm.support.popen_pool import PopenPoolExecutor

from ..gc_pause import paused_gc
from ..hw.config import HardwareConfig, config_from_dict
from ..sim.simulator import Simulator
from .task import Task, measure_knobs, simulate_cycles, task_from_json, task_json_of, task_of

PROGRAM_FILE = "program.dsa"
HW_FILE = "hardware.json"


def checked_knobs(mod) -> tuple[Task, object]:
    """The task and knobs of a sampled module; ValueError naming the misfit if they do
    not fit the hardware."""
    from tir_schedules.kinds.space import check_knobs, knobs_from_mod

    task = task_of(mod)
    knobs = knobs_from_mod(mod, task.shape)
    problem = check_knobs(task.cfg, task.shape, knobs)
    if problem:
        raise ValueError(f"rejected before measurement: {knobs} does not fit "
                         f"'{task.cfg.name}': {problem}")
    return task, knobs


def build_knobs(task: Task, knobs, root: str | None = None) -> str:
    """Lower ``task`` with ``knobs`` into a fresh folder of its own; the program file's path.

    The artifact path must be a file in a folder of its own: MetaSchedule's
    ``RemoveBuildArtifact`` callback deletes ``dirname(artifact_path)``."""
    program = task.program(knobs).to_bytes(task.cfg)  # lowered with the collector paused
    folder = Path(tempfile.mkdtemp(prefix="dsa-tune-", dir=root))
    (folder / PROGRAM_FILE).write_bytes(program)
    (folder / HW_FILE).write_text(json.dumps(task.cfg.as_dict(), sort_keys=True))
    return str(folder / PROGRAM_FILE)


def _build_job(task_json: str, hw_json: str, knobs, root: str | None) -> str:
    """:func:`build_knobs` in a worker process (the task travels as its JSON text)."""
    return build_knobs(task_from_json(task_json, hw_json), knobs, root)


def _measure_job(task_json: str, hw_json: str, knobs) -> int:
    """:func:`measure_knobs` in a worker process."""
    return measure_knobs(task_from_json(task_json, hw_json), knobs)


def measure_many(task: Task, knobs: list, workers: int = 1) -> list[int]:
    """Simulated cycles of each knob setting's program (on ``workers`` processes)."""
    pool = worker_pool(workers)
    if pool is None:
        return [measure_knobs(task, k) for k in knobs]
    task_json, hw_json = task_json_of(task.workload())
    jobs = [pool.submit(_measure_job, task_json, hw_json, k) for k in knobs]
    return [job.result() for job in jobs]


_POOL: tuple[int, PopenPoolExecutor] | None = None


def worker_pool(workers: int) -> PopenPoolExecutor | None:
    """The shared pool of ``workers`` processes (None for one: work in this process).

    TVM's own process pool (the one MetaSchedule's local builder uses): fresh
    interpreters, so the caller's script is not re-imported (no ``__main__`` guard
    needed) and this process's TVM and XGBoost threads are not forked. Workers are
    kept for the life of the process, so only the first tuning task pays their start."""
    global _POOL
    if workers <= 1:
        return None
    if _POOL is None or _POOL[0] != workers:
        if _POOL is not None:
            _POOL[1].shutdown()
        _POOL = (workers, PopenPoolExecutor(workers, initializer=_warm_worker))
    return _POOL[1]


def _warm_worker() -> None:
    """Import the lowering and the simulator once, when the worker starts; leave Ctrl-C
    to the tuning process (it ends the run and the pool; a worker would only print)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from tir_schedules.kinds import kinds

    kinds()  # every room



def read_artifact(path: str | Path) -> tuple[HardwareConfig, bytes]:
    """The hardware description and program container of an artifact (its program file)."""
    hw = Path(path).parent / HW_FILE
    return config_from_dict(json.loads(hw.read_text()), str(hw)), Path(path).read_bytes()


def measure_bytes(cfg: HardwareConfig, program: bytes) -> int:
    """Simulated cycles of a program container."""
    with paused_gc():
        return simulate_cycles(cfg, Simulator(cfg).load_program(program))


def measure_artifact(path: str | Path) -> float:
    """An artifact's simulated time, in seconds at its hardware's clock."""
    cfg, program = read_artifact(path)
    return cycles_to_secs(cfg, measure_bytes(cfg, program))


def cycles_to_secs(cfg: HardwareConfig, cycles: int) -> float:
    return cycles / (cfg.mhz * 1e6)


def secs_to_cycles(cfg: HardwareConfig, secs: float) -> int:
    return int(round(secs * cfg.mhz * 1e6))


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


@derived_object
class DSABuilder(PyBuilder):
    """Candidates -> DSA program artifacts (see the module docstring)."""

    def __init__(self, root: str | None = None, workers: int = 1):
        super().__init__()
        self.root = root
        self.workers = workers

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        if self.root is None:  # artifact folders live in a folder of this builder's own
            self.root = tempfile.mkdtemp(prefix="dsa-tune-artifacts-")
        pool = worker_pool(self.workers)
        jobs: list[Future] = []
        for inp in build_inputs:
            try:
                task, knobs = checked_knobs(inp.mod)
            except Exception as e:  # noqa: BLE001 - reported to MetaSchedule as a build error
                jobs.append(_failed(e))
            else:
                jobs.append(_now(build_knobs, task, knobs, self.root) if pool is None else
                            pool.submit(_build_job, *task_json_of(inp.mod), knobs, self.root))
        out = []
        for job in jobs:
            try:
                out.append(BuilderResult(job.result(), None))
            except Exception as e:  # noqa: BLE001 - a build error, as above
                out.append(BuilderResult(None, _error(e)))
        return out

    def cleanup(self) -> None:
        """Remove the artifacts' folder (MetaSchedule removes each artifact after its
        measurement; this removes the folder that held them)."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def _failed(e: BaseException) -> Future:
    f: Future = Future()
    f.set_exception(e)
    return f


def _now(fn, *args) -> Future:
    """``fn(*args)`` called here, as a finished future (its result or its exception)."""
    f: Future = Future()
    try:
        f.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001 - the caller reports it
        f.set_exception(e)
    return f


@derived_object
class SecondsFuture(PyRunnerFuture):
    """A measurement in a worker, on an RPC server or already done: its seconds, or the
    error (after ``error_prefix``) for MetaSchedule."""

    def __init__(self, future: Future, error_prefix: str = ""):
        super().__init__()
        self.future, self.error_prefix = future, error_prefix

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> RunnerResult:
        try:
            return RunnerResult([self.future.result()], None)
        except Exception as e:  # noqa: BLE001 - reported to MetaSchedule as a run error
            return RunnerResult(None, self.error_prefix + _error(e))


@derived_object
class SimRunner(PyRunner):
    """Time each artifact on the simulator: in this process, or on ``workers`` processes."""

    def __init__(self, workers: int = 1):
        super().__init__()
        self.workers = workers

    def run(self, runner_inputs: list[RunnerInput]) -> list:
        pool = worker_pool(self.workers)
        return [SecondsFuture(_now(measure_artifact, inp.artifact_path) if pool is None else
                              pool.submit(measure_artifact, inp.artifact_path))
                for inp in runner_inputs]
