"""A tuning task: one layer shape on one hardware description.

The task's MetaSchedule workload is the layer's unscheduled TIR compute with the
task written into the PrimFunc's attributes (``dsa.task``: the shape,
``dsa.hardware``: the hardware description). So the workload is self-describing:
the builder, the search's postprocessor and the feature extractor all recover
the task from the module they are handed, and the JSON database, which keys
records by the workload's structural hash, keeps tasks of different hardware
apart even when their TIR is the same.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..gc_pause import paused_gc
from ..hw.config import HardwareConfig, config_from_dict
from ..isa.builder import ProgramBuilder
from ..isa.program import Program
from ..isa.sync import insert_dependencies
from ..sim.simulator import Simulator

ATTR_TASK = "dsa.task"
ATTR_HW = "dsa.hardware"


@dataclass(frozen=True)
class Task:
    """One tunable layer shape (``tir_schedules.kinds.space.perf_shape`` form) on ``cfg``."""

    cfg: HardwareConfig
    shape: object

    @property
    def name(self) -> str:
        from tir_schedules.kinds import kind_of

        return f"{kind_of(self.shape).build.__name__}_{_short(self.shape)}"

    def workload(self):
        """The unscheduled compute as an IRModule carrying the task (the database key)."""
        import tvm

        from tir_schedules.kinds import kind_of

        func = kind_of(self.shape).build(self.shape)
        func = func.with_attr(ATTR_TASK, shape_to_json(self.shape))
        func = func.with_attr(ATTR_HW, json.dumps(self.cfg.as_dict(), sort_keys=True))
        return tvm.IRModule({"main": func})

    def default_knobs(self):
        from tir_schedules.kinds import kind_of

        return kind_of(self.shape).default(self.cfg, self.shape)

    def candidates(self) -> list:
        from tir_schedules.kinds import kind_of

        return kind_of(self.shape).candidates(self.cfg, self.shape)

    def program(self, knobs) -> Program:
        """The DSA program of this layer alone with ``knobs`` (constants zero: for timing)."""
        return task_program(self.cfg, self.shape, knobs)


def _short(shape) -> str:
    """A readable task name: the geometry fields (padding and dilation when not the
    usual ones), e.g. ``n1_h56_w56_icb4_ocb4_kh3_kw3_strides1x1_pad1``."""
    keys = ("kind", "n", "h", "w", "hw", "p", "icb", "ocb", "cb", "kh", "kw", "strides")
    parts = []
    for k in keys:
        v = getattr(shape, k, None)
        if v is None:
            continue
        parts.append(f"{k}{'x'.join(map(str, v)) if isinstance(v, tuple) else v}")
    pad = getattr(shape, "padding", None)
    if pad and any(pad):
        parts.append(f"pad{pad[0]}" if len(set(pad)) == 1 else f"pad{'x'.join(map(str, pad))}")
    dil = getattr(shape, "dilation", None)
    if dil and dil != (1, 1):
        parts.append(f"dil{'x'.join(map(str, dil))}")
    if getattr(shape, "depthwise", False):
        parts.append("dw")
    return "_".join(parts)


# ----------------------------------------------------------------------------- (de)serialize
def shape_to_json(shape) -> str:
    return json.dumps({"type": type(shape).__name__, "fields": dataclasses.asdict(shape)},
                      sort_keys=True)


def shape_from_json(text: str):
    from tir_schedules.kinds import shape_types

    data = json.loads(text)
    by_name = {t.__name__: t for t in shape_types()}
    if data.get("type") not in by_name:
        raise ValueError(f"unknown task shape type {data.get('type')!r}")
    cls = by_name[data["type"]]
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data["fields"].items()}
    return cls(**fields)


@lru_cache(maxsize=256)
def task_from_json(task_json: str, hw_json: str) -> Task:
    """The task of a workload's two JSON attributes (cached: every candidate carries them)."""
    return Task(config_from_dict(json.loads(hw_json), "<tuning task>"), shape_from_json(task_json))


def task_json_of(mod) -> tuple[str, str]:
    """The task and hardware JSON texts a workload (or any schedule of it) carries."""
    func = mod["main"] if hasattr(mod, "functions_items") else mod
    attrs = func.attrs
    if attrs is None or ATTR_TASK not in attrs or ATTR_HW not in attrs:
        raise ValueError("this module is not a DSA tuning workload (no dsa.task / dsa.hardware "
                         "attributes): make it with dsa_tvm.tuning.Task(...).workload()")
    return str(attrs[ATTR_TASK]), str(attrs[ATTR_HW])


def task_of(mod) -> Task:
    """The task a workload (or any schedule of it) was made from."""
    return task_from_json(*task_json_of(mod))


# ----------------------------------------------------------------------------- lowering
def task_program(cfg: HardwareConfig, shape, knobs) -> Program:
    """Schedule ``shape`` with ``knobs``, walk it into instructions, derive the tokens.
    The same steps as ``lowering.region.compile_region`` for a one-layer region."""
    from tir_schedules.kinds import kind_of
    from tir_schedules.kinds.space import check_knobs
    from tir_schedules.lower import lower_for_walker

    problem = check_knobs(cfg, shape, knobs)
    if problem:
        raise ValueError(f"{knobs} is not a schedule of this task on '{cfg.name}': {problem}")
    kind = kind_of(shape)
    func = lower_for_walker(kind.schedule(kind.build(shape), cfg, shape, knobs))
    with paused_gc():
        return _walk_program(cfg, func)


def _walk_program(cfg: HardwareConfig, func) -> Program:
    """A scheduled one-layer PrimFunc as a program with its tokens (constants zero)."""
    from ..codegen.walker import TirWalker
    b = ProgramBuilder(cfg, "tune")
    regions = {}
    for p in func.params:
        name, dims, dtype = str(p.name), [int(d) for d in p.shape], str(p.dtype)
        if name in ("w", "params"):
            regions[name] = b.region(name, "const", dims, dtype, data=np.zeros(dims, dtype))
        elif name == "y":
            regions[name] = b.region(name, "output", dims, dtype)
        else:
            regions[name] = b.region(name, "input", dims, dtype)
    TirWalker(cfg, b, regions).run(func)
    b.finish()
    b.instructions = insert_dependencies(b.instructions, cfg)
    return b.build()


def simulate_cycles(cfg: HardwareConfig, prog: Program) -> int:
    """Cycles of ``prog`` on the simulator's timing model (no data work)."""
    with paused_gc():
        return Simulator(cfg).cycles(prog)


def measure_knobs(task: Task, knobs) -> int:
    """Simulated cycles of ``task`` scheduled with ``knobs`` (lowered and timed here)."""
    return simulate_cycles(task.cfg, task.program(knobs))
