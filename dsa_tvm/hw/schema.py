"""The hardware-description schema: every field, its unit, its rule and what it means.

This table is the single definition of what a hardware description may say.
The loader validates against it, the docs (`docs/hardware.md`) are generated
from it, and the presets in `target/` are checked against it in the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import cost_sources as src
from .sparsity import parse_n_m

#: values of ``array.dataflow`` and ``output.stage``
DATAFLOWS = ("matrix-vector", "weight-stationary", "output-stationary")
OUTPUT_STAGES = ("shared", "pipelined")


def _pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class FieldSpec:
    """One field of a hardware description (a key inside a TOML section)."""

    section: str
    name: str
    type: type
    unit: str
    doc: str
    rule: str
    check: Callable[[object], bool]
    default: object = None  # None: required

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}" if self.section else self.name


def _int(section, name, unit, doc, rule, check, default=None) -> FieldSpec:
    return FieldSpec(section, name, int, unit, doc, rule, check, default)


def _float(section, name, unit, doc, rule, check, default=None) -> FieldSpec:
    return FieldSpec(section, name, float, unit, doc, rule, check, default)


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("", "name", str, "", "Short name of the part; shown in reports and traces.",
              "non-empty", lambda v: bool(v)),
    FieldSpec("", "description", str, "", "One line saying what kind of part this is.",
              "any text", lambda v: True, ""),
    # --- matrix unit
    _int("array", "block_in", "elements",
         "Reduction width of the MAC array: int8 input elements consumed per row per cycle "
         "(the K side of one GEMM step). Also the width of one input-buffer row.",
         "power of two, 2..256", lambda v: _pow2(v) and 2 <= v <= 256),
    _int("array", "block_out", "elements",
         "Output width of the MAC array: int32 accumulators updated per cycle (the N side). "
         "Also the lane count of one accumulator row.",
         "power of two, 2..256", lambda v: _pow2(v) and 2 <= v <= 256),
    FieldSpec("array", "input_dtype", str, "", "Element type of activations fed to the array.",
              'must be "int8"', lambda v: v == "int8", "int8"),
    FieldSpec("array", "weight_dtype", str, "", "Element type of weights fed to the array.",
              'must be "int8"', lambda v: v == "int8", "int8"),
    FieldSpec("array", "acc_dtype", str, "", "Accumulator element type; sums wrap around on overflow.",
              'must be "int32"', lambda v: v == "int32", "int32"),
    FieldSpec("array", "dataflow", str, "",
              "How the array walks a GEMM instruction's loop nest (timing only; values are "
              "bit-exact under every dataflow). \"matrix-vector\": one loop point per cycle, a new "
              "weight tile may enter every cycle, fill+drain (block_in + block_out) once per "
              "instruction. \"weight-stationary\": a weight tile is preloaded into the R x C "
              "PEs (R = block_in, C = block_out; R cycles, one weight row per cycle) and the "
              "loop points that share it stream through: per fold T + 2R + C - 2 (T streamed "
              "points), minus the preload when double-buffered (weight_double_buffer). "
              "\"output-stationary\": R accumulator rows x C lanes stay in the PEs while their "
              "reduction streams: per fold K + R + C - 2 (K reduction elements). The cost is "
              "dsa_tvm/hw/dataflow.py gemm_cycles, shared by the simulator and the estimates.",
              '"matrix-vector", "weight-stationary" or "output-stationary"',
              lambda v: v in DATAFLOWS, "matrix-vector"),
    FieldSpec("array", "weight_double_buffer", bool, "",
              "Weight-stationary only: the PEs hold a second weight tile, so the next fold's "
              "preload (R cycles) hides behind the current fold's T streamed points when "
              "T >= R (only R - T cycles show otherwise; the first preload always shows).",
              "true or false", lambda v: isinstance(v, bool), False),
    FieldSpec("array", "sparsity", str, "",
              "Structured weight sparsity the array can skip. \"dense\": every weight is "
              "multiplied. \"N:M\" (e.g. \"2:4\"): in a weight tile whose every row has at "
              "most N nonzero codes in each aligned group of M consecutive reduction elements, "
              "the array multiplies only the N kept ones, so M/N such tiles that feed the same "
              "accumulator rows share one cycle (a GEMM's reduction points cost ceil(R * N / M) "
              "cycles instead of R). The compiler finds such weights by their values, stores "
              "them compressed in DRAM (N int8 values plus log2(M) index bits per kept value per "
              "group: 160 bytes for a 16x16 2:4 tile instead of 256) and loads them with buffer "
              "WGTS (a tile slot each in the weight scratchpad, which the array reads "
              "compressed); other weights load and run dense, unchanged. Matrix-vector or "
              "output-stationary dataflow only; not on a CIM part. The multiplexers' area is "
              "not in the [area] estimate.",
              '"dense" or "N:M" with 1 <= N < M, M a power of two dividing array.block_in and '
              'N dividing M', lambda v: v == "dense" or parse_n_m(v) is not None, "dense"),
    _int("array", "wgt_port_bytes", "bytes/cycle",
         "Read port of the weight scratchpad into the array. Matrix-vector needs a whole "
         "block_out x block_in tile per cycle when the weight changes every loop point; "
         "weight-stationary preloads C bytes per cycle; output-stationary reads C per cycle. A "
         "schedule that needs more is charged the extra cycles. 0: one weight tile per cycle "
         "(block_in x block_out bytes, what matrix-vector needs; on a sparse array (array.sparsity "
         "N:M) M / N compressed tiles, what its sparse GEMMs take a cycle).", "0..1048576",
         lambda v: 0 <= v <= 1 << 20, 0),
    _int("array", "inp_port_bytes", "bytes/cycle",
         "Read port of the input scratchpad into the array: every dataflow reads one input "
         "row (block_in bytes) per streamed cycle; a narrower port is charged the extra cycles. "
         "0: one input row per cycle (block_in bytes; on a sparse array (array.sparsity N:M) "
         "M / N rows, what its sparse GEMMs take a cycle).", "0..1048576",
         lambda v: 0 <= v <= 1 << 20, 0),
    # --- scratchpads
    _int("sram", "inp_kib", "KiB",
         "Input scratchpad: int8 rows of block_in elements that GEMM reads its activations from.",
         "1..65536, whole number of rows", lambda v: 1 <= v <= 65536),
    _int("sram", "wgt_kib", "KiB",
         "Weight scratchpad: int8 tiles of block_out x block_in that GEMM reads its weights from.",
         "1..65536, whole number of tiles", lambda v: 1 <= v <= 65536),
    _int("sram", "acc_kib", "KiB",
         "Accumulator scratchpad: int32 rows of block_out lanes. GEMM accumulates here, the vector "
         "unit computes here (bias, requantize, pooling), and STORE reads from here.",
         "1..65536, whole number of rows", lambda v: 1 <= v <= 65536),
    # --- DRAM
    _float("dram", "bandwidth_bytes_per_cycle", "bytes/cycle",
           "Sustained DRAM bandwidth shared by every DMA transfer (loads and stores).",
           "> 0 and <= 4096", lambda v: 0 < v <= 4096),
    _int("dram", "latency_cycles", "cycles",
         "Cycles from the start of a DMA transfer until its first byte arrives; overlaps with "
         "other transfers.", "0..100000", lambda v: 0 <= v <= 100000),
    _int("dram", "size_mib", "MiB", "Addressable device DRAM.", "1..65536",
         lambda v: 1 <= v <= 65536, 1024),
    FieldSpec("dram", "int4_weights", bool, "",
              "true: a LOAD can read weight tiles stored as int4 (two signed 4-bit codes a "
              "byte, sign-extended to int8 on the way into the weight scratchpad: buffer "
              "WGT4), so a constant weight whose codes all lie in [-8, 7] (a W4A8 model's) "
              "takes half the DRAM bytes and half the bytes each load moves. false: weights "
              "are int8 in DRAM. A CIM part (cim.crossbars > 0) programs its weights into the "
              "crossbars once and does not use it.", "true or false", lambda v: isinstance(v, bool), False),
    # --- vector unit
    _int("vector", "lanes", "int32 lanes",
         "int32 lanes the vector ALU processes per cycle; one accumulator row takes "
         "ceil(block_out / lanes) cycles per ALU step, and a unit wider than a row "
         "(lanes > block_out) runs lanes / block_out consecutive steps of an ALU "
         "instruction per cycle (what depthwise convs need to keep up with DRAM).",
         "power of two, 1..block_in * block_out",
         lambda v: _pow2(v)),
    _int("vector", "mac8_ways", "products/lane/step",
         "int8 products one lane adds per step of a MAC8 (the ALU's multiply-accumulate on "
         "int8 codes, as a dot-product instruction does): a MAC8 over R reduction points "
         "(levels of destination stride 0, e.g. a depthwise conv's taps) takes ceil(R / "
         "mac8_ways) steps per destination row. Each way is an 8-bit multiplier and an adder "
         "beside the lane (area.mac_um2 each); the taps come through a sliding window. "
         "1: one product a step, as MAC. Capped at block_in * block_out / lanes: the vector "
         "unit never multiplies faster than the array (the compute bound).",
         "power of two, 1..256", lambda v: _pow2(v) and v <= 256, 1),
    _int("vector", "alu_latency_cycles", "cycles",
         "Pipeline depth of the vector ALU, paid once per ALU instruction.", "0..1000",
         lambda v: 0 <= v <= 1000, 4),
    # --- activation table unit (ALU LUT)
    _int("table", "table_unit", "0/1",
         "1: the vector unit has the activation table unit (ALU op LUT looks each lane up in "
         "a 256-entry table held in the accumulator scratchpad); 0: it has none and the "
         "compiler keeps table layers (sigmoid, SiLU, GELU, ...) on the host. Part of every "
         "bundled preset.", "0 or 1", lambda v: v in (0, 1), 1),
    _int("table", "table_entries", "entries",
         "Entries of one table: one per int8 input code.", "must be 256",
         lambda v: v == 256, 256),
    _int("table", "table_lookups_per_cycle", "lookups/cycle",
         "Table lookups per cycle (read ports); one LUT step over an accumulator row takes "
         "ceil(block_out / table_lookups_per_cycle) cycles. 0: one per vector lane "
         "(vector.lanes).", "0..256", lambda v: 0 <= v <= 256, 0),
    # --- output stage (requantize / activation ALU instructions)
    FieldSpec("output", "stage", str, "",
              "Where the vector-unit (ALU) instructions run. \"shared\": on the compute engine, "
              "serialized with the GEMMs (VTA). \"pipelined\": in an output stage of their own "
              "(TPU / Gemmini class): the compute engine spends one cycle issuing each, the stage "
              "runs them in order, the next GEMM overlaps unless it touches the rows the stage "
              "is still working on, and the tokens an ALU pushes (to the store) wait for the "
              "stage to finish it. Timing only.",
              '"shared" or "pipelined"', lambda v: v in OUTPUT_STAGES, "shared"),
    # --- engines
    _int("queues", "load_depth", "instructions", "Instruction queue depth of the load engine.",
         "1..4096", lambda v: 1 <= v <= 4096, 32),
    _int("queues", "compute_depth", "instructions",
         "Instruction queue depth of the compute engine (GEMM, ALU, accumulator loads).",
         "1..4096", lambda v: 1 <= v <= 4096, 32),
    _int("queues", "store_depth", "instructions", "Instruction queue depth of the store engine.",
         "1..4096", lambda v: 1 <= v <= 4096, 32),
    _int("queues", "dispatch_cycles", "cycles",
         "Cycles the fetch unit takes to decode and dispatch one instruction.", "0..100",
         lambda v: 0 <= v <= 100, 1),
    # --- clock
    _float("clock", "mhz", "MHz", "Clock frequency; turns cycles into time.", "> 0 and <= 10000",
           lambda v: 0 < v <= 10000),
    # --- instruction set
    _int("isa", "instruction_bits", "bits",
         "Width of every instruction word. Each format's fields, sized from the scratchpad "
         "depths above, must fit in it.", "multiple of 64, 64..1024",
         lambda v: v % 64 == 0 and 64 <= v <= 1024, 256),
    # --- the host CPU the DSA is attached to (for the offload cost model)
    _float("host", "cpu_gmacs", "GMAC/s",
           "int8 multiply-accumulates per second the host CPU sustains on layers the DSA "
           "could take; a region is offloaded only when the DSA is estimated faster.",
           "> 0", lambda v: v > 0, 20.0),
    _float("host", "launch_overhead_us", "us",
           "Host time to start one DSA region (pack inputs, launch, unpack outputs).",
           ">= 0", lambda v: v >= 0, 20.0),
    # --- softmax / LayerNorm / RMSNorm row units (optional; 0 units means none)
    _int("norm", "norm_units", "units",
         "Row units for integer softmax, LayerNorm and RMSNorm over the last axis "
         "(dsa_tvm.layers.intnorm: I-BERT i-exp, table+Newton reciprocal and inverse "
         "square root). 0: the DSA has none and those ops stay on the CPU.", "0..64",
         lambda v: 0 <= v <= 64, 0),
    _int("norm", "norm_elements_per_cycle", "elements/cycle",
         "Row elements one unit takes per cycle in each of its passes over a row "
         "(softmax: max, exp+sum, scale; norms: sums, normalize).", "1..4096",
         lambda v: 1 <= v <= 4096, 16),
    _int("norm", "norm_row_latency_cycles", "cycles",
         "Cycles a unit adds per row beyond its passes (reciprocal or inverse-square-root "
         "table lookup and Newton steps).", "0..100000", lambda v: 0 <= v <= 100000, 24),
    # --- energy (optional; 0 means not modelled). The 16 nm references are [H14] 45 nm figures
    #     x the [SB17] energy factor (dsa_tvm/hw/cost_sources.py), the node of the [area] defaults
    _float("energy", "mac_pj", "pJ",
           f"Energy of one int8 MAC (the multiply and its int32 accumulate; its scratchpad reads "
           f"are sram_byte_pj). 0 for every energy field: not modelled. The 16 nm references "
           f"(the node of the [area] defaults) scale {src.cite('H14')} (45 nm, 0.9 V) by "
           f"{src.cite('SB17')}. 16 nm reference: [H14] 45 nm 8-bit multiply {src.MUL8_PJ:g} "
           f"+ 32-bit add {src.ADD32_PJ:g} = "
           f"{src.MUL8_PJ + src.ADD32_PJ:g} pJ x {src.ENERGY_45_TO_16:.3f} ([SB17] energy, HP "
           f"45 nm 0.9 V -> HP 16 nm 0.8 V) = {src.pj16(src.MUL8_PJ + src.ADD32_PJ):.3f} pJ, "
           f"arithmetic only.", ">= 0", lambda v: v >= 0, 0.0),
    _float("energy", "alu_lane_op_pj", "pJ",
           f"Energy of one int32 vector-lane operation. 16 nm references: a 32-bit add "
           f"{src.ADD32_PJ:g} pJ x {src.ENERGY_45_TO_16:.3f} = {src.pj16(src.ADD32_PJ):.3f} pJ; "
           f"a REQUANT lane (32-bit multiply {src.MUL32_PJ:g} + 4 adds = "
           f"{src.MUL32_PJ + 4 * src.ADD32_PJ:g} pJ) x {src.ENERGY_45_TO_16:.3f} = "
           f"{src.pj16(src.MUL32_PJ + 4 * src.ADD32_PJ):.2f} pJ.", ">= 0",
           lambda v: v >= 0, 0.0),
    _float("energy", "sram_byte_pj", "pJ",
           f"Energy per scratchpad byte read or written. 16 nm references: [H14] 64-bit SRAM "
           f"reads of {src.sram_references()}; a 64 KB bank (log-interpolated between 32 KB and 1 MB) "
           f"{src.pj16(src.sram_read_pj(64) / 8):.2f} pJ/byte.", ">= 0", lambda v: v >= 0, 0.0),
    _float("energy", "dram_byte_pj", "pJ",
           f"Energy per DRAM byte transferred. Reference: [H14] {src.DRAM_64B_PJ[0] / 1e3:g}-"
           f"{src.DRAM_64B_PJ[1] / 1e3:g} nJ per 64-bit access (DDR3 era) = "
           f"{src.DRAM_64B_PJ[0] / 8:g}-{src.DRAM_64B_PJ[1] / 8:g} pJ/byte; set by the "
           f"memory interface, not the logic node, so not scaled (LPDDR4- and HBM-class "
           f"interfaces take several times less).", ">= 0", lambda v: v >= 0, 0.0),
    _float("energy", "table_lookup_pj", "pJ",
           f"Energy of one activation-table lookup (one lane of an ALU LUT step), beside its "
           f"scratchpad bytes; 0 counts it as a vector-lane operation. 16 nm reference: at most "
           f"a 4-byte read of [H14]'s smallest SRAM (8 KB), "
           f"{src.pj16(4 * src.sram_read_pj(8) / 8):.2f} pJ.", ">= 0", lambda v: v >= 0, 0.0),
    # --- area (optional): per-component silicon area at 16 nm, the defaults derived from the
    #     published figures in dsa_tvm/hw/cost_sources.py; dsa_tvm/hw/area.py adds them up
    _float("area", "mac_um2", "um^2",
           f"Silicon area of one int8 MAC of the array (block_in x block_out of them): the "
           f"8-bit multiply and its share of the int32 accumulate (one 32-bit adder), "
           f"arithmetic only. Every [area] default is at one node, {src.NODE}, derived from [H14] "
           f"and [SB17] (see energy.mac_pj), {src.cite('W13', 'J17')}; for comparing designs, "
           f"not for sign-off. Default: [H14] 45 nm "
           f"8-bit multiply {src.MUL8_UM2:g} + 32-bit add {src.ADD32_UM2:g} = "
           f"{src.MAC_45:g} um^2 x {src.AREA_45_TO_16:g} ([SB17] area, 45 -> 16 nm) = "
           f"{src.MAC_45 * src.AREA_45_TO_16:.1f} ~ {src.at16(src.MAC_45):g} um^2.",
           ">= 0", lambda v: v >= 0, src.at16(src.MAC_45)),
    _float("area", "sram_kib_um2", "um^2/KiB",
           f"Silicon area per KiB of on-chip SRAM, for each scratchpad (sram.inp_kib, wgt_kib, "
           f"acc_kib). Default: 8192 bits x {src.BITCELL_UM2:g} um^2 ([W13] 16 nm high-density "
           f"6T bit cell) x {src.SRAM_PERIPHERY:g} (periphery: decoders, sense amplifiers and "
           f"I/O take about half of a small, wide bank; assumed) = {src.SRAM_KIB_UM2:g} um^2.",
           ">= 0", lambda v: v >= 0, src.SRAM_KIB_UM2),
    _float("area", "vector_lane_um2", "um^2",
           f"Silicon area of one int32 vector-ALU lane (vector.lanes of them), sized for "
           f"REQUANT, its widest operation. Default: [H14] 32-bit multiply (64-bit product) "
           f"{src.MUL32_UM2:g} + 4 x 32-bit add {src.ADD32_UM2:g} (bias, rounding, zero point, "
           f"clamp compare) = {src.LANE_45:g} um^2 x {src.AREA_45_TO_16:g} = "
           f"{src.at16(src.LANE_45):g} um^2; shifter and muxes not counted.",
           ">= 0", lambda v: v >= 0, src.at16(src.LANE_45)),
    _float("area", "table_kib_um2", "um^2/KiB",
           "Silicon area per KiB of activation-table storage. A part with table.table_unit = 1 "
           "holds one copy of the table (table_entries int32 entries: 1 KiB) per lookup per "
           "cycle (table_lookups_per_cycle, or vector.lanes when 0): copies are how parallel "
           f"lookups get read ports of their own. Default: as sram_kib_um2 ({src.SRAM_KIB_UM2:g} "
           "um^2); a table in latches or flip-flops is larger.",
           ">= 0", lambda v: v >= 0, src.SRAM_KIB_UM2),
    _float("area", "norm_lane_um2", "um^2",
           f"Silicon area per element per cycle of a [norm] row unit (norm_units x "
           f"norm_elements_per_cycle of them). Default: [H14] 2 x 32-bit multiply "
           f"{src.MUL32_UM2:g} (i-exp's scale and square; the normalize pass's reciprocal and "
           f"gamma) + 4 x 32-bit add {src.ADD32_UM2:g} (row sums, the 64-bit beta add) = "
           f"{src.NORM_LANE_45:g} um^2 x {src.AREA_45_TO_16:g} = "
           f"{src.at16(src.NORM_LANE_45):g} um^2.",
           ">= 0", lambda v: v >= 0, src.at16(src.NORM_LANE_45)),
    _float("area", "norm_unit_um2", "um^2",
           f"Silicon area of each [norm] row unit beside its lanes: the per-row reciprocal or "
           f"inverse square root (table seed and Newton steps, time-shared over "
           f"norm_row_latency_cycles) and the 64-bit row sums. Default: [H14] 32-bit multiply "
           f"{src.MUL32_UM2:g} + 4 x 32-bit add {src.ADD32_UM2:g} = {src.NORM_UNIT_45:g} um^2 x "
           f"{src.AREA_45_TO_16:g} = {src.at16(src.NORM_UNIT_45):g} um^2 (the 16- and 12-entry "
           f"seed tables not counted).", ">= 0", lambda v: v >= 0, src.at16(src.NORM_UNIT_45)),
    _float("area", "overhead_pct", "%",
           f"Control, instruction fetch and queues, DMA, DRAM and host interfaces and wiring, "
           f"as a percentage of the area of the components above. Default: [J17] the TPU's "
           f"datapath (buffers, matrix unit, accumulators, activation) is nearly two-thirds of "
           f"its die, so the rest is (1 - 2/3) / (2/3) = {src.OVERHEAD_PCT:g}% of it.",
           ">= 0", lambda v: v >= 0, src.OVERHEAD_PCT),

    # --- analog in-memory compute (optional; crossbars = 0 means a digital part). The
    #     device model is dsa_tvm/cim: weights programmed once into crossbars, GEMMs on them
    #     computed in the analog domain through DACs and ADCs, everything else digital
    _int("cim", "crossbars", "crossbars",
         "Analog crossbar tiles of the part. 0: a digital part (every GEMM on the MAC array). "
         "> 0: every GEMM whose weights are program constants runs on crossbars the weights "
         "were programmed into once (their DRAM loads disappear); GEMMs of two activations "
         "(attention over a KV cache) stay on the digital array.", "0..1048576",
         lambda v: 0 <= v <= 1 << 20, 0),
    _int("cim", "crossbar_rows", "rows",
         "Rows (word lines, inputs) of one crossbar: the reduction one analog read sums. A "
         "longer reduction is split across crossbars and its partial sums added digitally.",
         "multiple of array.block_in, 16..4096", lambda v: 16 <= v <= 4096, 256),
    _int("cim", "crossbar_cols", "columns",
         "Columns (bit lines, outputs) of one crossbar; a weight takes cells_per_weight of them.",
         "16..4096", lambda v: 16 <= v <= 4096, 256),
    _int("cim", "bits_per_cell", "bits",
         "Weight-magnitude bits one cell (a differential conductance pair, G+ for positive "
         "weights, G- for negative) stores; |w| is split into cells_per_weight slices of this "
         "many bits, each slice in its own column, recombined digitally (shift and add).",
         "1..8, bits_per_cell * cells_per_weight >= 8 (|w| <= 128)", lambda v: 1 <= v <= 8, 8),
    _int("cim", "cells_per_weight", "cells",
         "Cells (columns) per int8 weight; see bits_per_cell.", "1..8",
         lambda v: 1 <= v <= 8, 1),
    _int("cim", "dac_bits", "bits",
         "Input-magnitude bits a DAC applies per read (the sign sets the polarity); an int8 "
         "input takes ceil(8 / dac_bits) reads (bit-serial at 1), recombined digitally. "
         "8: one read with a pulse-width or multi-level input.", "1..8",
         lambda v: 1 <= v <= 8, 8),
    FieldSpec("cim", "input_encoding", str, "",
              "What the DACs drive. \"zero_point\": the input code minus its layer's zero "
              "point (a zero activation drives nothing: after a ReLU, with zero point -128, "
              "the inputs are 0..255 and small), the zero point's share added back digitally "
              "from the exact weights. \"signed\": the raw int8 codes (post-ReLU zeros at "
              "-128 then fill the ADC range with a constant).",
              '"zero_point" or "signed"', lambda v: v in ("zero_point", "signed"),
              "zero_point"),
    _int("cim", "adc_bits", "bits",
         "Resolution of the column ADC. Its full scale is adc_range x the largest column sum "
         "a read can produce (the crossbar rows the mapping uses x largest input slice x "
         "largest weight digit), rounded up to a power of two; the step (LSB) is full scale / "
         "2^(adc_bits - 1), at least 1. Enough bits for a step of 1 reproduce the digital "
         "result exactly.",
         "1..32", lambda v: 1 <= v <= 32, 8),
    _float("cim", "adc_range", "fraction",
           "ADC full scale as a fraction of the largest possible column sum (see adc_bits): "
           "real column sums are far below the worst case, so a part sets its ADC range "
           "smaller and clips the rare outliers.", "> 0 and <= 1", lambda v: 0 < v <= 1, 1.0),
    _int("cim", "cols_per_adc", "columns",
         "Columns that share one ADC (converted one after another).",
         "1..crossbar_cols", lambda v: 1 <= v <= 4096, 1),
    FieldSpec("cim", "noise_model", str, "",
              "\"pcm\": the statistical phase-change-memory model of IBM's aihwkit "
              "(PCMLikeNoiseModel, Nandakumar et al., ICECS 2019): programming noise whose "
              "standard deviation is a quadratic polynomial of the target conductance, a drift "
              "exponent nu per device drawn from a conductance-dependent normal (mean about "
              "0.05), and accumulated 1/f read noise growing with log(time); the *_scale "
              "fields multiply each. \"gaussian\": programming noise of prog_noise_scale x "
              "g_max, read noise of read_noise_scale x |g|, every device drifting with "
              "nu = drift_nu x drift_scale.", '"pcm" or "gaussian"',
              lambda v: v in ("pcm", "gaussian"), "pcm"),
    _float("cim", "g_max_us", "uS",
           "Conductance the largest weight digit is programmed to (aihwkit's g_max).",
           "> 0", lambda v: v > 0, 25.0),
    _float("cim", "prog_noise_scale", "",
           "Scale of the programming noise (pcm: of the fitted polynomial; gaussian: its "
           "standard deviation as a fraction of g_max). 0: devices take their target.",
           ">= 0", lambda v: v >= 0, 1.0),
    _float("cim", "read_noise_scale", "",
           "Scale of the read noise (pcm: of the fitted 1/f model; gaussian: standard "
           "deviation as a fraction of each conductance). 0: none.", ">= 0",
           lambda v: v >= 0, 1.0),
    _float("cim", "drift_scale", "", "Scale of the drift exponents. 0: no drift.", ">= 0",
           lambda v: v >= 0, 1.0),
    _float("cim", "drift_nu", "", "Drift exponent of every device under the gaussian model.",
           ">= 0 and <= 1", lambda v: 0 <= v <= 1, 0.05),
    _float("cim", "t_inference_s", "s",
           "Time from programming to inference: conductances drift as (1 + t / t0)^-nu "
           "(t0 = 20 s, aihwkit's first read).", ">= 0", lambda v: v >= 0, 0.0),
    _float("cim", "mvm_noise", "fraction",
           "Additive noise on every column output of every read, standard deviation as a "
           "fraction of the ADC full scale (aihwkit's out_noise). 0: none.", ">= 0",
           lambda v: v >= 0, 0.0),
    _int("cim", "noise_seed", "",
         "Seed of every random draw (programming, drift, read): the same seed gives the same "
         "result.", ">= 0", lambda v: v >= 0, 0),
    # --- mitigations a user switches on and measures
    _int("cim", "reads_per_mvm", "reads",
         "Mitigation: every analog read repeated this many times and the ADC codes averaged "
         "(the per-read noise, mvm_noise, falls by its square root; the time and energy of "
         "the reads grow by it).", "1..64", lambda v: 1 <= v <= 64, 1),
    FieldSpec("cim", "drift_compensation", bool, "",
              "Mitigation (aihwkit's GlobalDriftCompensation): each crossbar is read once "
              "with an all-ones input right after programming and again at inference; its "
              "outputs are scaled digitally by the ratio, undoing the mean drift.",
              "true or false", lambda v: isinstance(v, bool), False),
    FieldSpec("cim", "adc_calibration", bool, "",
              "Mitigation: every column's ADC full scale set from the largest sum it showed on "
              "calibration data (dsa_tvm.sim.cim_arrays.calibrating), instead of adc_range x "
              "the worst case: small columns get a fine step, the clipped outliers are rare.",
              "true or false", lambda v: isinstance(v, bool), False),
    FieldSpec("cim", "bias_correction", bool, "",
              "Mitigation: the mean error of every output column on calibration data (drift, "
              "programming-noise asymmetry, ADC clipping) subtracted digitally.",
              "true or false", lambda v: isinstance(v, bool), False),
    FieldSpec("cim", "digital_layers", str, "",
              "Mitigation: layers (names as the run report prints them, comma-separated) whose "
              "GEMMs stay on the digital array although their weights are constants: the "
              "most sensitive layers kept digital (dsa_tvm.cim_study.sensitivity ranks them).",
              "comma-separated layer names, or empty", lambda v: isinstance(v, str), ""),
    _float("cim", "mvm_ns", "ns",
           "Settling time of one analog read of a crossbar (one input slice on every row).",
           "> 0", lambda v: v > 0, 100.0),
    _float("cim", "adc_ns", "ns", "Time of one ADC conversion.", "> 0", lambda v: v > 0, 1.0),
    _float("cim", "program_row_ns", "ns",
           "Time to program one crossbar row (iterative write and verify). Charged only when "
           "a program's weights do not fit the crossbars and are reprogrammed as they stream "
           "in (time-shared).", ">= 0", lambda v: v >= 0, 1000.0),
    _float("cim", "mvm_pj", "pJ",
           "Energy of one analog read of one crossbar (DAC drivers and array), beside its "
           "ADC conversions. 0: not modelled.", ">= 0", lambda v: v >= 0, 0.0),
    _float("cim", "adc_pj", "pJ", "Energy of one ADC conversion. 0: not modelled.", ">= 0",
           lambda v: v >= 0, 0.0),

)

#: Fields added after programs were first fingerprinted: left out of a description's
#: fingerprint (and of the description programs embed) while they hold their default, so
#: programs compiled before they existed (and the bundled presets' program bytes) stay valid.
FINGERPRINT_OMIT_AT_DEFAULT: frozenset[str] = frozenset(
    {f.key for f in FIELDS if f.section in ("norm", "table", "output", "area", "cim")}
    | {"energy.table_lookup_pj", "dram.int4_weights", "array.dataflow", "array.weight_double_buffer",
       "array.wgt_port_bytes", "array.inp_port_bytes", "array.sparsity"})

SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(f.section for f in FIELDS))
