"""Per-layer report of a model run: what ran where, how long, how well.

Built from the launches the runtime recorded (each region's program and its
simulated schedule) and the compile report (what stayed on the CPU and why).
Printable as a table, exportable as JSON, as a per-layer CSV (one header line,
stable column names, in the style of Vela's per-layer report) and as one Perfetto
trace of the whole model (regions laid end to end).
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
import weakref
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .isa.instructions import Load, Store
from .layers.checks import compute_bound, roofline_bound, violations
from .sim.attribution import attribute
from .sim.cim_mapping import analog_peak_macs_per_cycle
from .sim.timing import dma_bytes


@dataclass
class LayerRow:
    name: str
    op: str
    target: str              # "DSA" or "CPU"
    why: str
    macs: int
    cycles: int = 0          # attributed: the region's cycles charged to one layer each (sums)
    utilization: float = 0.0
    span: int = 0            # first start to last end of its instructions (layers overlap)
    load_cycles: int = 0     # busy cycles of each engine on its instructions
    compute_cycles: int = 0
    store_cycles: int = 0
    dram_read: int = 0
    dram_written: int = 0
    region: str = ""
    check: str = ""          # why the numbers are impossible (layers.checks), "" when sound
    min_read: int = 0        # compulsory DRAM bytes from the program's layer table (host-packed
    min_written: int = 0     # inputs as the DSA reads them, e.g. a folded stem's im2col matrix)
    bound: int = 0           # roofline: max(compute bound, compulsory bytes / bandwidth) cycles
    bound_by: str = ""       # the larger term of ``bound``: "compute" or "memory"
    compute: int = 0         # ``cycles`` by what claimed them (sim.attribution; they sum to it):
    dram_wait: int = 0       # the compute engine ran it / only its DRAM transfers were in flight /
    token_wait: int = 0      # no engine worked (a dependency token or the pipeline held it up)
    sparsity: str = ""       # "N:M" when its GEMMs ran sparse on the array (array.sparsity)


def issued_macs(row: LayerRow) -> float:
    """The MACs the array performed for a row: a sparse layer's kept N of every M (its
    ``macs`` count the dense layer's, which is what its result is worth)."""
    if not row.sparsity:
        return row.macs
    n, m = (int(v) for v in row.sparsity.split(":"))
    return row.macs * n / m


@dataclass
class RunReport:
    hardware: str
    mhz: float
    rows: list[LayerRow] = field(default_factory=list)
    total_cycles: int = 0
    regions: int = 0
    trace_events: list[dict[str, Any]] = field(default_factory=list, repr=False)
    timing_reused: int = 0   # launches whose timing came from an earlier run of the program
    cim: dict[str, float] = field(default_factory=dict)   # a CIM part's crossbar counters, summed
    #: names in the part's cim.digital_layers that no launched layer has (a typo keeps nothing
    #: digital)
    cim_unknown_layers: list[str] = field(default_factory=list)

    @property
    def latency_us(self) -> float:
        return self.total_cycles / self.mhz

    @property
    def dsa_mac_share(self) -> float:
        total = sum(r.macs for r in self.rows)
        return sum(r.macs for r in self.rows if r.target == "DSA") / total if total else 0.0

    @property
    def bound_cycles(self) -> int:
        """Sum of the DSA layers' roofline bounds (``LayerRow.bound``)."""
        return sum(r.bound for r in self.rows if r.target == "DSA")

    @property
    def violations(self) -> list[LayerRow]:
        """DSA layers below their compute bound or compulsory DRAM bytes (layers.checks)."""
        return [r for r in self.rows if r.check]

    def to_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "mhz": self.mhz, "total_cycles": self.total_cycles,
                "latency_us": self.latency_us, "dsa_mac_share": self.dsa_mac_share,
                "bound_cycles": self.bound_cycles, "regions": self.regions,
                "timing_reused": self.timing_reused,
                "layers": [asdict(r) for r in self.rows]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        """One line per layer (DSA and CPU) under one header of :data:`CSV_COLUMNS`, for a
        spreadsheet or a diff between runs; measured columns are empty on CPU rows."""
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(CSV_COLUMNS)
        out.writerows(_csv_row(r, self.total_cycles) for r in self.rows)
        return buf.getvalue()

    def write_csv(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_csv())
        return path

    def write_trace(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps({"traceEvents": self.trace_events, "displayTimeUnit": "ns"}))
        return path

    def __str__(self) -> str:
        head = (f"{'layer':<28} {'op':<14} {'on':<4} {'MACs':>12} {'cycles':>10} {'util':>6} "
                f"{'span':>10} {'load':>10} {'compute':>10} {'store':>10} "
                f"{'DRAM rd':>10} {'DRAM wr':>10}  why")
        lines = [f"DSA run report ('{self.hardware}', {self.mhz:g} MHz)", head, "-" * len(head)]
        for r in self.rows:
            dsa = r.target == "DSA"
            cyc, span, ld, cmp, st = (f"{v:,}" if dsa else "-" for v in (
                r.cycles, r.span, r.load_cycles, r.compute_cycles, r.store_cycles))
            util = f"{r.utilization:.2f}" if dsa else "-"
            lines.append(f"{r.name[:28]:<28} {r.op[:14]:<14} {r.target:<4} {r.macs:>12,} "
                         f"{cyc:>10} {util:>6} {span:>10} {ld:>10} {cmp:>10} {st:>10} "
                         f"{r.dram_read:>10,} {r.dram_written:>10,}  {r.why}"
                         + (f"  !! IMPOSSIBLE: {r.check}" if r.check else ""))
        lines.append("-" * len(head))
        if self.violations:
            lines.append(f"WARNING: {len(self.violations)} layer(s) beat their compute bound or "
                         f"compulsory DRAM bytes: their results cannot be right (marked !!)")
        lines.append("cycles: each region cycle charged to one layer (compute engine first, then "
                     "load, then store; idle cycles to the work waited for), so they sum to the "
                     "total; span: first start to last end; load/compute/store: busy cycles")
        dsa = [r for r in self.rows if r.target == "DSA"]
        if self.total_cycles:
            split = [sum(getattr(r, k) for r in dsa) for k in ("compute", "dram_wait", "token_wait")]
            lines.append("cycles by what the layer waited on: " + ", ".join(
                f"{what} {n:,} ({n / self.total_cycles:.0%})"
                for what, n in zip(("compute", "DRAM", "tokens/pipeline"), split)))
        lines.append(f"total: {self.total_cycles:,} DSA cycles = {self.latency_us:,.1f} us at "
                     f"{self.mhz:g} MHz over {self.regions} region launch(es); "
                     f"{self.dsa_mac_share:.1%} of MACs on the DSA")
        if self.timing_reused:
            lines.append(f"timing: {self.timing_reused} of {self.regions} launch(es) reused the "
                         f"schedule of an earlier run of the same program (timing does not "
                         f"depend on the data; the values were computed anew)")
        if self.cim:
            c = self.cim
            shared = int(c["launches"] - c["fits"])
            lines.append(
                f"crossbars: {int(c['cim.gemms']):,} GEMMs read {int(c['cim.crossbar_reads']):,} "
                f"crossbar(s) with {int(c['cim.adc_conversions']):,} ADC conversions, "
                f"{c['cim.energy_pj'] / 1e6:,.2f} uJ; {int(c['cim.resident_weight_bytes']):,} "
                f"weight bytes programmed"
                + (f"; {shared} launch(es) time-shared (their weights beyond the crossbars, "
                   f"read and reprogrammed as they stream in)" if shared
                   else ", none read at run time"))
        if self.cim_unknown_layers:
            lines.append(f"WARNING: cim.digital_layers names {', '.join(self.cim_unknown_layers)}"
                         f", which no layer of this run has: nothing was kept digital for them "
                         f"(names as the layer column above prints them)")
        if self.bound_cycles:
            lines.append(f"roofline: the DSA layers' bounds sum to {self.bound_cycles:,} cycles "
                         f"({self.total_cycles / self.bound_cycles:.2f}x; compulsory bytes as "
                         f"the DSA reads them, host-packed inputs included)")
        return "\n".join(lines)


def _bound_by(macs: int, min_read: int | None, min_write: int | None, cfg,
              peak: int | None = None) -> str:
    """Which term of :func:`roofline_bound` is the larger: what would limit an ideal layer."""
    moved = (min_read or 0) + (min_write or 0)
    memory = math.ceil(moved / cfg.bandwidth_bytes_per_cycle) if moved else 0
    peak = peak or cfg.peak_macs_per_cycle
    return "memory" if memory > compute_bound(macs, peak) else "compute"


#: the per-layer CSV's header, in order; names are stable (scripts key on them)
CSV_COLUMNS = ("name", "op", "target", "region", "macs", "cycles", "cycles_pct", "compute",
               "dram_wait", "token_wait", "utilization", "span", "load_busy", "compute_busy",
               "store_busy", "dram_read_bytes", "dram_written_bytes", "min_read_bytes",
               "min_written_bytes", "bound_cycles", "bound_ratio", "bound_by", "why", "check",
               "sparsity")


def _csv_row(r: LayerRow, total: int) -> list[Any]:
    """A row's CSV fields; a CPU layer has no measured cycles or bytes, so those are empty."""
    if r.target != "DSA":
        measured: list[Any] = [""] * (len(CSV_COLUMNS) - 7)
    else:
        measured = [r.cycles, f"{100 * r.cycles / total:.2f}" if total else "", r.compute,
                    r.dram_wait, r.token_wait, f"{r.utilization:.4f}", r.span, r.load_cycles,
                    r.compute_cycles, r.store_cycles, r.dram_read, r.dram_written, r.min_read,
                    r.min_written, r.bound, f"{r.cycles / r.bound:.3f}" if r.bound else "",
                    r.bound_by]
    return [r.name, r.op, r.target, r.region, r.macs, *measured, r.why, r.check, r.sparsity]


#: id(schedule) -> (the schedule, its program, the peak, their rows and runs), the first
#: two weakly held (no program is kept alive): a program's timing does not depend on the
#: data (the simulator reuses its schedule), so a decode loop launching the same programs
#: every token attributes each once
_ROWS: dict[int, tuple] = {}
_MAX_ROWS = 256


def _layer_rows(launch, peak: int) -> tuple[list[LayerRow], list[tuple[int, int, int]]]:
    """The launch's DSA rows (fresh copies), and the stretches of cycles charged to each
    (row index); a CIM part's launch is attributed anew (its counters are the launch's)."""
    res = launch.result
    if res.cim is not None:
        return _attributed_rows(launch, peak)
    hit = _ROWS.get(id(res.schedule))
    if (hit is None or hit[0]() is not res.schedule or hit[1]() is not launch.program
            or hit[2] != peak):
        if len(_ROWS) >= _MAX_ROWS:
            _ROWS.clear()
        hit = (weakref.ref(res.schedule), weakref.ref(launch.program), peak,
               _attributed_rows(launch, peak))
        _ROWS[id(res.schedule)] = hit
    rows, runs = hit[3]
    return [replace(r) for r in rows], runs


def _attributed_rows(launch, peak: int) -> tuple[list[LayerRow], list[tuple[int, int, int]]]:
    """:func:`_layer_rows`, computed."""
    prog, res = launch.program, launch.result
    metas = prog.meta.get("layers", [])
    times = attribute(res.schedule, [(ly["first"], ly["last"]) for ly in metas])
    rows = []
    cim = res.cim
    resident = cim.resident_loads if cim is not None else frozenset()
    for ly, t in zip(metas, times.layers):
        lo, hi = ly["first"], ly["last"] + 1
        rd = wr = 0
        for i, ins in enumerate(prog.instructions[lo:hi], lo):
            if isinstance(ins, Load) and i not in resident:
                rd += dma_bytes(ins, res.config)
            elif isinstance(ins, Store):
                wr += dma_bytes(ins, res.config)
        lo_rd, lo_wr = ly.get("min_read_bytes"), ly.get("min_write_bytes")
        peak_l = peak
        if ly.get("sparsity"):  # the kept N of each M MACs run, M / N tiles a cycle
            n, m = (int(v) for v in ly["sparsity"].split(":"))
            peak_l = peak * m // n
        if cim is not None and any(lo <= i < hi for i in cim.analog):
            # the crossbars do the MACs and hold the weights: neither bound counts them
            peak_l = max(peak, analog_peak_macs_per_cycle(res.config))
            if any(lo <= i < hi for i in resident) and lo_rd is not None:
                lo_rd = max(0, lo_rd - int(ly.get("weight_bytes", 0)))
        util = ly["macs"] / (t.cycles * peak_l) if t.cycles else 0.0
        bad = violations(int(ly["macs"]), t.cycles, rd, wr, lo_rd, lo_wr, peak_l)
        bound = roofline_bound(int(ly["macs"]), lo_rd, lo_wr, peak_l,
                               res.config.bandwidth_bytes_per_cycle)
        rows.append(LayerRow(ly["name"], ly["op"], "DSA", "offloaded", int(ly["macs"]),
                             t.cycles, util, t.span, t.load, t.compute, t.store, rd, wr,
                             prog.name, "; ".join(bad), int(lo_rd or 0), int(lo_wr or 0), bound,
                             _bound_by(int(ly["macs"]), lo_rd, lo_wr, res.config, peak_l),
                             t.on_compute, t.dram_wait, t.token_wait, ly.get("sparsity", "")))
    return rows, times.runs


#: trace thread of the attributed-layer track (after the engines, DRAM and in-flight lanes)
LAYER_TID = 99


def _attribution_track(rows: list[LayerRow], runs: list[tuple[int, int, int]], offset: int,
                       mhz: float, region: str, first: bool) -> list[dict[str, Any]]:
    """Trace slices of the cycles charged to each layer (the ``cycles`` column)."""
    ev: list[dict[str, Any]] = []
    if first:
        ev += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": LAYER_TID,
                "args": {"name": "layer (cycles charged)"}},
               {"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": LAYER_TID,
                "args": {"sort_index": -1}}]
    for k, s, e in runs:
        ev.append({"name": rows[k].name, "cat": "layer", "ph": "X", "pid": 1, "tid": LAYER_TID,
                   "ts": (offset + s) / mhz, "dur": (e - s) / mhz,
                   "args": {"region": region, "op": rows[k].op, "cycles": e - s}})
    return ev


#: the crossbar counters a run report sums over its launches (after two counts of its own)
_CIM_SUMS = ("launches", "fits", "cim.gemms", "cim.crossbar_reads", "cim.adc_conversions",
             "cim.energy_pj", "cim.resident_weight_bytes")


def build_report(launches: list, compile_report=None, trace: bool = True) -> RunReport:
    """A RunReport from recorded launches (``runtime.take_launches()``); ``trace=False``
    leaves out the trace events (most of the cost when a caller only wants the numbers,
    e.g. per decoded token)."""
    if launches:
        cfg = launches[0].result.config
        hw, mhz, peak = cfg.name, cfg.mhz, cfg.peak_macs_per_cycle
    else:
        hw = compile_report.hardware if compile_report else "?"
        mhz, peak = (compile_report.mhz if compile_report else 1.0), 1
    rep = RunReport(hw, mhz)
    offset = 0
    for launch in launches:
        rows, runs = _layer_rows(launch, peak)
        rep.rows += rows
        rep.total_cycles += launch.result.cycles
        if not trace:
            offset += launch.result.cycles
            continue
        rep.trace_events += _attribution_track(rows, runs, offset, mhz, launch.program.name,
                                               first=offset == 0)
        for ev in launch.result.trace():
            ev = dict(ev)
            if ev.get("ph") == "X":
                ev["ts"] = ev["ts"] + offset / mhz
                ev.setdefault("args", {})["region"] = launch.program.name
            elif offset:
                continue  # track names once
            rep.trace_events.append(ev)
        offset += launch.result.cycles
    rep.regions = len(launches)
    for launch in launches:   # a CIM part: its crossbar counters, summed over the launches
        if launch.result.cim is not None:
            c = rep.cim or dict.fromkeys(_CIM_SUMS, 0.0)
            for k in _CIM_SUMS[2:]:
                c[k] += launch.result.counters[k]
            c["launches"] += 1
            c["fits"] += launch.result.cim.fits
            rep.cim = c
    wanted = launches[0].result.config.digital_layers if launches else ""
    if wanted:
        names = {ly["name"] for la in launches for ly in la.program.meta.get("layers", [])}
        rep.cim_unknown_layers = [n.strip() for n in wanted.split(",")
                                  if n.strip() and n.strip() not in names]
    rep.timing_reused = sum(bool(getattr(x.result, "timing_reused", False)) for x in launches)
    if rep.violations:
        warnings.warn(f"DSA run report: {len(rep.violations)} layer(s) are below their compute "
                      f"bound or compulsory DRAM bytes (first: {rep.violations[0].name}: "
                      f"{rep.violations[0].check})", RuntimeWarning, stacklevel=2)
    if compile_report is not None:
        for d in compile_report.regions:
            if d.target == "cpu" and d.region is not None:
                rep.rows += [LayerRow(ly.name, type(ly).__name__, "CPU", d.reason, int(ly.macs))
                             for ly in d.region.layers]
        part = compile_report.partition
        for op in getattr(part, "cpu_ops", []):
            if op.macs or op.op in ("relax.nn.conv2d", "relax.matmul"):
                rep.rows.append(LayerRow(op.var, op.op.replace("relax.", ""), "CPU", op.reason,
                                         int(op.macs)))
    return rep
