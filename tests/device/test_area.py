"""The [area] model: each component term follows its count in the description, every cost
is a field of the description, and the defaults are the documented derivations."""

from __future__ import annotations

import pytest

from dsa_tvm.hw import cost_sources as src
from dsa_tvm.hw.area import area_breakdown, area_mm2
from dsa_tvm.hw.config import ConfigError, config_from_dict, load_config, with_overrides
from dsa_tvm.hw.schema import FIELDS

from .harness import PRESETS

AREA_FIELDS = [f for f in FIELDS if f.section == "area"]
COMPONENTS = ("mac_array", "inp_sram", "wgt_sram", "acc_sram", "vector", "table", "norm")


@pytest.mark.parametrize("name", PRESETS)
def test_area_is_the_sum_of_the_breakdown(name):
    cfg = load_config(name)
    parts = area_breakdown(cfg)
    assert set(parts) == set(COMPONENTS) | {"overhead"}
    assert all(v >= 0 for v in parts.values())
    assert area_mm2(cfg) == sum(parts.values()) == cfg.area_mm2
    assert parts["overhead"] == pytest.approx(
        sum(parts[c] for c in COMPONENTS) * cfg.overhead_pct / 100)


def test_doubling_the_weight_scratchpad_doubles_its_term_only():
    cfg = load_config("default")
    big = cfg.replace(wgt_kib=2 * cfg.wgt_kib)
    a, b = area_breakdown(cfg), area_breakdown(big)
    assert b["wgt_sram"] == 2 * a["wgt_sram"]
    for c in COMPONENTS:
        if c != "wgt_sram":
            assert b[c] == a[c], c
    assert area_mm2(big) > area_mm2(cfg)


def test_mac_array_area_follows_the_array_size():
    cfg = load_config("default").replace(block_in=16, block_out=16)
    big = cfg.replace(block_in=32, block_out=32)
    assert area_breakdown(big)["mac_array"] == 4 * area_breakdown(cfg)["mac_array"]
    assert area_breakdown(cfg)["mac_array"] == 16 * 16 * cfg.mac_um2 / 1e6


def test_optional_units_cost_nothing_when_absent():
    cfg = load_config("default")
    assert cfg.table_unit == 1 and cfg.norm_units == 1
    bare = cfg.replace(table_unit=0, norm_units=0)
    assert area_breakdown(bare)["table"] == 0 and area_breakdown(bare)["norm"] == 0
    # one 1 KiB table copy per lookup per cycle (0 lookups/cycle: one per vector lane)
    assert area_breakdown(cfg)["table"] == cfg.lanes * cfg.table_kib_um2 / 1e6
    two = cfg.replace(table_lookups_per_cycle=2)
    assert area_breakdown(two)["table"] == 2 * cfg.table_kib_um2 / 1e6
    wide = cfg.replace(norm_units=2)
    assert area_breakdown(wide)["norm"] == 2 * area_breakdown(cfg)["norm"]


@pytest.mark.parametrize("spec", AREA_FIELDS, ids=lambda f: f.key)
def test_every_area_field_is_overridable(spec):
    cfg = load_config("default")
    changed = with_overrides(cfg, [f"{spec.key}=100"])
    assert getattr(changed, spec.name) == 100.0
    assert area_mm2(changed) != area_mm2(cfg)
    assert changed.fingerprint != cfg.fingerprint          # a changed cost is a changed part
    assert changed.as_dict()["area"] == {spec.name: 100.0}
    back = changed.replace(**{spec.name: spec.default})
    assert back.fingerprint == cfg.fingerprint and "area" not in back.as_dict()


@pytest.mark.parametrize("spec", AREA_FIELDS, ids=lambda f: f.key)
def test_negative_area_refused_naming_the_field(spec):
    cfg = load_config("default")
    with pytest.raises(ConfigError, match=rf"'{spec.key}' = -1\.0 breaks the rule: >= 0"):
        with_overrides(cfg, [f"{spec.key}=-1"])


def test_area_in_a_description_file():
    d = load_config("edge").as_dict()
    d["area"] = {"mac_um2": 40, "overhead_pct": 0}
    cfg = config_from_dict(d)
    assert cfg.mac_um2 == 40.0 and area_breakdown(cfg)["overhead"] == 0
    with pytest.raises(ConfigError, match="unknown field 'gates' in \\[area\\]"):
        config_from_dict({**d, "area": {"gates": 1}})


def test_defaults_keep_preset_fingerprints():
    """The [area] fields at their defaults stay out of the fingerprint and of as_dict, so
    programs compiled before they existed still load."""
    for name in PRESETS:
        cfg = load_config(name)
        assert "area" not in cfg.as_dict()
        assert cfg.replace(mac_um2=src.at16(src.MAC_45)).fingerprint == cfg.fingerprint


def test_presets_order_by_area():
    edge, default, large = (area_mm2(load_config(n)) for n in ("edge", "default", "large"))
    assert edge < default < large


def test_defaults_are_the_documented_derivations():
    """Source figure x scaling factor = default, as docs/hardware.md writes it out."""
    defaults = {f.name: f.default for f in AREA_FIELDS}
    assert defaults == {
        "mac_um2": round((282 + 137) * 0.19),                   # 79.6
        "sram_kib_um2": round(8192 * 0.07 * 2),                 # 1146.9
        "vector_lane_um2": round((3495 + 4 * 137) * 0.19),      # 768.2
        "table_kib_um2": round(8192 * 0.07 * 2),
        "norm_lane_um2": round((2 * 3495 + 4 * 137) * 0.19),    # 1432.2
        "norm_unit_um2": round((3495 + 4 * 137) * 0.19),
        "overhead_pct": 50.0,
    }
    # Stillmaker & Baas energy polynomials, HP 45 nm at 0.9 V -> HP 16 nm at 0.8 V
    assert src.ENERGY_45_TO_16 == pytest.approx(0.172, abs=5e-4)
    for f in AREA_FIELDS:                      # each doc states its default and the node
        assert f"{f.default:g}" in f.doc, f.key
    assert "16 nm" in AREA_FIELDS[0].doc and "ISSCC 2014" in " ".join(f.doc for f in FIELDS)
