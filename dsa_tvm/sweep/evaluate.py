"""One design point on one model: compile for it, time it, and the figures a sweep tabulates.

No outputs are needed to compare designs, so nothing runs functionally: the model is
partitioned and its regions compiled exactly as
``tvm.compile(mod, target=dsa_tvm.target(cfg))`` would (``pipeline.compile_for_dsa``,
without the LLVM build of the host code), and each region the DSA takes is simulated
timing-only. Cycles, energy and DRAM bytes are the simulator's counters; what stays on
the host is counted at the compiler's own CPU estimate, so a design that offloads less
is not shown faster than it is; the area is the description's area model; every
layer's roofline bound says whether it is compute- or memory-bound on this design.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..hw.area import area_mm2
from ..hw.config import HardwareConfig
from ..pipeline import compile_for_dsa, cpu_estimate_us, region_ops
from ..report import build_report, issued_macs
from ..sim.simulator import Simulator


@dataclass
class PointResult:
    """The figures of one design point on one model (``error`` set: none could be had)."""

    model: str
    point: str
    values: dict[str, str]
    hardware: str = ""
    cycles: int = 0                # DSA cycles of the offloaded regions, end to end
    latency_us: float = 0.0        # dsa_us + host_us: the whole model on this design
    dsa_us: float = 0.0            # those cycles at the clock, plus a launch overhead each
    host_us: float = 0.0           # the compiler's CPU estimate of what the DSA does not take
    energy_uj: float = 0.0         # DSA energy (description's [energy] table; 0: not modelled)
    area_mm2: float = 0.0          # description's [area] model
    mac_utilization: float = 0.0   # MACs the array did / (cycles x peak MACs per cycle)
    dram_bytes: int = 0            # read + written by the DSA
    dsa_mac_share: float = 0.0     # of the model's MACs, the share the DSA runs
    launches: int = 0              # DSA regions offloaded
    compute_bound_layers: int = 0  # layers whose roofline bound is the MAC array
    memory_bound_layers: int = 0   # ... is DRAM bandwidth
    bound_cycles: int = 0          # the layers' roofline bounds summed
    compile_s: float = 0.0
    note: str = ""                 # what the sweep derived for this design (e.g. a wider ISA)
    cpu_reasons: str = ""          # why regions stayed on the CPU at this design
    error: str = ""
    layers: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def row(self) -> dict[str, Any]:
        """The CSV row: every scalar figure, the axis values as their own columns."""
        out = {k: v for k, v in asdict(self).items() if k not in ("values", "layers")}
        return {**self.values, **out}


def evaluate_point(mod, model: str, cfg: HardwareConfig, point: str = "",
                   values: dict[str, str] | None = None) -> PointResult:
    """Compile ``mod`` (an int8 QDQ Relax module) for ``cfg`` and time what it offloads."""
    res = PointResult(model, point, dict(values or {}), cfg.name, area_mm2=area_mm2(cfg))
    t0 = time.perf_counter()
    _, report = compile_for_dsa(mod, cfg)
    res.compile_s = time.perf_counter() - t0
    if report.error:
        res.error = report.error
        return res
    sim = Simulator(cfg)
    launches = [_Timed(d.program, sim.run(d.program, {}, timing_only=True))
                for d in report.regions if d.target == "dsa" and d.program is not None]
    run = build_report(launches, report)
    dsa = [r for r in run.rows if r.target == "DSA"]
    res.launches = len(launches)
    res.cycles = run.total_cycles
    res.dsa_us = res.cycles / cfg.mhz + res.launches * cfg.launch_overhead_us
    res.host_us = host_estimate_us(report, cfg)
    res.latency_us = res.dsa_us + res.host_us
    res.cpu_reasons = "; ".join(sorted({d.reason for d in report.regions if d.target == "cpu"}))
    res.energy_uj = sum(t.result.counters.get("energy_uj", 0.0) for t in launches)
    res.dram_bytes = sum(r.dram_read + r.dram_written for r in dsa)
    macs = sum(issued_macs(r) for r in dsa)   # a sparse layer's kept MACs: at most 100%
    res.mac_utilization = macs / (res.cycles * cfg.peak_macs_per_cycle) if res.cycles else 0.0
    res.dsa_mac_share = run.dsa_mac_share
    res.compute_bound_layers = sum(r.bound_by == "compute" and r.macs > 0 for r in dsa)
    res.memory_bound_layers = sum(r.bound_by == "memory" for r in dsa)
    res.bound_cycles = run.bound_cycles
    res.layers = [{"name": r.name, "op": r.op, "target": r.target, "cycles": r.cycles,
                   "bound": r.bound, "bound_by": r.bound_by, "macs": r.macs,
                   "dram_bytes": r.dram_read + r.dram_written} for r in run.rows]
    return res


def host_estimate_us(report, cfg: HardwareConfig) -> float:
    """The host's share, as the compiler's offload decision estimates it: each region kept
    on the CPU at its estimate, each MAC-carrying op outside regions at the host's MAC
    rate (``host.cpu_gmacs``). Ops without MACs (casts, reshapes) are not counted: a
    design that offloads less then shows the time it gives back to the host."""
    def region_us(d) -> float:
        if d.cpu_us is not None:
            return d.cpu_us
        return cpu_estimate_us(region_ops(d.region), cfg) if d.region is not None else 0.0

    regions = sum(region_us(d) for d in report.regions if d.target == "cpu")
    ops = getattr(report.partition, "cpu_ops", []) or []
    return regions + cpu_estimate_us(sum(op.macs for op in ops), cfg)


@dataclass
class _Timed:
    """What ``report.build_report`` reads of a launch: the program and its timed result."""

    program: Any
    result: Any
