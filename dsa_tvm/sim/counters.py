"""Performance counters of one simulated run, and their printable table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..isa.footprint import BUF_SRAM, Footprint
from ..isa.instructions import (
    ACCUMULATING_OPS,
    Alu,
    AluOp,
    Buffer,
    Gemm,
    Instruction,
    Load,
    Opcode,
    Store,
    b_rows,
)
from .timing import Schedule

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

#: counter name -> (unit, meaning); the order of the report.
COUNTER_DOCS: dict[str, tuple[str, str]] = {
    "cycles": ("cycles", "from the first dispatch to the last completion"),
    "time_us": ("us", "cycles at the configured clock"),
    "instructions": ("", "instructions executed"),
    "macs": ("MACs", "array MAC slots issued: GEMM steps x peak MACs per step (padding "
                     "lanes count; useful MACs follow from the layer shapes)"),
    "mac_utilization": ("", "array MAC slots issued / peak (padding lanes count): "
                            "macs / (cycles x peak MACs per cycle)"),
    "alu_lane_ops": ("ops", "int32 vector-lane operations"),
    "table_lookups": ("lookups", "activation-table lookups (ALU LUT lanes; also counted in "
                                 "alu_lane_ops)"),
    "dram_read_bytes": ("bytes", "DRAM bytes read by all loads"),
    "dram_write_bytes": ("bytes", "DRAM bytes written by all stores"),
    "dram_busy_cycles": ("cycles", "cycles the DRAM channel was transferring"),
    "dram_utilization": ("", "dram_busy_cycles / cycles"),
    "fetch_stall_cycles": ("cycles", "cycles dispatch waited for a full instruction queue"),
}

#: per-engine counters ("<engine>.<name>", engine = load, compute, store) -> (unit, meaning)
ENGINE_COUNTER_DOCS: dict[str, tuple[str, str]] = {
    "busy_cycles": ("cycles", "cycles the engine was occupied and could not start its next "
                              "instruction (load/store: channel wait + transfer; the DRAM "
                              "latency of outstanding transfers is not counted)"),
    "active_cycles": ("cycles", "cycles with at least one of the engine's instructions "
                                "between start and completion (DRAM latency included)"),
    "token_wait_cycles": ("cycles", "cycles the engine's next instruction waited for tokens"),
    "dram_wait_cycles": ("cycles", "cycles the engine's transfers waited for the DRAM channel"),
}


def collect_counters(instrs: list[Instruction], sched: Schedule, footprints: list[Footprint],
                     cfg: "HardwareConfig", resident_loads: frozenset[int] = frozenset(),
                     analog_gemms: frozenset[int] = frozenset()) -> dict[str, float]:
    """Counters of a run. On a CIM part ``resident_loads`` move no DRAM bytes (the weights
    stay programmed in the crossbars) and ``analog_gemms`` use no MAC-array slots (the
    crossbar counters are ``dsa_tvm.sim.cim_mapping.cim_counters``)."""
    c: dict[str, float] = {}
    cycles = sched.cycles
    c["cycles"] = cycles
    c["time_us"] = cycles / cfg.mhz
    c["instructions"] = len(instrs)
    # one pass over the program: instruction kinds, array steps, ALU rows, DRAM bytes
    kinds = dict.fromkeys(Opcode, 0)
    gemm_steps = alu_steps = lut_steps = 0
    rd = {b: 0 for b in ("inp", "wgt", "acc")}
    wr = {"acc32": 0, "acc8": 0, "acc16": 0}
    wr_key = {Buffer.ACC8: "acc8", Buffer.ACC16: "acc16"}
    unit_of = {b: cfg.element_bytes(b) for b in Buffer}
    n_m = cfg.sparse_n_m
    sparse_share = n_m[0] / n_m[1] if n_m else 1.0
    for i, ins in enumerate(instrs):
        kinds[ins.opcode] += 1
        if i in resident_loads or i in analog_gemms:
            continue
        if isinstance(ins, Gemm):  # a sparse GEMM issues only the kept N of each M MACs
            gemm_steps += ins.steps * sparse_share if ins.sparse else ins.steps
        elif isinstance(ins, Alu):
            alu_steps += ins.steps
            if ins.op == AluOp.LUT:
                lut_steps += ins.steps
        elif isinstance(ins, Load):
            rd[BUF_SRAM[ins.buffer]] += ins.y_size * ins.x_size * unit_of[ins.buffer]
        elif isinstance(ins, Store):
            wr[wr_key.get(ins.buffer, "acc32")] += (
                ins.y_size * ins.x_size * unit_of[ins.buffer])
    for op in Opcode:
        c[f"instr.{op.name.lower()}"] = kinds[op]
    macs = round(gemm_steps * cfg.peak_macs_per_cycle)
    c["macs"] = macs
    c["mac_utilization"] = macs / (cycles * cfg.peak_macs_per_cycle) if cycles else 0.0
    c["alu_lane_ops"] = alu_steps * cfg.block_out
    c["table_lookups"] = lut_steps * cfg.block_out
    for eng in ("load", "compute", "store"):
        c[f"{eng}.busy_cycles"] = sched.busy[eng]
        c[f"{eng}.active_cycles"] = sched.active[eng]
        c[f"{eng}.token_wait_cycles"] = sched.token_wait[eng]
        c[f"{eng}.dram_wait_cycles"] = sched.dram_wait[eng]
    c["fetch_stall_cycles"] = sched.fetch_stall
    for b, v in rd.items():
        c[f"dram_read_bytes.{b}"] = v
    for b, v in wr.items():
        c[f"dram_write_bytes.{b}"] = v
    c["dram_read_bytes"] = sum(rd.values())
    c["dram_write_bytes"] = sum(wr.values())
    c["dram_busy_cycles"] = sched.dram_busy
    c["dram_utilization"] = sched.dram_busy / cycles if cycles else 0.0
    unit = {"inp": cfg.inp_row_bytes, "wgt": cfg.wgt_tile_bytes, "acc": cfg.acc_row_bytes}
    peak = {b: -1 for b in unit}
    for fp in footprints:
        for sram, _lo, hi in fp.reads + fp.writes:
            if hi > peak[sram]:
                peak[sram] = hi
    for b in unit:
        c[f"sram_peak_bytes.{b}"] = (peak[b] + 1) * unit[b]
    if cfg.energy_modelled:
        c["sram_bytes"] = _sram_bytes([ins for i, ins in enumerate(instrs)
                                       if i not in resident_loads and i not in analog_gemms],
                                      cfg)
        c["energy_uj"] = sum(energy_split(c, cfg).values())
    return c


def energy_split(c: dict[str, float], cfg: "HardwareConfig") -> dict[str, float]:
    """Where a run's energy went, in uJ, from its counters and the description's [energy]
    (and [cim]) costs: the MAC array, vector lanes, table lookups beyond a lane op,
    scratchpads, DRAM, and a CIM part's crossbars (reads and ADC conversions)."""
    # a lookup costs table_lookup_pj where the description gives one, else a lane op
    lut_pj = (cfg.table_lookup_pj or cfg.alu_lane_op_pj) - cfg.alu_lane_op_pj
    return {"mac": c["macs"] * cfg.mac_pj / 1e6,
            "vector": c["alu_lane_ops"] * cfg.alu_lane_op_pj / 1e6,
            "table": c["table_lookups"] * lut_pj / 1e6,
            "sram": c.get("sram_bytes", 0) * cfg.sram_byte_pj / 1e6,
            "dram": (c["dram_read_bytes"] + c["dram_write_bytes"]) * cfg.dram_byte_pj / 1e6,
            "crossbars": c.get("cim.energy_pj", 0.0) / 1e6}


def _sram_bytes(instrs: list[Instruction], cfg: "HardwareConfig") -> int:
    """Scratchpad bytes read and written (GEMM reads one input row and one weight tile and
    updates one accumulator row per step; ALU reads row a, its b rows (none with the
    immediate, two for CLIP, three for REQUANT) and, for MAC and MAC8, the destination, and writes
    one row)."""
    total = 0
    for ins in instrs:
        if isinstance(ins, Gemm):  # a sparse GEMM reads its tiles compressed
            tile = cfg.sparse_tile_bytes if ins.sparse else cfg.wgt_tile_bytes
            total += ins.steps * (cfg.inp_row_bytes + tile + 2 * cfg.acc_row_bytes)
        elif isinstance(ins, Alu):
            # a LUT step reads one table entry per lane: one row's worth
            b = 1 if ins.op == AluOp.LUT else b_rows(ins.op)
            rows = 2 + (0 if ins.use_imm else b) + (ins.op in ACCUMULATING_OPS)
            total += ins.steps * cfg.acc_row_bytes * rows
        elif isinstance(ins, Load):
            # a WGT4 load writes whole int8 tiles (unpacked on the way in), a WGTS load
            # its compressed tiles
            buf = Buffer.WGT if ins.buffer == Buffer.WGT4 else ins.buffer
            total += ins.rows_written * cfg.element_bytes(buf)
        elif isinstance(ins, Store):
            total += ins.y_size * ins.x_size * cfg.acc_row_bytes
    return total


def format_counters(c: dict[str, float], title: str = "DSA counters") -> str:
    """An aligned two-column table of every counter."""
    lines = [title, "-" * len(title)]
    width = max(len(k) for k in c)
    for k, v in c.items():
        if isinstance(v, float) and not float(v).is_integer() or k.endswith(("utilization",
                                                                               "time_us")):
            val = f"{v:,.4f}" if k.endswith("utilization") else f"{v:,.3f}"
        else:
            val = f"{int(v):,}"
        doc = COUNTER_DOCS.get(k) or ENGINE_COUNTER_DOCS.get(k.split(".", 1)[-1])
        lines.append(f"{k:<{width}}  {val:>16}" + (f"  {doc[0]}" if doc and doc[0] else ""))
    return "\n".join(lines)
