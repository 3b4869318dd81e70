"""The DSA compile pipeline, top to bottom in :func:`compile_for_dsa`.

``tvm.compile(mod, target="dsa")`` reaches :func:`offload_for_dsa` through the
wrapped ``"default"`` Relax pipeline (see :mod:`dsa_tvm.target`). Every region
the partitioner forms is compiled to a DSA program; a region goes to the DSA
only when it compiles and its simulated time beats the CPU estimate (both
numbers are kept in the compile report; ``options(offload="all")`` drops the
second condition), otherwise it is inlined back and LLVM builds it. Nothing unsupported ever breaks a compile.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import tvm

from .hw.config import HardwareConfig
from .report import build_report
from .sim.simulator import Simulator
from .target import config_of, is_dsa

if TYPE_CHECKING:
    from relay_passes.partition import RegionRead


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
    region: Any = field(default=None, repr=False)   # the layers.ir.Region
    program: Any = field(default=None, repr=False)  # its compiled isa Program (either target)
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
    compile_id: str = ""  # in every program's meta and the module's dsa_compile_id function

    def to_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "compile_id": self.compile_id,
                "seconds": self.seconds, "error": self.error,
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


#: compiles whose reports (and CPU layers for run reports) stay known; the oldest go first
COMPILE_RECORDS = 256


class CompileMemory:
    """The compile reports this process remembers, by compile id, bounded.

    The newest compile's report is kept in full (its regions keep their layers, weights
    included, for checks against a reference, and their programs); older ones lose the
    layers and programs (``RegionDecision.region`` and ``.program`` are None) and keep
    their decisions, partition report and CPU rows, a few KB each, so memory does not grow
    with the number of compiles."""

    def __init__(self, limit: int = COMPILE_RECORDS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[CompileReport, Any]] = OrderedDict()
        self._newest: CompileReport | None = None

    def add(self, report: CompileReport) -> None:

        record = build_report([], report)  # the CPU rows, taken while the layers are here
        light = replace(report, regions=[replace(d, region=None, program=None)
                                         for d in report.regions])
        with self._lock:
            self._entries[report.compile_id] = (light, record)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)
            self._newest = report

    def newest(self) -> CompileReport | None:
        return self._newest

    def report(self, compile_id: str) -> CompileReport | None:
        """The report of ``compile_id`` (the newest in full), None when unknown."""
        with self._lock:
            newest = self._newest
            if newest is not None and newest.compile_id == compile_id:
                return newest
            hit = self._entries.get(compile_id)
        return hit[0] if hit is not None else None

    def record(self, compile_id: str | None):
        """The CPU side of ``compile_id`` as a run report without launches, or None."""
        with self._lock:
            hit = self._entries.get(compile_id) if compile_id is not None else None
        return hit[1] if hit is not None else None

    def __len__(self) -> int:
        return len(self._entries)


_compiles = CompileMemory()


def last_compile_report() -> CompileReport | None:
    return _compiles.newest()


def compile_report_of(compile_id: str) -> CompileReport | None:
    """The report of compile ``compile_id``, or None when this process did not compile it
    (a module loaded from a file) or has forgotten it (older than COMPILE_RECORDS)."""
    return _compiles.report(compile_id)


def compile_record(compile_id: str | None):
    """The CPU side of compile ``compile_id`` as a run report without launches (hardware,
    clock, the layers that stayed on the CPU and why), or None when this process did not
    compile it (a module loaded from a file) or has forgotten it."""
    return _compiles.record(compile_id)


def region_ops(region) -> int:
    """Arithmetic of a region in MAC equivalents: MACs for the array layers, one operation
    per input element read for the vector layers (window taps, both addends, ...)."""
    from tir_schedules.kinds import layer_ops

    return sum(layer_ops(ly) for ly in region.layers)


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


def compile_for_dsa(mod: tvm.IRModule, cfg: HardwareConfig
                    ) -> tuple[tvm.IRModule, CompileReport]:
    """Every stage of a DSA compile, in order: ``(offloaded module, CompileReport)``.

    Each stage runs once per match and per region: the verdict of a (pattern, quantize)
    pair is shared by the partition report and the fusion checks (``MatchMemo``), each
    region function is read into layers once, and each region is compiled once (twice
    with a tuning database, see :func:`_region_program`)."""
    # here, not at the top: relay_passes and tir_schedules (under lowering) import dsa_tvm,
    # whose __init__ imports this module (tests/test_import_order.py: load-time cycles)
    from relay_passes import offload_regions
    from relay_passes import partition as dsa_partition
    from relay_passes.canonicalize import prepare
    from relay_passes.match_memo import MatchMemo

    t0 = time.perf_counter()
    compile_id = uuid.uuid4().hex  # in every program: a launch's report finds its compile
    report = CompileReport(cfg.name, cfg.mhz, compile_id=compile_id)
    try:
        prepared = prepare(mod)                                         # 1. canonicalize
        memo = MatchMemo(cfg)
        reasons = dsa_partition.pattern_decisions(prepared, memo)       # 2. match: verdicts
        notes: list[str] = []
        part = dsa_partition.fuse_and_merge(prepared, memo, notes)      # 3. fuse + merge
        regions = dsa_partition.read_regions(part, cfg)                 # 4. regions -> layers
        report.partition = dsa_partition.partition_report(cfg, prepared, part, regions,
                                                          reasons, notes)
    except Exception as e:  # noqa: BLE001 - a bug in our partitioner: all on the CPU, said loudly
        report.error = internal_error("partitioning", e)
        return _finish(report, mod, t0)
    launch = decide_regions(regions, cfg, report)                       # 5. DSA or CPU
    out = offload_regions(part, launch)                                 # 6. rewrite
    return _finish(report, out, t0)                                     # 7. report


def offload_for_dsa(mod: tvm.IRModule, cfg: HardwareConfig) -> tvm.IRModule:
    """Partition ``mod`` for ``cfg``, compile each region, offload the ones worth it."""
    return compile_for_dsa(mod, cfg)[0]


def _finish(report: CompileReport, mod: tvm.IRModule, t0: float
            ) -> tuple[tvm.IRModule, CompileReport]:
    """Stamp the compile id on the module, time the compile and remember its report."""
    from .compile_ids import with_compile_id

    report.seconds = time.perf_counter() - t0
    _compiles.add(report)
    return with_compile_id(mod, report.compile_id), report


def decide_regions(regions: list[RegionRead], cfg: HardwareConfig, report: CompileReport
                   ) -> dict[tvm.ir.GlobalVar, bytes]:
    """Compile each region that read into layers, simulate it, compare with the CPU
    estimate; one ``RegionDecision`` each in ``report``. Returns the launches: region
    function -> program bytes, for the regions the DSA takes."""
    from tir_schedules.options import current_options

    from .lowering.region import UnsupportedLayer

    sim = Simulator(cfg)
    crossbars = CrossbarBudget(cfg, sim)
    offload = current_options().offload
    choose_knobs = current_chooser()  # tuned schedules when a MetaSchedule database is in scope
    launch: dict[tvm.ir.GlobalVar, bytes] = {}
    for read in regions:
        if read.region is None:  # the partition report says why; it stays on the CPU
            continue
        region = read.region
        d = RegionDecision(region.name, [ly.name for ly in region.layers], region.macs, "cpu", "",
                           region=region)
        report.regions.append(d)
        t1 = time.perf_counter()
        try:
            prog, d.dsa_cycles, d.schedules = _region_program(region, cfg, choose_knobs, sim)
            d.program = prog
        except UnsupportedLayer as e:
            d.reason = f"codegen: {e}"
            continue
        except Exception as e:  # noqa: BLE001 - a bug in our lowering: CPU, said loudly
            d.reason = internal_error("lowering this region", e)
            continue
        finally:
            d.compile_s = time.perf_counter() - t1
        d.dsa_us = d.dsa_cycles / cfg.mhz + cfg.launch_overhead_us
        d.cpu_us = cpu_estimate_us(region_ops(region), cfg)
        if d.dsa_us > d.cpu_us and offload == "faster":
            d.reason = "the CPU is estimated faster"
            continue
        d.target, d.reason = "dsa", ("all layers supported, faster than the CPU"
                                     if d.dsa_us <= d.cpu_us else
                                     "all layers supported; the CPU is estimated faster, "
                                     "offloaded by options(offload='all')")
        packed = sum(1 for ly in prog.meta.get("layers", []) if ly.get("int4_weights"))
        if packed:
            d.reason += f"; {packed} layer(s) read int4 weights (half the DRAM bytes)"
        sparse = [ly["name"] for ly in prog.meta.get("layers", []) if ly.get("sparsity")]
        if sparse:
            d.reason += (f"; {len(sparse)} layer(s) run {cfg.sparsity} sparse on the array "
                         f"({', '.join(sparse[:4])}{', ...' if len(sparse) > 4 else ''})")
        if cfg.is_cim:
            d.reason += crossbars.place(prog, d)
        prog.meta["compile"] = report.compile_id
        launch[read.gv] = prog.to_bytes(cfg)
    return launch


class CrossbarBudget:
    """A CIM part's crossbars, filled by the offloaded regions in program order: a region
    whose weights no longer fit beside the ones before it is time-shared (its weights are
    reprogrammed as they stream in), and its cycles say so."""

    def __init__(self, cfg: HardwareConfig, sim: Simulator):
        self.cfg, self.sim, self.used = cfg, sim, 0

    def place(self, prog, d: RegionDecision) -> str:
        """Place ``prog`` (a region's program); the reason's suffix."""
        from .sim.cim_mapping import TIME_SHARED, map_program

        need = map_program(prog, self.cfg).crossbars_needed
        if self.used + need <= self.cfg.crossbars:
            self.used += need
            return f"; {need} crossbars ({self.used} of {self.cfg.crossbars} in use)"
        prog.meta[TIME_SHARED] = True
        d.dsa_cycles = self.sim.cycles(prog)
        d.dsa_us = d.dsa_cycles / self.cfg.mhz + self.cfg.launch_overhead_us
        return (f"; needs {need} crossbars, {self.cfg.crossbars - self.used} left: "
                f"time-shared (its weights are reprogrammed from DRAM as they stream in)")


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
