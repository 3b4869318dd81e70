"""The DSA compile pipeline: partition, compile regions, decide DSA vs CPU, offload.

``tvm.compile(mod, target="dsa")`` reaches :func:`offload_for_dsa` through the
wrapped ``"default"`` Relax pipeline (see :mod:`dsa_tvm.target`). Every region
the partitioner forms is compiled to a DSA program; a region goes to the DSA
only when it compiles and its simulated time beats the CPU estimate (both
numbers are kept in the compile report), otherwise it is inlined back and
LLVM builds it. Nothing unsupported ever breaks a compile.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tvm

from .hw.config import HardwareConfig
from .layers.ir import layer_inputs
from .report import build_report
from .sim.simulator import Simulator
from .target import config_of, is_dsa


def _default_schedules() -> None:
    """No tuning database in scope: every layer gets its default schedule."""
    return None


#: Returns the knob chooser of the tuning database in scope, or None. ``dsa_tvm.setup``
#: installs the tuner's (:func:`use_tuning`), so the compiler does not import the tuner.
current_chooser: Callable[[], Any] = _default_schedules


def use_tuning(chooser: Callable[[], Any]) -> None:
    """Ask ``chooser()`` for the knob chooser of every compile from now on."""
    global current_chooser
    current_chooser = chooser


@dataclass
class RegionDecision:
    name: str
    layers: list[str]
    macs: int
    target: str                  # "dsa" | "cpu"
    reason: str
    dsa_cycles: int | None = None
    dsa_us: float | None = None
    cpu_us: float | None = None
    compile_s: float = 0.0
    region: Any = field(default=None, repr=False)   # the codegen.layers.Region
    schedules: str = ""          # with a tuning database: tuned or default, and why


@dataclass
class CompileReport:
    """What the compiler decided, op by op and region by region."""

    hardware: str
    mhz: float = 1.0
    partition: Any = None                        # relay_passes.PartitionReport
    regions: list[RegionDecision] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""   # an internal error that kept the whole program on the CPU


    def to_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "seconds": self.seconds, "error": self.error,
                "regions": [{k: v for k, v in r.__dict__.items() if k != "region"}
                            for r in self.regions],
                "partition": self.partition.to_dict() if self.partition is not None else None}

    def __str__(self) -> str:
        lines = [f"DSA compile for '{self.hardware}' in {self.seconds:.2f} s"]
        if self.error:
            lines.append(f"  everything on the CPU: {self.error}")
        for r in self.regions:
            nums = ""
            if r.dsa_us is not None and r.cpu_us is not None:
                nums = (f"  DSA {r.dsa_us:.1f} us ({r.dsa_cycles:,} cycles + launch) vs CPU "
                        f"~{r.cpu_us:.1f} us")
            lines.append(f"  {r.name}: {r.target.upper()} ({len(r.layers)} layers, "
                         f"{r.macs:,} MACs){nums} - {r.reason}")
            if r.schedules:
                lines.append(f"    {r.schedules}")
        if self.partition is not None:
            lines.append(str(self.partition))
        return "\n".join(lines)


#: the most recent compile's full report (its regions keep their layers, weights included,
#: for checks against a reference); one only, replaced by the next compile
_last_report: list[CompileReport] = []
#: what a run report needs of each compile (its CPU layers, no weights), by compile id
_records: OrderedDict[str, Any] = OrderedDict()
_records_lock = threading.Lock()
#: compiles whose CPU layers run reports can still show (the oldest are forgotten)
COMPILE_RECORDS = 256


def last_compile_report() -> CompileReport | None:
    return _last_report[-1] if _last_report else None


def compile_record(compile_id: str | None):
    """The CPU side of compile ``compile_id`` as a run report without launches (hardware,
    clock, the layers that stayed on the CPU and why), or None when this process did not
    compile it (a module loaded from a file) or has forgotten it."""
    with _records_lock:
        return _records.get(compile_id) if compile_id is not None else None


def _remember(compile_id: str, report: CompileReport) -> None:
    """Keep ``report`` as the last one, and its CPU rows (no weights) under its id."""

    record = build_report([], report)
    with _records_lock:
        _records[compile_id] = record
        while len(_records) > COMPILE_RECORDS:
            _records.popitem(last=False)
        _last_report[:] = [report]


def region_ops(region) -> int:
    """Arithmetic of a region in MAC equivalents: MACs for the array layers, one operation
    per input element read for the vector layers (window taps, both addends, ...)."""
    import numpy as np


    total = 0
    for ly in region.layers:
        if ly.macs:
            total += ly.macs
            continue
        out = int(np.prod(ly.output.shape))
        kernel = getattr(ly, "kernel", None)
        if kernel is not None:
            total += out * kernel[0] * kernel[1]
        else:
            total += max(out, sum(int(np.prod(t.shape)) for t in layer_inputs(ly)))
    return total


def cpu_estimate_us(ops: int, cfg: HardwareConfig) -> float:
    """What the host would take for ``ops`` MAC-equivalents at its int8 rate."""
    return ops / (cfg.cpu_gmacs * 1e3)


def internal_error(stage: str, e: BaseException) -> str:
    """The report line (and a warning) for a bug of ours that a compile survived on the CPU."""
    import traceback
    import warnings

    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" at {where.filename.rsplit('/', 1)[-1]}:{where.lineno}" if where else ""
    msg = (f"internal error while {stage} (a dsa-tvm bug; the CPU build runs it): "
           f"{type(e).__name__}: {e}{at}")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return msg


def offload_for_dsa(mod, cfg: HardwareConfig):
    """Partition ``mod`` for ``cfg``, compile each region, offload the ones worth it."""
    # here, not at the top: relay_passes and tir_schedules (under lowering) import dsa_tvm,
    # whose __init__ imports this module (tests/test_import_order.py: load-time cycles)
    from relay_passes import OffloadResult, offload_regions, partition_for_dsa

    from .lowering.region import UnsupportedLayer


    t0 = time.perf_counter()
    report = CompileReport(cfg.name, cfg.mhz)
    compile_id = uuid.uuid4().hex  # in every program: a launch's report finds its compile
    try:
        part, report.partition = partition_for_dsa(mod, cfg)
    except Exception as e:  # noqa: BLE001 - a bug in our partitioner: all on the CPU, said loudly
        report.error = internal_error("partitioning", e)
        report.seconds = time.perf_counter() - t0
        _remember(compile_id, report)
        return mod
    sim = Simulator(cfg)
    choose_knobs = current_chooser()  # tuned schedules when a MetaSchedule database is in scope

    def compile_one(region) -> bytes | None:
        d = RegionDecision(region.name, [ly.name for ly in region.layers], region.macs, "cpu", "",
                           region=region)
        report.regions.append(d)
        t1 = time.perf_counter()
        try:
            prog, d.dsa_cycles, d.schedules = _region_program(region, cfg, choose_knobs, sim)
        except UnsupportedLayer as e:
            d.reason = f"codegen: {e}"
            return None
        except Exception as e:  # noqa: BLE001 - a bug in our lowering: CPU, said loudly
            d.reason = internal_error("lowering this region", e)
            return None
        finally:
            d.compile_s = time.perf_counter() - t1
        d.dsa_us = d.dsa_cycles / cfg.mhz + cfg.launch_overhead_us
        d.cpu_us = cpu_estimate_us(region_ops(region), cfg)
        if d.dsa_us > d.cpu_us:
            d.reason = "the CPU is estimated faster"
            return None
        d.target, d.reason = "dsa", "all layers supported, faster than the CPU"
        prog.meta["compile"] = compile_id
        return prog.to_bytes(cfg)

    result = OffloadResult()
    out = offload_regions(part, compile_one, result=result)
    for d in report.regions:
        if d.target == "cpu" and not d.reason:
            d.reason = result.kept.get(d.name, "kept on the CPU")
    report.seconds = time.perf_counter() - t0
    _remember(compile_id, report)
    return out


def _region_program(region, cfg: HardwareConfig, choose_knobs, sim) -> tuple[Any, int, str]:
    """The region's program, its cycles, and which schedules it took.

    Tuning times each layer alone; in a region the layers' transfers and compute
    overlap, so tuned layers can make the region slower than the default schedules
    would (one layer's larger tiles delay the next one's start). When any layer took
    a tuned schedule, the region is also compiled with the default ones and the faster
    program is kept: a database never makes a region slower."""
    from .lowering.region import compile_region

    hits = choose_knobs.hits if choose_knobs is not None else 0
    prog = compile_region(region, cfg, choose_knobs).program
    cycles = sim.cycles(prog)
    tuned = choose_knobs.hits - hits if choose_knobs is not None else 0
    if not tuned:
        return prog, cycles, ""
    default = compile_region(region, cfg).program
    default_cycles = sim.cycles(default)
    if default_cycles < cycles:
        return default, default_cycles, (
            f"default schedules: with the tuned ones for {tuned} layer(s) the region takes "
            f"{cycles:,} cycles, with the defaults {default_cycles:,}")
    return prog, cycles, (f"tuned schedules for {tuned} layer(s): {cycles:,} cycles "
                          f"(defaults: {default_cycles:,})")


def dsa_aware_default_pipeline(orig):
    """Wrap a ``PIPELINE_MAP`` entry: offload first when the target is a DSA target."""

    def factory(**kwargs):
        base = orig(**kwargs)

        @tvm.transform.module_pass(opt_level=0, name="DSAOffloadThenDefault")
        def _pipeline(mod, _ctx):
            tgt = tvm.target.Target.current(allow_none=True)
            if is_dsa(tgt):
                mod = offload_for_dsa(mod, config_of(tgt))
            return base(mod)

        return _pipeline

    factory.__wrapped__ = orig
    return factory
