"""Design-space sweeps: the grid, one point against a real run, the outputs, pool and Ray.

A sweep point's figures come from a timing-only simulation of the programs the compile
made; they must equal what running the compiled model through the VM reports for that
design, and obey the physics bounds (no fewer cycles than the MACs need at peak, no
faster than DRAM can move the bytes).
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import tvm
from PIL import Image
from tvm import relax

import dsa_tvm
from dsa_tvm.cli import main
from dsa_tvm.hw.config import load_config
from dsa_tvm.models.quantize import calibration_data
from dsa_tvm.models.zoo import get_model
from dsa_tvm.sweep import Axis, grid, pareto_front, parse_axes, sweep
from dsa_tvm.sweep.evaluate import PointResult
from dsa_tvm.sweep.space import check_axes, config_of

AXES = ["array=8,16", "dram.bandwidth_bytes_per_cycle=4,16"]


@pytest.fixture(scope="module")
def small_sweep():
    return sweep(["small_cnn"], AXES, workers=1, progress=False)


def test_axes_parse_and_grid_order():
    axes = parse_axes(["array=8,16,32", "sram.wgt_kib=64,256"])
    points = grid(axes)
    assert len(points) == 6
    assert points[0].label == "array=8 sram.wgt_kib=64"
    assert points[1].label == "array=8 sram.wgt_kib=256"      # last axis varies fastest
    assert points[0].assignments(axes) == ["array.block_in=8", "array.block_out=8",
                                           "sram.wgt_kib=64"]


@pytest.mark.parametrize("bad, match", [
    (["array"], "expected SECTION.FIELD=V1,V2"),
    (["array="], "expected SECTION.FIELD=V1,V2"),
    (["array=8", "array=16"], "given twice"),
    (["array=8,8"], "repeats a value"),
])
def test_bad_axes_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_axes(bad)


def test_unknown_field_fails_before_compiling():
    with pytest.raises(ValueError, match="dram.bandwith: not a field"):
        check_axes(load_config("default"), parse_axes(["dram.bandwith=4,8"]))


def test_narrow_array_widens_the_instruction_word_and_says_so():
    axes = parse_axes(["array=8"])
    cfg, note = config_of(load_config("default"), axes, grid(axes)[0])
    assert cfg.block_in == cfg.block_out == 8
    assert cfg.instruction_bits > 256 and "instruction_bits raised" in note
    # an axis that sets the width itself is taken as given: the schema's error stands
    axes = parse_axes(["array=8", "isa.instruction_bits=256"])
    with pytest.raises(dsa_tvm.ConfigError, match="instruction_bits"):
        config_of(load_config("default"), axes, grid(axes)[0])


def test_point_equals_a_real_run_and_obeys_physics(small_sweep):
    """The sweep's figures for one design are those of compiling and running the model."""
    res = small_sweep
    assert [r.point for r in res.results] == [p.label for p in grid(parse_axes(AXES))]
    assert not any(r.error for r in res.results)
    point = next(r for r in res.results if r.values == {"array": "16",
                                                         "dram.bandwidth_bytes_per_cycle": "4"})
    axes = parse_axes(AXES)
    cfg, _ = config_of(load_config("default"), axes, next(p for p in grid(axes)
                                                          if p.label == point.point))
    onnx_model = get_model("small_cnn", quantized=True)
    ex = tvm.compile(relax.frontend.onnx.from_onnx(onnx_model, keep_params_in_input=False),
                     target=dsa_tvm.target(cfg))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    (x,) = calibration_data(onnx_model, n=1, seed=5)[0].values()
    vm["main"](tvm.runtime.tensor(x))
    run = dsa_tvm.run_report(vm)
    assert point.cycles == run.total_cycles
    assert point.launches == run.regions
    assert point.dsa_mac_share == pytest.approx(run.dsa_mac_share)
    for r in res.results:
        peak = 256 if r.values["array"] == "16" else 64
        macs = sum(ly["macs"] for ly in r.layers if ly["target"] == "DSA")
        assert r.cycles >= math.ceil(macs / peak)
        bw = float(r.values["dram.bandwidth_bytes_per_cycle"])
        assert r.cycles >= r.dram_bytes / bw
        assert r.latency_us == pytest.approx(r.dsa_us + r.host_us)
        assert r.area_mm2 > 0 and r.energy_uj >= 0


def test_more_bandwidth_is_never_slower_here(small_sweep):
    by = {tuple(r.values.values()): r for r in small_sweep.results}
    for array in ("8", "16"):
        assert by[(array, "16")].cycles <= by[(array, "4")].cycles


def test_outputs_csv_json_png(small_sweep, tmp_path):
    files = small_sweep.write(tmp_path / "out")
    rows = list(csv.DictReader(open(files["csv"])))
    assert len(rows) == 4
    assert {"array", "dram.bandwidth_bytes_per_cycle", "latency_us", "area_mm2", "energy_uj",
            "mac_utilization", "dram_bytes", "compute_bound_layers"} <= set(rows[0])
    doc = json.loads(files["json"].read_text())
    assert doc["axes"]["array"] == ["8", "16"]
    assert len(doc["points"]) == 4 and doc["points"][0]["layers"]
    front = doc["pareto"]["small_cnn"]
    assert front and set(front) <= {r["point"] for r in doc["points"]}
    with Image.open(files["pareto"]) as img:
        assert img.format == "PNG" and img.size[0] > 300
    assert "*" in str(small_sweep)


def test_pareto_front_is_the_non_dominated_set():
    def pr(lat, area):
        return PointResult("m", f"{lat}/{area}", {}, latency_us=lat, area_mm2=area)
    pts = [pr(10, 1), pr(5, 2), pr(5, 3), pr(12, 1), pr(1, 9)]
    assert [p.point for p in pareto_front(pts)] == ["10/1", "5/2", "1/9"]


def test_cache_off_gives_the_same_figures(small_sweep):
    cold = sweep(["small_cnn"], [Axis("dram.bandwidth_bytes_per_cycle", ("4", "16"))],
                 workers=1, cache=False, progress=False)
    warm = {r.point: r.cycles for r in small_sweep.results if r.values["array"] == "16"}
    assert {r.point: r.cycles for r in cold.results} == {
        k.replace("array=16 ", ""): v for k, v in warm.items()}


def test_invalid_point_is_reported_not_fatal():
    res = sweep(["small_cnn"], ["array.dataflow=sideways,matrix-vector"], workers=1,
                progress=False)
    bad, good = res.results
    assert bad.error.startswith("invalid design") and not good.error
    assert "!" in str(res)


def test_process_pool_matches_in_process(small_sweep):
    pooled = sweep(["small_cnn"], AXES, workers=2, progress=False)
    assert [(r.point, r.cycles, r.energy_uj) for r in pooled.results] == [
        (r.point, r.cycles, r.energy_uj) for r in small_sweep.results]


@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time
def test_ray_cluster_matches_in_process(small_sweep):
    import ray  # the test extra installs it

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = sweep(["small_cnn"], AXES, ray_address="auto", progress=False)
    finally:
        ray.shutdown()
    assert [(r.point, r.cycles) for r in on_ray.results] == [
        (r.point, r.cycles) for r in small_sweep.results]


def test_cli(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "small_cnn", "--set", "dram.bandwidth_bytes_per_cycle=8,16",
                 "--workers", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "small_cnn:" in text and (out / "sweep.csv").is_file()
    assert main(["sweep", "small_cnn", "--set", "dram.nope=1", "--out", str(out)]) == 2
    assert "not a field" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["sweep", "small_cnn", "--set", "array=16", "--out",
                 str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_fp32_model_is_refused(tmp_path, capsys):
    import onnx

    path = tmp_path / "fp32.onnx"
    onnx.save(get_model("small_cnn", quantized=False), path)
    assert main(["sweep", str(path), "--set", "array=16", "--workers", "1",
                 "--out", str(tmp_path / "o")]) == 2
    assert "FP32 model" in capsys.readouterr().err


def test_sweep_numbers_are_finite(small_sweep):
    for r in small_sweep.results:
        assert np.isfinite([r.latency_us, r.area_mm2, r.energy_uj, r.mac_utilization]).all()


def test_optuna_search_is_seeded_and_evaluates_distinct_designs():
    axes = ["array=8,16,32", "dram.bandwidth_bytes_per_cycle=4,8,16,32,64"]
    a = sweep(["small_cnn"], axes, workers=1, progress=False, search="optuna", trials=6, seed=3)
    b = sweep(["small_cnn"], axes, workers=1, progress=False, search="optuna", trials=6, seed=3)
    assert [r.point for r in a.results] == [r.point for r in b.results]
    assert len({r.point for r in a.results}) == len(a.results) <= 6
    assert "optuna NSGA-II: 6 trials of 15 designs" in str(a)
    with pytest.raises(ValueError, match="needs --trials"):
        sweep(["small_cnn"], axes, search="optuna")
    with pytest.raises(ValueError, match="grid' or 'optuna"):
        sweep(["small_cnn"], axes, search="random")


def test_optuna_search_in_a_pool_agrees_with_grid_figures(small_sweep):
    res = sweep(["small_cnn"], AXES, workers=2, progress=False, search="optuna", trials=4)
    grid_cycles = {r.point: r.cycles for r in small_sweep.results}
    assert res.results and all(r.cycles == grid_cycles[r.point] for r in res.results)
