"""The program cache returns exactly what a fresh compile gives, across timing-only changes.

``lowering.program_cache.TIMING_ONLY`` claims the code generator never reads those
fields except through a schedule choice (which is in the cache key). Each is changed
here on real models; the programs compiled with the cache warm must be byte-identical
to those compiled with it off, and a warm compile must actually hit it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tvm.relax.frontend.onnx import from_onnx

from dsa_tvm.hw.config import load_config, with_overrides
from dsa_tvm.lowering.program_cache import PROGRAMS, TIMING_ONLY, WALKS, program_cache
from dsa_tvm.models.zoo import get_model
from dsa_tvm.pipeline import compile_for_dsa

#: one changed value per timing-only field (name/description are labels)
CHANGES = {
    "bandwidth_bytes_per_cycle": "dram.bandwidth_bytes_per_cycle=4",
    "latency_cycles": "dram.latency_cycles=400",
    "mhz": "clock.mhz=250",
    "cpu_gmacs": "host.cpu_gmacs=200",
    "launch_overhead_us": "host.launch_overhead_us=1",
    "load_depth": "queues.load_depth=4",
    "compute_depth": "queues.compute_depth=4",
    "store_depth": "queues.store_depth=4",
    "dispatch_cycles": "queues.dispatch_cycles=3",
    "alu_latency_cycles": "vector.alu_latency_cycles=9",
    "norm_row_latency_cycles": "norm.norm_row_latency_cycles=60",
    "table_lookups_per_cycle": "table.table_lookups_per_cycle=2",
    "mac_pj": "energy.mac_pj=1.5",
    "alu_lane_op_pj": "energy.alu_lane_op_pj=2",
    "sram_byte_pj": "energy.sram_byte_pj=3",
    "dram_byte_pj": "energy.dram_byte_pj=99",
    "table_lookup_pj": "energy.table_lookup_pj=1",
    "mac_um2": "area.mac_um2=300",
    "sram_kib_um2": "area.sram_kib_um2=2000",
    "vector_lane_um2": "area.vector_lane_um2=1000",
    "table_kib_um2": "area.table_kib_um2=2000",
    "norm_lane_um2": "area.norm_lane_um2=2000",
    "norm_unit_um2": "area.norm_unit_um2=1000",
    "overhead_pct": "area.overhead_pct=25",
}
#: the [cim] fields, changed together on a part with crossbars (the simulator maps the
#: compiled program onto them; the code generator reads none)
CIM_CHANGE = ("cim.crossbars=64", "cim.crossbar_rows=128", "cim.crossbar_cols=64",
              "cim.bits_per_cell=4", "cim.cells_per_weight=2", "cim.dac_bits=2",
              "cim.adc_bits=6", "cim.adc_range=0.5", "cim.cols_per_adc=4",
              'cim.noise_model="gaussian"', "cim.g_max_us=10", "cim.prog_noise_scale=0.1",
              "cim.read_noise_scale=0.1", "cim.drift_scale=2", "cim.drift_nu=0.1",
              "cim.t_inference_s=60", "cim.mvm_noise=0.01", "cim.noise_seed=3",
              "cim.reads_per_mvm=2", "cim.drift_compensation=true",
              "cim.adc_calibration=true", "cim.bias_correction=true", "cim.mvm_ns=50",
              "cim.adc_ns=2", "cim.program_row_ns=10", "cim.mvm_pj=100", "cim.adc_pj=3",
              'cim.digital_layers="dsa_region0.0:conv2d"', 'cim.input_encoding="signed"')
CHANGES.update({a.split(".", 1)[1].split("=")[0]: CIM_CHANGE for a in CIM_CHANGE})


def test_every_timing_only_field_is_exercised():
    assert set(CHANGES) == set(TIMING_ONLY) - {"name", "description"}


def _programs(mod, cfg):
    """Each region's program as bytes, without the compile id (new for every compile)."""
    _, rep = compile_for_dsa(mod, cfg)
    out = []
    for d in rep.regions:
        if d.program is not None:
            meta = {k: v for k, v in d.program.meta.items() if k != "compile"}
            out.append((d.name, replace(d.program, meta=meta).to_bytes(cfg)))
    return out


#: every field on the small CNN; on the bigger models the fields their schedule choices read
#: (depthwise engine, norm and table units), to keep the test short
FIELDS_BY_MODEL = {
    "small_cnn": tuple(CHANGES),
    "mobilenet_v2": ("bandwidth_bytes_per_cycle", "mhz"),
    "transformer_encoder": ("bandwidth_bytes_per_cycle", "norm_row_latency_cycles",
                            "table_lookups_per_cycle"),
}


@pytest.mark.parametrize("model", list(FIELDS_BY_MODEL))
def test_warm_cache_compiles_what_a_cold_compile_does(model):
    mod = from_onnx(get_model(model, quantized=True), keep_params_in_input=False)
    base = load_config("default")
    PROGRAMS.clear()
    WALKS.clear()
    _programs(mod, base)                       # warm it with the base design
    changes = dict.fromkeys(CHANGES[f] for f in FIELDS_BY_MODEL[model])  # in order, once
    for change in changes:
        cfg = with_overrides(base, [change] if isinstance(change, str) else list(change))
        warm = _programs(mod, cfg)
        with program_cache(False):
            cold = _programs(mod, cfg)
        assert [n for n, _ in warm] == [n for n, _ in cold], change
        for (name, w), (_, c) in zip(warm, cold):
            assert w == c, f"{model} {change}: region {name} differs with the cache warm"
    assert PROGRAMS.stats.hits + WALKS.stats.hits > 0


def test_cache_off_neither_reads_nor_fills():
    mod = from_onnx(get_model("small_cnn", quantized=True), keep_params_in_input=False)
    PROGRAMS.clear()
    WALKS.clear()
    with program_cache(False):
        compile_for_dsa(mod, load_config("default"))
    assert len(PROGRAMS) == 0 and len(WALKS) == 0
    assert PROGRAMS.stats.hits == PROGRAMS.stats.misses == 0
