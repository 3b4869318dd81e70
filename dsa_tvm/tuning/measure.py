"""MetaSchedule builder and runner for the DSA: lower to a program, time it on the simulator.

* :class:`DSABuilder` lowers each candidate (a sampled module, see
  ``tir_schedules.space``) to a DSA program with the existing schedule, walker
  and dependency pass: no LLVM. The artifact is a folder of its own (MetaSchedule
  deletes it after the measurement) holding the program container and the
  hardware description it was built for. A candidate whose knobs do not fit is
  a build error naming the reason, so it is never run.
* :class:`SimRunner` runs each artifact on the simulator in timing-only mode in
  this process and reports the cycles as seconds at the hardware clock.

:func:`measure_artifact` is the measurement itself; the RPC servers
(:mod:`.rpc`) call the same function.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerInput, RunnerResult

from ..hw.config import HardwareConfig, config_from_dict
from .task import simulate_cycles, task_of

PROGRAM_FILE = "program.dsa"
HW_FILE = "hardware.json"


def build_artifact(mod, root: str | None = None) -> str:
    """Lower one sampled module into a fresh folder of its own; the program file's path.

    The artifact path must be a file in a folder of its own: MetaSchedule's
    ``RemoveBuildArtifact`` callback deletes ``dirname(artifact_path)``."""
    from tir_schedules.space import check_knobs, knobs_from_mod

    task = task_of(mod)
    knobs = knobs_from_mod(mod, task.shape)
    problem = check_knobs(task.cfg, task.shape, knobs)
    if problem:
        raise ValueError(f"rejected before measurement: {knobs} does not fit "
                         f"'{task.cfg.name}': {problem}")
    prog = task.program(knobs)
    folder = Path(tempfile.mkdtemp(prefix="dsa-tune-", dir=root))
    (folder / PROGRAM_FILE).write_bytes(prog.to_bytes(task.cfg))
    (folder / HW_FILE).write_text(json.dumps(task.cfg.as_dict(), sort_keys=True))
    return str(folder / PROGRAM_FILE)


def read_artifact(path: str | Path) -> tuple[HardwareConfig, bytes]:
    """The hardware description and program container of an artifact (its program file)."""
    folder = Path(path).parent
    cfg = config_from_dict(json.loads((folder / HW_FILE).read_text()), str(folder / HW_FILE))
    return cfg, (folder / PROGRAM_FILE).read_bytes()


def measure_bytes(cfg: HardwareConfig, program: bytes) -> int:
    """Simulated cycles of a program container."""
    from ..sim.simulator import Simulator

    return simulate_cycles(cfg, Simulator(cfg).load_program(program))


def measure_artifact(path: str | Path) -> int:
    cfg, program = read_artifact(path)
    return measure_bytes(cfg, program)


def cycles_to_secs(cfg: HardwareConfig, cycles: int) -> float:
    return cycles / (cfg.mhz * 1e6)


def secs_to_cycles(cfg: HardwareConfig, secs: float) -> int:
    return int(round(secs * cfg.mhz * 1e6))


@derived_object
class DSABuilder(PyBuilder):
    """Candidates -> DSA program artifacts (see the module docstring)."""

    def __init__(self, root: str | None = None):
        super().__init__()
        self.root = root

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        if self.root is None:  # artifact folders live in a folder of this builder's own
            self.root = tempfile.mkdtemp(prefix="dsa-tune-artifacts-")
        out = []
        for inp in build_inputs:
            try:
                out.append(BuilderResult(build_artifact(inp.mod, self.root), None))
            except Exception as e:  # noqa: BLE001 - reported to MetaSchedule as a build error
                out.append(BuilderResult(None, f"{type(e).__name__}: {e}"))
        return out


@derived_object
class DoneFuture(PyRunnerFuture):
    """A measurement that has already finished (or failed)."""

    def __init__(self, run_secs: list[float] | None, error: str | None = None):
        super().__init__()
        self.run_secs, self.error = run_secs, error

    def done(self) -> bool:
        return True

    def result(self) -> RunnerResult:
        return RunnerResult(self.run_secs, self.error)


@derived_object
class SimRunner(PyRunner):
    """Time each artifact on the simulator here, in this process."""

    def run(self, runner_inputs: list[RunnerInput]) -> list:
        out = []
        for inp in runner_inputs:
            try:
                cfg, program = read_artifact(inp.artifact_path)
                out.append(DoneFuture([cycles_to_secs(cfg, measure_bytes(cfg, program))]))
            except Exception as e:  # noqa: BLE001 - reported to MetaSchedule as a run error
                out.append(DoneFuture(None, f"{type(e).__name__}: {e}"))
        return out
