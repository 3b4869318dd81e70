"""The simulator: one run of one instruction stream gives values and timing.

>>> sim = Simulator("default")
>>> res = sim.run(program, {"x": x})
>>> res.outputs["y"], res.cycles, res.counters
>>> many = sim.run_batch(program, {"x": xs})    # xs: (N, *shape), one pass for N inputs
>>> many.outputs["y"][k]                          # bit for bit run(program, {"x": xs[k]})

Timing does not depend on the data: a program's schedule, counters and hazard check
are worked out on its first run and reused by every later run of the same program
object on this simulator (the functional model then replays the instructions in the
order they started). ``fresh_timing=True`` asks for them anew.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..hw.config import HardwareConfig, load_config
from ..isa.footprint import Footprint
from ..isa.instructions import Engine, Instruction
from ..isa.program import Program
from .cim_arrays import ProgrammedArrays
from .cim_mapping import TIME_SHARED, CimMap, cim_counters, cost_overrides, map_program
from .counters import collect_counters, energy_split, format_counters
from .errors import HazardError, SimulationError
from .functional import Machine
from .limits import check_functional
from .replay import ReplayPlan, build_plan
from .timing import Schedule, schedule
from .trace import trace_events, write_trace
from .validate import validate_program


@dataclass
class SimResult:
    """Values and timing of a run. For a batch (``batch`` > 1) every output has a
    leading axis of that length; the timing is of one input's run of the program (the
    same for every input: timing is data independent)."""

    program: Program
    config: HardwareConfig
    schedule: Schedule
    counters: dict[str, float]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    batch: int = 1
    timing_reused: bool = False   # the schedule came from an earlier run of the program
    cim: CimMap | None = None     # a CIM part: which GEMMs ran on crossbars, which loads stayed

    @property
    def cycles(self) -> int:
        return self.schedule.cycles

    def report(self) -> str:
        return format_counters(self.counters, f"DSA run of '{self.program.name}' on "
                                              f"'{self.config.name}'")

    def trace(self) -> list[dict[str, Any]]:
        layers = self.program.meta.get("layers")
        layer_of = None
        if layers:
            layer_of = [""] * len(self.program.instructions)
            for ly in layers:
                for i in range(ly["first"], ly["last"] + 1):
                    layer_of[i] = ly["name"]
        return trace_events(self.program.instructions, self.schedule, self.config, layer_of)

    def write_trace(self, path: str | Path) -> Path:
        return write_trace(self.trace(), path)


class _HazardChecker:
    """Flags scratchpad rows touched by two engines at overlapping times, one of them writing."""

    def __init__(self, footprints: list[Footprint], instrs: list[Instruction]):
        self.fps = footprints
        self.instrs = instrs
        self.active: list[tuple[int, int, Engine]] = []  # (end, index, engine)

    def check(self, i: int, ins: Instruction, t0: int, t1: int) -> None:
        self.active = [a for a in self.active if a[0] > t0]
        mine = self.fps[i]
        for _end, j, eng in self.active:
            if eng == ins.engine:
                continue
            other = self.fps[j]
            for w_fp, x_fp, writer in ((mine, other, i), (other, mine, j)):
                for sram, lo, hi in w_fp.writes:
                    for sram2, lo2, hi2 in x_fp.reads + x_fp.writes:
                        if sram == sram2 and lo <= hi2 and lo2 <= hi:
                            reader = j if writer == i else i
                            raise HazardError(i, (
                                f"{self.instrs[writer].opcode.name} #{writer} writes "
                                f"{sram.upper()} rows {lo}..{hi} while "
                                f"{self.instrs[reader].opcode.name} #{reader} on another engine "
                                f"uses rows {lo2}..{hi2} at the same time; add a dependency token"))
        self.active.append((t1, i, ins.engine))


@dataclass
class _Timing:
    """What a run of a program takes, whatever its data: kept per program object."""

    program: Program
    schedule: Schedule
    counters: dict[str, float]
    order: list[int]          # instruction indices in the order they started
    hazards_checked: bool
    contents: int             # _contents(program) when timed: an edited program is re-timed
    replay: dict[tuple, ReplayPlan] = field(default_factory=dict)  # per GEMM path, analog set
    latest: ReplayPlan | None = None


#: programs whose timing a simulator keeps (the least recently run go first)
TIMING_CACHE_ENTRIES = 64
#: programs whose crossbars a CIM simulator keeps programmed (their conductances drawn)
ARRAYS_CACHE_ENTRIES = 16


class Simulator:
    """Functional-plus-timing simulator of one hardware config."""

    def __init__(self, config: "str | Path | HardwareConfig | None" = None):
        self.config = load_config(config)
        self._timings: OrderedDict[int, _Timing] = OrderedDict()
        self._arrays: OrderedDict[int, tuple[Program, tuple, ProgrammedArrays]] = OrderedDict()
        self._lock = threading.Lock()
        #: later runs of a program replay it with its :mod:`replay` plan (False: step by
        #: step, as the first run does; the values are the same either way)
        self.replay = True

    def load_program(self, data: bytes) -> Program:
        return Program.from_bytes(data, self.config)

    def run(self, program: Program | bytes, inputs: Mapping[str, np.ndarray] | None = None,
            timing_only: bool = False, check_hazards: bool = True,
            fresh_timing: bool = False) -> SimResult:
        """Run a program. ``timing_only`` skips all data work (cycles and counters only)."""
        if timing_only:
            return self._timed(program, None, check_hazards)
        res = self.run_batch(program, {k: np.asarray(v)[None] for k, v in (inputs or {}).items()},
                             check_hazards=check_hazards, fresh_timing=fresh_timing,
                             _batch=1)
        res.outputs = {k: v[0] for k, v in res.outputs.items()}
        return res

    def run_batch(self, program: Program | bytes, inputs: Mapping[str, np.ndarray],
                  check_hazards: bool = True, fresh_timing: bool = False,
                  _batch: int | None = None) -> SimResult:
        """Run a program on a batch of inputs in one pass: ``inputs[name]`` is
        (N, *shape) for an input of ``shape``; every output gets the same leading N.
        Bit for bit N runs of :meth:`run`, in one walk over the instructions."""
        if isinstance(program, (bytes, bytearray, memoryview)):
            program = self.load_program(bytes(program))
        with one_blas_thread():
            return self._run_batch(program, inputs, check_hazards, fresh_timing, _batch)

    def _run_batch(self, program: Program, inputs: Mapping[str, np.ndarray],
                   check_hazards: bool, fresh_timing: bool, _batch: int | None) -> SimResult:
        cfg = self.config
        timing = None if fresh_timing else self._cached(program, check_hazards)
        footprints = validate_program(program, cfg) if timing is None else None
        batch = _batch if _batch is not None else _batch_size(program, inputs)
        check_functional(program, cfg, batch)  # before any DRAM image is allocated
        machine = Machine(cfg, program, batch, self.arrays(program) if cfg.is_cim else None)
        self._place_inputs(machine, program, inputs)
        if timing is None:
            res = self._timed(program, machine, check_hazards, footprints)
        else:
            instrs = program.instructions
            if self.replay:
                machine.replay(instrs, timing.order, self._replay_plan(program, timing, machine))
            else:
                for i in timing.order:
                    machine.execute(i, instrs[i])
            res = SimResult(program, cfg, timing.schedule, dict(timing.counters),
                            timing_reused=True, cim=machine.arrays and machine.arrays.cmap)
        res.outputs = self._read_outputs(machine, program)
        res.batch = batch
        return res

    def arrays(self, program: Program) -> ProgrammedArrays:
        """The crossbars of this CIM part programmed with ``program``'s weights (mapped and
        drawn once, kept for later runs)."""
        with self._lock:
            hit = self._arrays.get(id(program))
            key = (_contents(program), program.meta.get(TIME_SHARED))
            if hit is not None and hit[0] is program and hit[1] == key:
                self._arrays.move_to_end(id(program))
                return hit[2]
        arrays = ProgrammedArrays(program, self.config, map_program(program, self.config))
        with self._lock:
            self._arrays[id(program)] = (program, key, arrays)
            while len(self._arrays) > ARRAYS_CACHE_ENTRIES:
                self._arrays.popitem(last=False)
        return arrays

    def replay_plan(self, program: Program) -> ReplayPlan | None:
        """The plan the latest replay of ``program`` used (None before its second run)."""
        t = self._timings.get(id(program))
        return t.latest if t is not None and t.program is program else None

    def _replay_plan(self, program: Program, timing: _Timing, machine: Machine) -> ReplayPlan:
        """The program's replay plan for this machine's GEMM path and crossbars (built on
        the first replay, kept with the timing)."""
        analog = frozenset(machine.arrays.analog) if machine.arrays is not None else frozenset()
        key = (machine.int8, analog)
        with self._lock:
            plan = timing.replay.get(key)
            if plan is None:
                plan = build_plan(program, self.config, timing.order, analog, machine.int8)
                timing.replay[key] = plan
            timing.latest = plan
        return plan

    def _cached(self, program: Program, check_hazards: bool) -> _Timing | None:
        with self._lock:  # launches of one program may run in several threads
            t = self._timings.get(id(program))
            if (t is None or t.program is not program
                    or (check_hazards and not t.hazards_checked)
                    or t.contents != _contents(program)):
                return None
            self._timings.move_to_end(id(program))
            return t

    def _timed(self, program: Program | bytes, machine: Machine | None, check_hazards: bool,
               footprints: list | None = None) -> SimResult:
        """Validate (unless ``footprints`` says it was) and schedule ``program``, running
        ``machine`` on it as instructions start; keep its timing for later runs."""
        cfg = self.config
        if isinstance(program, (bytes, bytearray, memoryview)):
            program = self.load_program(bytes(program))
        if footprints is None:
            footprints = validate_program(program, cfg)
        instrs = program.instructions
        hazards = _HazardChecker(footprints, instrs) if check_hazards else None
        order: list[int] = []

        def on_start(i: int, ins: Instruction, t0: int, t1: int) -> None:
            if hazards is not None:
                hazards.check(i, ins, t0, t1)
            if machine is not None:
                order.append(i)
                machine.execute(i, ins)

        callback = on_start if (machine is not None or hazards is not None) else None
        if cfg.is_cim:
            cmap = self.arrays(program).cmap
            sched = schedule(instrs, cfg, callback, cost_overrides(cmap, program, cfg))
            counters = collect_counters(instrs, sched, footprints, cfg, cmap.resident_loads,
                                        frozenset(cmap.analog))
            counters.update(cim_counters(cmap, cfg))
            if cfg.energy_modelled:
                counters["energy_uj"] = sum(energy_split(counters, cfg).values())
        else:
            sched = schedule(instrs, cfg, callback)
            counters = collect_counters(instrs, sched, footprints, cfg)
        if machine is not None:
            timing = _Timing(program, sched, counters, order, check_hazards, _contents(program))
            with self._lock:
                self._timings[id(program)] = timing
                self._timings.move_to_end(id(program))
                while len(self._timings) > TIMING_CACHE_ENTRIES:
                    self._timings.popitem(last=False)
        return SimResult(program, cfg, sched, counters,
                         cim=self.arrays(program).cmap if cfg.is_cim else None)

    def cycles(self, program: Program | bytes) -> int:
        """Cycles of ``program`` alone on the timing model: validated and scheduled, with no
        data work, hazard checks or counters (what tuning measures, many times over)."""
        if isinstance(program, (bytes, bytearray, memoryview)):
            program = self.load_program(bytes(program))
        validate_program(program, self.config)
        costs = (cost_overrides(self.arrays(program).cmap, program, self.config)
                 if self.config.is_cim else None)
        return int(schedule(program.instructions, self.config, None, costs).cycles)

    @staticmethod
    def _place_inputs(machine: Machine, program: Program, inputs: Mapping[str, np.ndarray]):
        regions = {r.name: r for r in program.regions_of("input")}
        unknown = set(inputs) - set(regions)
        if unknown:
            raise SimulationError(None, f"unknown program inputs {sorted(unknown)}; the program "
                                        f"takes {sorted(regions)}")
        for name, r in regions.items():
            if name not in inputs:
                raise SimulationError(None, f"missing program input '{name}' "
                                            f"({r.dtype}{list(r.shape)})")
            arr = np.asarray(inputs[name])
            want = (machine.batch, *r.shape)
            if arr.shape != want or arr.dtype != np.dtype(r.dtype):
                what = f"{r.dtype}{list(r.shape)}" if machine.batch == 1 else \
                    f"{r.dtype}{list(want)} (a batch of {machine.batch})"
                got = arr.shape[1:] if machine.batch == 1 and arr.ndim else arr.shape
                raise SimulationError(None, f"input '{name}' must be {what}, got "
                                            f"{arr.dtype}{list(got)}")
            machine.dram[:, r.offset:r.offset + r.nbytes] = np.ascontiguousarray(arr).view(
                np.uint8).reshape(machine.batch, -1)

    @staticmethod
    def _read_outputs(machine: Machine, program: Program) -> dict[str, np.ndarray]:
        out = {}
        for r in program.regions_of("output"):
            raw = np.ascontiguousarray(machine.dram[:, r.offset:r.offset + r.nbytes])
            out[r.name] = raw.view(np.dtype(r.dtype)).reshape(machine.batch, *r.shape)
        return out


_BLAS: dict = {}  # the threadpoolctl controller, and the module count it was made at


@contextmanager
def one_blas_thread():
    """Run the functional model's numpy work on one BLAS thread: its products are many
    small tiles that threads do not speed up, and OpenBLAS's spinning threads stall it
    ten-fold when other work shares the cores (use processes for more cores).

    Only in the main thread: the limit is process-wide, and OpenBLAS does not take it
    back when another thread restores it, so runs in the caller's own threads (which
    has chosen threads) leave BLAS as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _blas_controller().limit(limits=1, user_api="blas"):
        yield


def _blas_controller():
    """threadpoolctl's view of the loaded BLAS libraries, made again after an import (an
    import may load another BLAS, e.g. scipy's own OpenBLAS beside numpy's, which a
    controller made before it would leave on all its threads); a scan takes a millisecond."""
    if _BLAS.get("modules") != len(sys.modules):
        from threadpoolctl import ThreadpoolController

        _BLAS.update(controller=ThreadpoolController(), modules=len(sys.modules))
    return _BLAS["controller"]


def _contents(program: Program) -> int:
    """Identity of a program's instructions and regions (they are immutable objects, so
    a program edited in place since it was timed hashes differently)."""
    return hash((tuple(map(id, program.instructions)), tuple(map(id, program.regions)),
                 program.dram_size))


def _batch_size(program: Program, inputs: Mapping[str, np.ndarray]) -> int:
    """N of a batch of inputs: every input (N, *its shape), the same N."""
    sizes = set()
    for r in program.regions_of("input"):
        if r.name in inputs:
            arr = np.asarray(inputs[r.name])
            if arr.ndim != len(r.shape) + 1 or tuple(arr.shape[1:]) != tuple(r.shape):
                raise SimulationError(None, f"batched input '{r.name}' must be (N, "
                                            f"{', '.join(map(str, r.shape))}), got "
                                            f"{list(arr.shape)}: stack the inputs on a new "
                                            f"first axis")
            sizes.add(int(arr.shape[0]))
    if len(sizes) > 1:
        raise SimulationError(None, f"batched inputs disagree on N: {sorted(sizes)}")
    n = sizes.pop() if sizes else 1
    if n < 1:
        raise SimulationError(None, "an empty batch (N = 0): give at least one input")
    return n
