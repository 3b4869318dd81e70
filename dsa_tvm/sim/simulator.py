"""The simulator: one run of one instruction stream gives values and timing.

>>> sim = Simulator("default")
>>> res = sim.run(program, {"x": x})
>>> res.outputs["y"], res.cycles, res.counters
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..hw.config import HardwareConfig, load_config
from ..isa.footprint import Footprint
from ..isa.instructions import Engine, Instruction
from ..isa.program import Program
from .counters import collect_counters, format_counters
from .errors import HazardError, SimulationError
from .functional import Machine
from .limits import check_functional
from .timing import Schedule, schedule
from .trace import trace_events, write_trace
from .validate import validate_program


@dataclass
class SimResult:
    program: Program
    config: HardwareConfig
    schedule: Schedule
    counters: dict[str, float]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

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


class Simulator:
    """Functional-plus-timing simulator of one hardware config."""

    def __init__(self, config: "str | Path | HardwareConfig | None" = None):
        self.config = load_config(config)

    def load_program(self, data: bytes) -> Program:
        return Program.from_bytes(data, self.config)

    def run(self, program: Program | bytes, inputs: Mapping[str, np.ndarray] | None = None,
            timing_only: bool = False, check_hazards: bool = True) -> SimResult:
        """Run a program. ``timing_only`` skips all data work (cycles and counters only)."""
        cfg = self.config
        if isinstance(program, (bytes, bytearray, memoryview)):
            program = self.load_program(bytes(program))
        footprints = validate_program(program, cfg)
        instrs = program.instructions
        if not timing_only:
            check_functional(program, cfg)  # before the DRAM image and any plan is allocated
        machine = None if timing_only else Machine(cfg, program)
        if machine is not None:
            self._place_inputs(machine, program, inputs or {})
        hazards = _HazardChecker(footprints, instrs) if check_hazards else None

        def on_start(i: int, ins: Instruction, t0: int, t1: int) -> None:
            if hazards is not None:
                hazards.check(i, ins, t0, t1)
            if machine is not None:
                machine.execute(i, ins)

        callback = on_start if (machine is not None or hazards is not None) else None
        sched = schedule(instrs, cfg, callback)
        counters = collect_counters(instrs, sched, footprints, cfg)
        outputs = {} if machine is None else self._read_outputs(machine, program)
        return SimResult(program, cfg, sched, counters, outputs)

    def cycles(self, program: Program | bytes) -> int:
        """Cycles of ``program`` alone on the timing model: validated and scheduled, with no
        data work, hazard checks or counters (what tuning measures, many times over)."""
        if isinstance(program, (bytes, bytearray, memoryview)):
            program = self.load_program(bytes(program))
        validate_program(program, self.config)
        return int(schedule(program.instructions, self.config, None).cycles)

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
            if arr.shape != r.shape or arr.dtype != np.dtype(r.dtype):
                raise SimulationError(None, f"input '{name}' must be {r.dtype}{list(r.shape)}, "
                                            f"got {arr.dtype}{list(arr.shape)}")
            machine.dram[r.offset:r.offset + r.nbytes] = np.ascontiguousarray(arr).view(
                np.uint8).reshape(-1)

    @staticmethod
    def _read_outputs(machine: Machine, program: Program) -> dict[str, np.ndarray]:
        out = {}
        for r in program.regions_of("output"):
            raw = machine.dram[r.offset:r.offset + r.nbytes]
            out[r.name] = raw.view(np.dtype(r.dtype)).reshape(r.shape).copy()
        return out
