"""Chrome/Perfetto trace of a run: one track per engine plus the DRAM channel.

Open the JSON in https://ui.perfetto.dev or chrome://tracing. Timestamps are
microseconds at the configured clock; every slice carries its cycle numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..isa.instructions import Alu, Instruction
from .timing import Schedule

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

_TRACKS = ("load", "compute", "store", "dram")


def _label(ins: Instruction) -> str:
    if isinstance(ins, Alu):
        return f"ALU {ins.op.name}"
    if hasattr(ins, "buffer"):
        return f"{ins.opcode.name} {ins.buffer.name}"
    return ins.opcode.name


def trace_events(instrs: list[Instruction], sched: Schedule, cfg: "HardwareConfig",
                 layer_of: list[str] | None = None) -> list[dict[str, Any]]:
    us = 1.0 / cfg.mhz
    ev: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
         "args": {"name": f"DSA {cfg.name}"}}]
    for tid, name in enumerate(_TRACKS):
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                   "args": {"name": name if name == "dram" else f"{name} engine"}})
    for i, ins in enumerate(instrs):
        s, e = int(sched.start[i]), int(sched.end[i])
        args: dict[str, Any] = {"index": i, "start_cycle": s, "cycles": e - s}
        if layer_of is not None:
            args["layer"] = layer_of[i]
        ev.append({"name": _label(ins), "cat": "instr", "ph": "X", "pid": 1,
                   "tid": int(sched.engine[i]), "ts": s * us, "dur": (e - s) * us, "args": args})
    for i, s, e in sched.bus:
        ev.append({"name": _label(instrs[i]), "cat": "dram", "ph": "X", "pid": 1, "tid": 3,
                   "ts": s * us, "dur": (e - s) * us, "args": {"index": i, "cycles": e - s}})
    return ev


def write_trace(events: list[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    return path
