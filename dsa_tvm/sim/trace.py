"""Chrome/Perfetto trace of a run: one track per engine plus the DRAM channel.

Open the JSON in https://ui.perfetto.dev or chrome://tracing. Timestamps are
microseconds at the configured clock; every slice carries its cycle numbers.

An instruction's slice runs from its start to its completion. The load and store
engines keep DMA transfers outstanding (see ``timing``), so their slices can
overlap; the JSON trace format forbids overlapping slices on one track, so a
transfer that starts while an earlier one of the same engine is still in flight
goes on an extra track of that engine ("load engine (in flight 2)", ...). The
first track of each engine carries every instruction that does not overlap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..isa.instructions import Alu, Engine, Instruction, Norm
from .timing import Schedule

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

_TRACKS = ("load", "compute", "store", "dram")
DRAM_TID = 3


def _label(ins: Instruction) -> str:
    if isinstance(ins, (Alu, Norm)):
        return f"{ins.opcode.name} {ins.op.name}"
    if hasattr(ins, "buffer"):
        return f"{ins.opcode.name} {ins.buffer.name}"
    return ins.opcode.name


def lanes(sched: Schedule) -> list[int]:
    """Track lane of every instruction: 0 is the engine's own track; an instruction that
    starts before the previous slice of every lower lane has ended takes the next lane."""
    ends: dict[int, list[int]] = {}  # engine -> end of the last slice of each lane
    out = []
    for i in range(len(sched.start)):
        e, s = int(sched.engine[i]), int(sched.start[i])
        lane_ends = ends.setdefault(e, [])
        k = next((j for j, last in enumerate(lane_ends) if last <= s), len(lane_ends))
        if k == len(lane_ends):
            lane_ends.append(0)
        lane_ends[k] = int(sched.end[i])
        out.append(k)
    return out


def lane_tid(engine: int, lane: int) -> int:
    """Thread id of an engine's lane: the engine's value for lane 0, then 4 + 3 * (lane - 1)
    + engine (after the DRAM track)."""
    return engine if lane == 0 else DRAM_TID + 1 + 3 * (lane - 1) + engine


def trace_events(instrs: list[Instruction], sched: Schedule, cfg: "HardwareConfig",
                 layer_of: list[str] | None = None) -> list[dict[str, Any]]:
    us = 1.0 / cfg.mhz
    ev: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
         "args": {"name": f"DSA {cfg.name}"}}]
    for tid, name in enumerate(_TRACKS):
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                   "args": {"name": name if name == "dram" else f"{name} engine"}})
        ev.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid,
                   "args": {"sort_index": 1000 * tid}})
    lane = lanes(sched)
    extra = sorted({(int(sched.engine[i]), k) for i, k in enumerate(lane) if k})
    for e, k in extra:
        tid = lane_tid(e, k)
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                   "args": {"name": f"{Engine(e).name.lower()} engine (in flight {k + 1})"}})
        ev.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid,
                   "args": {"sort_index": 1000 * e + k}})
    release = sched.release
    for i, ins in enumerate(instrs):
        s, e = int(sched.start[i]), int(sched.end[i])
        args: dict[str, Any] = {"index": i, "start_cycle": s, "cycles": e - s,
                                "engine": ins.engine.name.lower()}
        if release is not None and int(release[i]) != e:
            args["engine_free_cycle"] = int(release[i])
        if layer_of is not None:
            args["layer"] = layer_of[i]
        ev.append({"name": _label(ins), "cat": "instr", "ph": "X", "pid": 1,
                   "tid": lane_tid(int(sched.engine[i]), lane[i]), "ts": s * us,
                   "dur": (e - s) * us, "args": args})
    for i, s, e in sched.bus:
        ev.append({"name": _label(instrs[i]), "cat": "dram", "ph": "X", "pid": 1,
                   "tid": DRAM_TID, "ts": s * us, "dur": (e - s) * us,
                   "args": {"index": i, "cycles": e - s}})
    return ev


def write_trace(events: list[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    return path
