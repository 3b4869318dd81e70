"""Hardware descriptions: presets, derived quantities, validation errors, user files."""

from __future__ import annotations

import copy
import math

import pytest

from dsa_tvm.hw.config import (
    ConfigError,
    HardwareConfig,
    config_from_dict,
    load_config,
    preset_names,
    presets_dir,
)
from dsa_tvm.hw.schema import FIELDS

from .harness import PRESETS

# What the bundled TOML files say, restated here on purpose (the tests' ground truth).
EXPECTED = {
    "default": dict(block_in=16, block_out=16, inp_kib=64, wgt_kib=256, acc_kib=128,
                    bandwidth_bytes_per_cycle=16.0, latency_cycles=100, lanes=64,
                    alu_latency_cycles=4, mhz=1000.0, load_depth=32, size_mib=1024,
                    dispatch_cycles=1, instruction_bits=256),
    "edge": dict(block_in=8, block_out=8, inp_kib=16, wgt_kib=32, acc_kib=16,
                 bandwidth_bytes_per_cycle=4.0, latency_cycles=60, lanes=4,
                 alu_latency_cycles=3, mhz=400.0, load_depth=8, size_mib=1024,
                 dispatch_cycles=1, instruction_bits=256),
    "large": dict(block_in=32, block_out=32, inp_kib=256, wgt_kib=1024, acc_kib=512,
                  bandwidth_bytes_per_cycle=64.0, latency_cycles=200, lanes=32,
                  alu_latency_cycles=6, mhz=1400.0, load_depth=64, size_mib=4096,
                  dispatch_cycles=1, instruction_bits=256),
}



def _key(section: str, field: str) -> str:
    """How errors name a field: 'section.field', or just 'field' at the top level."""
    return f"{section}.{field}" if section else field

def test_bundled_presets_are_listed():
    assert set(PRESETS) <= set(preset_names())
    assert (presets_dir() / "default.toml").is_file()


@pytest.mark.parametrize("name", sorted(set(preset_names()) | set(PRESETS)))
def test_every_preset_loads(name):
    cfg = load_config(name)
    assert isinstance(cfg, HardwareConfig)
    assert cfg.name == name
    for f in FIELDS:                       # every schema field is present and valid
        assert f.name in cfg.values
        assert f.check(cfg.values[f.name]), f.key


@pytest.mark.parametrize("name", PRESETS)
def test_preset_raw_fields(name):
    cfg = load_config(name)
    for k, v in EXPECTED[name].items():
        got = getattr(cfg, k)
        assert got == v and type(got) is type(v), k


@pytest.mark.parametrize("name", PRESETS)
def test_derived_quantities(name):
    cfg = load_config(name)
    e = EXPECTED[name]
    bi, bo = e["block_in"], e["block_out"]
    assert cfg.inp_depth == e["inp_kib"] * 1024 // bi
    assert cfg.wgt_depth == e["wgt_kib"] * 1024 // (bi * bo)
    assert cfg.acc_depth == e["acc_kib"] * 1024 // (4 * bo)
    assert cfg.peak_macs_per_cycle == bi * bo
    assert cfg.peak_gops == pytest.approx(2 * bi * bo * e["mhz"] / 1000)
    lanes = e["lanes"]
    assert cfg.alu_cycles_per_row == (bo / lanes if lanes > bo else math.ceil(bo / lanes))
    assert cfg.gemm_fill_drain_cycles == bi + bo
    assert cfg.dram_bytes == e["size_mib"] << 20
    assert [cfg.element_bytes(b) for b in range(4)] == [bi, bi * bo, 4 * bo, bo]
    for b in range(4):
        assert cfg.dram_align % cfg.element_bytes(b) == 0


def test_derived_quantities_hand_numbers():
    d, e, lg = (load_config(n) for n in PRESETS)
    assert (d.inp_depth, d.wgt_depth, d.acc_depth) == (4096, 1024, 2048)
    assert (e.inp_depth, e.wgt_depth, e.acc_depth) == (2048, 512, 512)
    assert (lg.inp_depth, lg.wgt_depth, lg.acc_depth) == (8192, 1024, 4096)
    assert (d.peak_macs_per_cycle, e.peak_macs_per_cycle, lg.peak_macs_per_cycle) == (256, 64, 1024)
    assert d.peak_gops == pytest.approx(512.0)
    assert e.peak_gops == pytest.approx(51.2)
    assert lg.peak_gops == pytest.approx(2867.2)
    assert e.alu_cycles_per_row == 2
    assert d.alu_cycles_per_row == 0.25     # 64 lanes: 4 accumulator rows per cycle
    assert d.energy_modelled


def test_fingerprint_is_stable_and_distinguishes_configs():
    a, b = load_config("default"), load_config("default")
    assert a is not b
    assert isinstance(a.fingerprint, bytes) and len(a.fingerprint) == 16
    assert a.fingerprint == b.fingerprint
    assert a == b and hash(a) == hash(b)
    fps = {load_config(n).fingerprint for n in PRESETS}
    assert len(fps) == len(PRESETS)
    # a config built from the same description elsewhere has the same fingerprint
    assert config_from_dict(a.as_dict(), source="elsewhere").fingerprint == a.fingerprint


@pytest.mark.parametrize("field,value", [
    ("block_in", 32), ("latency_cycles", 101), ("bandwidth_bytes_per_cycle", 8.0),
    ("lanes", 8), ("mhz", 999.0), ("compute_depth", 31), ("dispatch_cycles", 2),
    ("name", "other"), ("description", "changed"), ("dram_byte_pj", 41.0),
    ("instruction_bits", 512), ("size_mib", 2048),
])
def test_fingerprint_changes_with_any_field(field, value):
    base = load_config("default")
    changed = base.replace(**{field: value})
    assert getattr(changed, field) == value
    assert changed.fingerprint != base.fingerprint
    assert changed != base
    # and changing it back restores it
    assert changed.replace(**{field: getattr(base, field)}).fingerprint == base.fingerprint


def test_replace_returns_new_validated_config():
    base = load_config("default")
    cfg = base.replace(block_in=32, block_out=32, lanes=8)
    assert (cfg.block_in, cfg.block_out, cfg.lanes) == (32, 32, 8)
    assert cfg.inp_depth == 64 * 1024 // 32
    assert cfg.alu_cycles_per_row == 4
    assert base.block_in == 16                          # the original is untouched
    with pytest.raises(ConfigError, match="unknown hardware field 'nope'"):
        base.replace(nope=1)
    with pytest.raises(ConfigError, match=r"array\.block_in.*power of two"):
        base.replace(block_in=12)
    # an int for a float field is accepted and coerced
    assert base.replace(mhz=500).mhz == 500.0
    assert isinstance(base.replace(mhz=500).mhz, float)


def test_config_is_immutable():
    cfg = load_config("default")
    with pytest.raises(AttributeError):          # dataclasses.FrozenInstanceError
        cfg.block_in = 32


def test_config_values_are_read_only():
    cfg = load_config("default")
    try:
        cfg.values["block_in"] = 12             # not a valid block_in
    except TypeError:
        return                                   # a read-only mapping: fine
    assert cfg.as_dict()["array"]["block_in"] == cfg.block_in


def test_as_dict_round_trip():
    for n in PRESETS:
        cfg = load_config(n)
        d = cfg.as_dict()
        assert set(d) >= {"name", "array", "sram", "dram", "vector", "queues", "clock", "isa"}
        assert d["array"]["block_in"] == cfg.block_in
        assert config_from_dict(d) == cfg


def test_load_config_accepts_config_and_none():
    cfg = load_config("edge")
    assert load_config(cfg) is cfg
    assert load_config(None).name == "default"


# ----------------------------------------------------------------------------- errors

def _desc():
    return copy.deepcopy(load_config("default").as_dict())


def _err(d, named_source: bool = True) -> str:
    with pytest.raises(ConfigError) as ei:
        config_from_dict(d, source="test.toml")
    msg = str(ei.value)
    if named_source:
        assert msg.startswith("test.toml: "), msg
    return msg


def test_unknown_field():
    d = _desc()
    d["array"]["block_inn"] = 16
    msg = _err(d)
    assert "unknown field 'block_inn'" in msg and "[array]" in msg


def test_unknown_top_level_field():
    d = _desc()
    d["frequency"] = 3
    msg = _err(d)
    assert "unknown field 'frequency'" in msg and "top level" in msg


def test_unknown_section():
    d = _desc()
    d["cache"] = {"kib": 1}
    msg = _err(d)
    assert "unknown section [cache]" in msg
    assert "array" in msg                                     # lists the known ones


@pytest.mark.parametrize("section,field", [("array", "block_in"), ("array", "block_out"),
                                           ("sram", "acc_kib"), ("dram", "latency_cycles"),
                                           ("clock", "mhz"), ("vector", "lanes"), ("", "name")])
def test_missing_required_field(section, field):
    d = _desc()
    if section:
        del d[section][field]
    else:
        del d[field]
    msg = _err(d)
    assert "missing required field" in msg and f"'{_key(section, field)}'" in msg


def test_missing_optional_field_takes_default():
    d = _desc()
    del d["queues"]["dispatch_cycles"]
    del d["energy"]
    cfg = config_from_dict(d)
    assert cfg.dispatch_cycles == 1
    assert cfg.mac_pj == 0.0 and not cfg.energy_modelled


@pytest.mark.parametrize("section,field,value,typename", [
    ("array", "block_in", "16", "int"),
    ("array", "block_in", 16.0, "int"),
    ("array", "block_in", True, "int"),
    ("dram", "bandwidth_bytes_per_cycle", "fast", "float"),
    ("dram", "bandwidth_bytes_per_cycle", True, "float"),
    ("array", "input_dtype", 8, "str"),
])
def test_wrong_type(section, field, value, typename):
    d = _desc()
    d[section][field] = value
    msg = _err(d, named_source=False)   # see test_wrong_type_names_the_source below
    assert f"'{_key(section, field)}'" in msg and f"must be {typename}" in msg
    assert repr(value) in msg


def test_wrong_type_names_the_source(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text(to_toml({**_desc(), "array": {**_desc()["array"], "block_in": "16"}}))
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert "'array.block_in'" in str(ei.value)
    assert str(path) in str(ei.value)


@pytest.mark.parametrize("section,field,value,rule", [
    ("array", "block_in", 12, "power of two, 2..256"),
    ("array", "block_out", 512, "power of two, 2..256"),
    ("array", "block_in", 1, "power of two, 2..256"),
    ("array", "acc_dtype", "int16", 'must be "int32"'),
    ("sram", "inp_kib", 0, "1..65536"),
    ("dram", "bandwidth_bytes_per_cycle", 0.0, "> 0"),
    ("dram", "latency_cycles", -1, "0..100000"),
    ("vector", "lanes", 3, "power of two"),
    ("queues", "compute_depth", 0, "1..4096"),
    ("clock", "mhz", -5.0, "> 0"),
    ("isa", "instruction_bits", 100, "multiple of 64"),
    ("", "name", "", "non-empty"),
])
def test_rule_violation(section, field, value, rule):
    d = _desc()
    if section:
        d[section][field] = value
    else:
        d[field] = value
    msg = _err(d)
    assert f"field '{_key(section, field)}' = {value!r} breaks the rule" in msg
    assert rule in msg


def test_dot_lanes_never_beat_the_array():
    """lanes x products a step stay within the array's peak (the compute bound holds), also
    when a sweep narrows the array under a wide vector unit; a non-power of two is refused."""
    cfg = load_config("default")
    assert cfg.mac8_ways == 4 and cfg.dot_ways * cfg.lanes == cfg.peak_macs_per_cycle
    assert cfg.replace(mac8_ways=8).dot_ways == 4
    assert cfg.replace(block_in=8, block_out=8, instruction_bits=512).dot_ways == 1
    d = _desc()
    for bad in (0, 3, 1024):
        d["vector"]["mac8_ways"] = bad
        assert f"'vector.mac8_ways' = {bad}" in _err(d) and "power of two, 1..256" in _err(d)


def test_lanes_beyond_the_array_refused():
    """A vector unit wider than the MAC array would beat the compute bound every layer's
    self-check assumes."""
    d = _desc()
    d["vector"]["lanes"] = 512
    msg = _err(d)
    assert "'vector.lanes' = 512" in msg and "at most array.block_in * array.block_out (256)" in msg


def test_lanes_wider_than_a_row_run_several_steps_per_cycle():
    """lanes > block_out: lanes / block_out ALU steps per cycle, rounded up per instruction."""
    cfg = load_config("default").replace(lanes=64)
    assert cfg.alu_cycles_per_row == 0.25
    assert [cfg.alu_step_cycles(n) for n in (1, 4, 5, 100)] == [1, 1, 2, 25]
    base = load_config("default").replace(lanes=16)
    assert [base.alu_step_cycles(n) for n in (1, 5)] == [1, 5]
    assert base.replace(lanes=4).alu_step_cycles(5) == 20


def test_weight_scratchpad_not_whole_tiles():
    d = _desc()
    d["array"].update(block_in=256, block_out=256, )
    d["vector"]["lanes"] = 16
    d["sram"]["wgt_kib"] = 1                   # 1 KiB < one 64 KiB tile
    msg = _err(d)
    assert "'sram.wgt_kib' = 1" in msg and "whole number" in msg


def test_sram_too_big_for_instruction_bits():
    d = _desc()
    d["sram"]["inp_kib"] = 65536               # 4 Mi rows: 22 address bits
    msg = _err(d)
    assert "'isa.instruction_bits' = 256" in msg
    assert "GEMM format needs" in msg and "more than 256" in msg
    d["isa"]["instruction_bits"] = 512         # the same SRAM fits wider instructions
    cfg = config_from_dict(d)
    assert cfg.inp_depth == 1 << 22


def test_instruction_bits_too_small_for_presets():
    d = _desc()
    d["isa"]["instruction_bits"] = 192
    msg = _err(d)
    assert "'isa.instruction_bits' = 192" in msg and "needs 238 bits" in msg


# ----------------------------------------------------------------------------- files

def _toml_value(v) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


def to_toml(desc: dict) -> str:
    top = [f"{k} = {_toml_value(v)}" for k, v in desc.items() if not isinstance(v, dict)]
    lines = top[:]
    for k, v in desc.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines += [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def test_load_user_toml(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("""
name = "mine"
[array]
block_in = 8
block_out = 16
[sram]
inp_kib = 8
wgt_kib = 16
acc_kib = 8
[dram]
bandwidth_bytes_per_cycle = 2
latency_cycles = 10
[vector]
lanes = 4
[clock]
mhz = 250
""")
    cfg = load_config(path)
    assert cfg.name == "mine" and cfg.source == str(path)
    assert (cfg.block_in, cfg.block_out) == (8, 16)
    assert cfg.bandwidth_bytes_per_cycle == 2.0 and isinstance(cfg.bandwidth_bytes_per_cycle, float)
    assert cfg.inp_depth == 1024 and cfg.wgt_depth == 128 and cfg.acc_depth == 128
    assert cfg.alu_cycles_per_row == 4
    # defaults for everything optional
    assert (cfg.load_depth, cfg.dispatch_cycles, cfg.instruction_bits, cfg.size_mib) == (
        32, 1, 256, 1024)
    assert load_config(str(path)) == cfg


def test_user_toml_equal_to_preset(tmp_path):
    cfg = load_config("large")
    path = tmp_path / "copy.toml"
    path.write_text(to_toml(cfg.as_dict()))
    assert load_config(path) == cfg
    assert load_config(path).fingerprint == cfg.fingerprint


def test_user_toml_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\n[array]\nblock_in = 12\n')
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert str(path) in str(ei.value) and "block_in" in str(ei.value)
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n[array\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError) as ei:
        load_config("no-such-part")
    msg = str(ei.value)
    assert "no-such-part" in msg and "default" in msg and "edge" in msg


@pytest.mark.parametrize("preset", ["default", "edge", "large"])
def test_to_toml_reads_back_as_the_same_description(preset, tmp_path):
    """A design saved with to_toml (a sweep's pick) loads back field for field, with a name
    that needs escaping and optional fields away from their defaults."""
    from dsa_tvm.hw.config import with_overrides

    cfg = with_overrides(load_config(preset), ['name=my "pick" \\ 1', "area.mac_um2=99.5",
                                               "array.dataflow=weight-stationary"])
    path = tmp_path / "pick.toml"
    path.write_text(cfg.to_toml())
    back = load_config(path)
    assert back.fingerprint == cfg.fingerprint and back.values == cfg.values
