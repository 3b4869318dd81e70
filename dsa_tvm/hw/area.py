"""Silicon area of a described part: the ``[area]`` per-component costs times the counts.

A design-space sweep trades cycles and energy against area, so area is read from the
same description as everything else: each count below (MACs, KiB, lanes, table copies,
norm lanes) is a field or derived quantity of the :class:`HardwareConfig`, each cost an
``[area]`` field (defaults and their sources: ``dsa_tvm/hw/cost_sources.py``,
``docs/hardware.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import HardwareConfig

UM2_PER_MM2 = 1e6


def table_kib(cfg: "HardwareConfig") -> float:
    """KiB of activation-table storage: one copy of the table per lookup per cycle (copies
    give parallel lookups their own read ports); 0 without a table unit."""
    if not cfg.table_present:
        return 0.0
    entry_bytes = cfg.acc_row_bytes // cfg.block_out     # int32 entries, as in the accumulator
    return cfg.lut_lookups_per_cycle * cfg.table_entries * entry_bytes / 1024


def area_breakdown(cfg: "HardwareConfig") -> dict[str, float]:
    """mm^2 per component; ``overhead`` is ``overhead_pct`` of the others' sum."""
    um2 = {
        "mac_array": cfg.peak_macs_per_cycle * cfg.mac_um2,
        "inp_sram": cfg.inp_kib * cfg.sram_kib_um2,
        "wgt_sram": cfg.wgt_kib * cfg.sram_kib_um2,
        "acc_sram": cfg.acc_kib * cfg.sram_kib_um2,
        # each MAC8 way beyond the first: an 8-bit multiplier and an adder per lane
        "vector": cfg.lanes * (cfg.vector_lane_um2 + (cfg.dot_ways - 1) * cfg.mac_um2),
        "table": table_kib(cfg) * cfg.table_kib_um2,
        "norm": cfg.norm_units * (cfg.norm_elements_per_cycle * cfg.norm_lane_um2
                                  + cfg.norm_unit_um2),
    }
    um2["overhead"] = sum(um2.values()) * cfg.overhead_pct / 100
    return {name: v / UM2_PER_MM2 for name, v in um2.items()}


def area_mm2(cfg: "HardwareConfig") -> float:
    """Estimated silicon area of the part in mm^2: the sum of :func:`area_breakdown`."""
    return sum(area_breakdown(cfg).values())
