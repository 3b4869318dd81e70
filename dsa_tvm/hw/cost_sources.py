"""The published figures the ``[area]`` defaults and the ``[energy]`` references come from.

Kept as data, not retyped into prose, so the derivations the schema documents (source
figure x scaling factor = default) are computed from the same numbers the defaults are:
``docs/hardware.md`` shows each one and ``tests/device/test_area.py`` checks them.

One technology node for every default: 16 nm FinFET at 0.8 V (TSMC 16FF class).

* [H14] M. Horowitz, "Computing's energy problem (and what we can do about it)",
  ISSCC 2014, pp. 10-14: 45 nm, 0.9 V areas and energies of adders, multipliers,
  64-bit SRAM reads and DRAM accesses.
* [SB17] A. Stillmaker, B. Baas, "Scaling equations for the accurate prediction of CMOS
  device performance from 180 nm to 7 nm", Integration 58 (2017) 74-81: the area
  factor 45 nm -> 16 nm (its area table) and the energy polynomials E(Vdd) of the
  HP 45 nm and HP 16 nm models.
* [W13] S.-Y. Wu et al., "A 16nm FinFET CMOS technology for mobile SoC and computing
  applications", IEDM 2013: the 0.07 um^2 high-density 6T SRAM bit cell.
* [J17] N. P. Jouppi et al., "In-datacenter performance analysis of a tensor processing
  unit", ISCA 2017: the datapath (buffers, array, accumulators, activation) is nearly
  two-thirds of the TPU die; control, DRAM, host interfaces and I/O the rest.
"""

from __future__ import annotations

import math

NODE = "16 nm FinFET, 0.8 V"
#: tag -> the full citation, as the schema's docs give it where a tag is first used
CITATIONS = {
    "H14": 'M. Horowitz, "Computing\'s energy problem (and what we can do about it)", ISSCC 2014',
    "SB17": 'A. Stillmaker, B. Baas, "Scaling equations for the accurate prediction of CMOS '
            'device performance from 180 nm to 7 nm", Integration 58 (2017)',
    "W13": 'S.-Y. Wu et al., "A 16nm FinFET CMOS technology for mobile SoC and computing '
           'applications", IEDM 2013',
    "J17": 'N. P. Jouppi et al., "In-datacenter performance analysis of a tensor processing '
           'unit", ISCA 2017',
}


def cite(*tags: str) -> str:
    """The full citations of ``tags``, each after its tag."""
    return "; ".join(f"[{t}] {CITATIONS[t]}" for t in tags)


# --- [H14], 45 nm, 0.9 V
ADD32_UM2 = 137.0
MUL8_UM2 = 282.0
MUL32_UM2 = 3495.0          # 32 x 32 bits, full 64-bit product
ADD32_PJ = 0.1
MUL8_PJ = 0.2
MUL32_PJ = 3.1
SRAM_64B_READ_PJ = {8: 10.0, 32: 20.0, 1024: 100.0}   # KB of SRAM -> pJ per 64-bit read
DRAM_64B_PJ = (1300.0, 2600.0)                         # pJ per 64-bit DRAM access

# --- [SB17]
AREA_45_TO_16 = 0.19        # area table, 45 nm row, 16 nm column


def _sb17_energy(a: float, b: float, c: float, vdd: float) -> float:
    return a * vdd * vdd + b * vdd + c


#: energy of the same circuit at HP 16 nm, 0.8 V over HP 45 nm, 0.9 V (H14's voltage), from
#: the HP 16 nm and HP 45 nm rows of [SB17]'s energy fits (a Vdd^2 + b Vdd + c)
ENERGY_45_TO_16 = (_sb17_energy(0.2958, -0.1241, 0.03024, 0.8)
                   / _sb17_energy(1.018, -0.3107, 0.1539, 0.9))

# --- [W13]
BITCELL_UM2 = 0.07
#: macro area over bit-cell area: decoders, sense amplifiers and I/O take about half of the
#: small, wide banks a scratchpad is built from (array efficiency ~50%): assumed, the one
#: factor not read off a source
SRAM_PERIPHERY = 2.0

# --- [J17]
DATAPATH_SHARE = 2 / 3      # of the die; the other third is control, DMA/DRAM, host, I/O


def at16(um2_45: float) -> float:
    """A [H14] 45 nm area in um^2 at 16 nm, rounded to whole um^2 like the defaults."""
    return float(round(um2_45 * AREA_45_TO_16))


def pj16(pj_45: float) -> float:
    """A [H14] 45 nm energy in pJ at 16 nm, 0.8 V."""
    return pj_45 * ENERGY_45_TO_16


def sram_read_pj(kb: float) -> float:
    """[H14] pJ per 64-bit read of a ``kb`` KB SRAM, log-interpolated between its sizes."""
    sizes = sorted(SRAM_64B_READ_PJ)
    lo = max(k for k in sizes if k <= kb)
    hi = min(k for k in sizes if k >= kb)
    if lo == hi:
        return SRAM_64B_READ_PJ[lo]
    t = math.log(kb / lo) / math.log(hi / lo)
    return SRAM_64B_READ_PJ[lo] * (SRAM_64B_READ_PJ[hi] / SRAM_64B_READ_PJ[lo]) ** t


def sram_references() -> str:
    """[H14]'s SRAM read energies and their 16 nm per-byte values, as the docs list them."""
    def size(kb: int) -> str:
        return f"{kb} KB" if kb < 1024 else f"{kb // 1024} MB"
    return ", ".join(f"{size(kb)} {pj:g} pJ -> {pj16(pj / 8):.2f}"
                     for kb, pj in SRAM_64B_READ_PJ.items()) + " pJ/byte"


# --- the derived defaults (um^2 at 16 nm)
MAC_45 = MUL8_UM2 + ADD32_UM2                   # an int8 multiply and its int32 accumulate
LANE_45 = MUL32_UM2 + 4 * ADD32_UM2             # REQUANT: multiply, bias/round/zp adds, clamp
NORM_LANE_45 = 2 * MUL32_UM2 + 4 * ADD32_UM2    # i-exp (scale, square) or normalize (r, gamma)
NORM_UNIT_45 = MUL32_UM2 + 4 * ADD32_UM2        # Newton steps and 64-bit row sums, per row
SRAM_KIB_UM2 = float(round(8192 * BITCELL_UM2 * SRAM_PERIPHERY))
OVERHEAD_PCT = round(100 * (1 - DATAPATH_SHARE) / DATAPATH_SHARE, 1)
