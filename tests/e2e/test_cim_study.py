"""Whole models on analog crossbars: a CIM part with noiseless devices and a fine ADC runs a
compiled network bit for bit as the digital part does; the study (``dsa_tvm.cim_study``,
``dsa-tvm cim-sweep``) sweeps ADC bits, noise and drift against the FP32 model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.cim_study.cnn import study_cnn
from dsa_tvm.cim_study.grid import (
    Point,
    format_duration,
    parse_duration,
    parse_mitigations,
    point_config,
    points,
)
from dsa_tvm.cli import main
from dsa_tvm.hw.config import load_config
from dsa_tvm.models.zoo import get_model
from dsa_tvm.pipeline import last_compile_report
from dsa_tvm.runtime import take_launches

EXACT = dict(adc_bits=32, adc_range=1.0, prog_noise_scale=0.0, read_noise_scale=0.0,
             drift_scale=0.0)


def _run(cfg, mod, x):
    with dsa_tvm.options(offload="all"):
        ex = tvm.compile(mod, target=dsa_tvm.target(cfg))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    take_launches()
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    return out, take_launches()


@pytest.mark.parametrize("model", ["small_cnn", "transformer_encoder"])
def test_an_exact_cim_part_runs_a_network_as_the_digital_part(model):
    """Every constant-weight GEMM on crossbars (attention's activation GEMMs digital), the
    network's outputs equal to the digital part's, no weight byte read at run time."""
    qdq = get_model(model, quantized=True)
    mod = from_onnx(qdq, keep_params_in_input=False)
    shape = [d.dim_value for d in qdq.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    want, dig = _run(load_config("default"), mod, x)
    got, cim = _run(load_config("cim-pcm").replace(**EXACT), mod, x)
    np.testing.assert_array_equal(got, want)
    assert sum(len(la.result.cim.analog) for la in cim) > 0
    assert sum(la.result.counters["dram_read_bytes.wgt"] for la in cim) < sum(
        la.result.counters["dram_read_bytes.wgt"] for la in dig)


def test_a_model_beyond_the_crossbars_is_time_shared():
    """One crossbar short: the region's weights stream in and are reprogrammed, the
    outputs do not change, the cycles and weight bytes grow, the report says why."""
    qdq = get_model("transformer_encoder", quantized=True)
    mod = from_onnx(qdq, keep_params_in_input=False)
    roomy = load_config("cim-pcm").replace(**EXACT)
    x = np.random.default_rng(1).standard_normal(
        [d.dim_value for d in qdq.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    want, fits = _run(roomy, mod, x)
    (region,) = [r for r in last_compile_report().regions if r.target == "dsa"]
    need = int(region.reason.split("; ")[-1].split()[0])
    got, shared = _run(roomy.replace(crossbars=need - 1), mod, x)
    np.testing.assert_array_equal(got, want)
    (region,) = [r for r in last_compile_report().regions if r.target == "dsa"]
    assert f"needs {need} crossbars, {need - 1} left: time-shared" in region.reason
    (a,), (b,) = fits, shared
    assert a.result.cim.fits and not b.result.cim.fits
    from dsa_tvm.report import build_report
    assert "none read at run time" in str(build_report(fits, trace=False))
    assert "1 launch(es) time-shared" in str(build_report(shared, trace=False))
    assert b.result.counters["dram_read_bytes.wgt"] > a.result.counters["dram_read_bytes.wgt"]
    assert b.result.cycles > a.result.cycles


def test_regions_fill_the_crossbars_in_order():
    """The first program's weights are placed, the next one's no longer fit beside them."""
    from dsa_tvm.pipeline import CrossbarBudget, RegionDecision
    from dsa_tvm.programs.matmul import matmul_program
    from dsa_tvm.sim.cim_mapping import map_program
    from dsa_tvm.sim.simulator import Simulator

    rng = np.random.default_rng(0)
    probe = load_config("cim-pcm").replace(**EXACT)
    w = rng.integers(-128, 128, (256, 512), dtype=np.int8)
    need = map_program(matmul_program(probe, 4, 256, 512, requant=False, w=w),
                       probe).crossbars_needed
    part = probe.replace(crossbars=need + 1)
    progs = [matmul_program(part, 4, 256, 512, requant=False, name=f"p{k}",
                            w=rng.integers(-128, 128, (256, 512), dtype=np.int8))
             for k in range(2)]
    budget = CrossbarBudget(part, Simulator(part))
    decisions = [RegionDecision(p.name, [], 0, "dsa", "") for p in progs]
    notes = [budget.place(p, d) for p, d in zip(progs, decisions)]
    assert "in use" in notes[0] and "time-shared" in notes[1], notes
    assert map_program(progs[0], part).fits and not map_program(progs[1], part).fits
    assert decisions[1].dsa_cycles > 0


# ------------------------------------------------------------------ the grid
def test_durations_and_mitigations_parse_or_say_what_is_wrong():
    assert parse_duration("1s") == 1 and parse_duration("2.5h") == 9000
    assert parse_duration("1y") == 31_557_600 and parse_duration("3600") == 3600
    assert format_duration(86400) == "1d" and format_duration(1.5) == "1.5s"
    for bad in ("abc", "1q", "-1s", ""):
        with pytest.raises(ValueError, match="is not a time"):
            parse_duration(bad)
    assert parse_mitigations(["adc", "drift", "reads=4"]) == {
        "adc_calibration": True, "drift_compensation": True, "reads_per_mvm": 4}
    for bad in ("adcc", "reads=0", "reads=x", "bias=1"):
        with pytest.raises(ValueError, match="mitigation"):
            parse_mitigations([bad])


def test_axes_grid_sweeps_each_axis_around_the_base():
    pts = points([4, 8], [0.0, 0.05], [1.0, 100.0])
    assert Point(8, 0.0, 1.0) in pts and len(pts) == 4      # the base once
    assert len(points([4, 8], [0.0, 0.05], [1.0, 100.0], "full", mitigated=True)) == 16
    with pytest.raises(ValueError, match="--adc"):
        points([], [0.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        points([8], [float("nan")], [1.0])


def test_point_configs_set_the_noise_model_and_refuse_a_digital_part():
    base = load_config("cim-pcm")
    g = point_config(base, Point(6, 0.02, 86400.0), "gaussian", {})
    assert (g.adc_bits, g.prog_noise_scale, g.read_noise_scale, g.t_inference_s) == (
        6, 0.02, 0.0, 86400.0)
    p = point_config(base, Point(6, 1.0, 0.0, True), "pcm", {"adc_calibration": True})
    assert p.read_noise_scale == 1.0 and p.adc_calibration
    with pytest.raises(ValueError, match="no crossbars"):
        point_config(load_config("default"), Point(6, 0.0, 0.0), "gaussian", {})


# ------------------------------------------------------------------ the study
@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "small_cnn.onnx"
    fp32 = get_model("small_cnn", quantized=False)
    path.write_bytes(fp32.SerializeToString())
    name = fp32.graph.input[0].name
    shape = [d.dim_value for d in fp32.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(3)
    data = [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(5)]
    return study_cnn(path, data, adc=[6, 12], noise=[0.0, 0.1], drift=["0s", "1y"],
                     mitigate=["adc", "drift", "bias"], calibration=3, limit=2, progress=None)


def test_study_measures_every_point_against_fp32(small_study, tmp_path):
    st = small_study
    assert len(st.points) == 2 * 4 and st.inputs == 2
    dig = st.digital.metrics["cosine"]
    assert dig > 0.99
    by = {m.point: m for m in st.points}
    fine = by[Point(12, 0.0, 0.0)].metrics["cosine"]
    assert fine > 0.98 and by[Point(6, 0.0, 0.0)].metrics["cosine"] < fine
    assert by[Point(12, 0.1, 0.0)].metrics["cosine"] < fine
    year, comp = by[Point(12, 0.0, 31_557_600.0)], by[Point(12, 0.0, 31_557_600.0, True)]
    assert comp.metrics["cosine"] > year.metrics["cosine"]
    assert all(m.cycles > 0 and m.energy_uj > 0 for m in st.points)
    assert "digital int8 (default)" in str(st) and "mitigated" in st.table()
    data = json.loads(st.write_json(tmp_path / "s.json").read_text())
    assert len(data["points"]) == 8 and data["digital"]["point"] is None
    png = st.plot(tmp_path / "s.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cim_sweep_cli_errors_name_the_fix(capsys, tmp_path):
    from .test_cli_hostile import one_error_line

    one_error_line(capsys, ["cim-sweep", "efficientnet-lite0", "--drift", "1q"], "duration")
    one_error_line(capsys, ["cim-sweep", "efficientnet-lite0", "--mitigate", "adcc"],
                   "mitigation")
    one_error_line(capsys, ["cim-sweep", "efficientnet-lite0", "--hw", "default"],
                   "no crossbars", "cim-pcm")
    one_error_line(capsys, ["cim-sweep", str(tmp_path / "none.onnx")], "is not a file")
    one_error_line(capsys, ["cim-sweep", "efficientnet-lite0", "--set", "cim.adc_bits=99"],
                   "adc_bits")
    assert main(["cim-sweep", "tiny", "--data", "x"]) == 2


def test_device_conditions_change_at_run_time_as_a_recompile_would():
    """One compile under other noise / ADC / drift gives what a compile for those
    conditions gives; a placement field or a digital program is refused, saying why."""
    from dsa_tvm.runtime import cim_conditions

    qdq = get_model("small_cnn", quantized=True)
    mod = from_onnx(qdq, keep_params_in_input=False)
    x = np.random.default_rng(4).standard_normal(
        [d.dim_value for d in qdq.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    base = load_config("cim-pcm")
    other = base.replace(adc_bits=6, t_inference_s=86400.0, noise_seed=5,
                         drift_compensation=True)
    with dsa_tvm.options(offload="all"):
        vm = relax.VirtualMachine(tvm.compile(mod, target=dsa_tvm.target(base)), tvm.cpu())
        dig = relax.VirtualMachine(tvm.compile(mod, target=dsa_tvm.target("default")),
                                   tvm.cpu())
    want, _ = _run(other, mod, x)
    with cim_conditions(other):
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), want)
    for cond, needle in ((base.replace(crossbars=8), "crossbars would change"),
                         (base.replace(mhz=500.0), "mhz would change")):
        with cim_conditions(cond), pytest.raises(Exception, match=needle):
            vm["main"](tvm.runtime.tensor(x))
    with cim_conditions(other), pytest.raises(Exception, match="has no crossbars"):
        dig["main"](tvm.runtime.tensor(x))


def test_llm_study_scores_perplexity_and_agreement_per_point():
    """The tiny decoder: noiseless crossbars with a fine ADC decode exactly what the
    digital part decodes (the same perplexity and tokens); heavy noise hurts."""
    from dsa_tvm.cim_study.llm import study_llm

    st = study_llm("tiny", hw=load_config("cim-pcm").replace(drift_scale=0.0), adc=[24],
                   noise=[0.0, 0.2], drift=["0s"], tokens=40, new_tokens=3, progress=None)
    quiet, loud = st.points
    assert quiet.metrics == st.digital.metrics, (quiet.metrics, st.digital.metrics)
    assert loud.metrics["perplexity"] > quiet.metrics["perplexity"]
    assert st.reference["perplexity"] > 0 and quiet.cycles > 0 and quiet.energy_uj > 0
    assert "FP32 perplexity" in str(st)


def test_the_most_sensitive_layers_kept_digital(tmp_path):
    """digital=N ranks the analog layers (each kept digital alone) and keeps the worst N on
    the digital array: their GEMMs leave the crossbars, the outputs get closer to FP32."""
    from dsa_tvm.cim_study.cnn import ImageBench
    from dsa_tvm.cim_study.sensitivity import analog_layers, analog_share, sensitivity

    path = tmp_path / "small_cnn.onnx"
    fp32 = get_model("small_cnn", quantized=False)
    path.write_bytes(fp32.SerializeToString())
    shape = [d.dim_value for d in fp32.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(5)
    data = [{fp32.graph.input[0].name: rng.standard_normal(shape).astype(np.float32)}
            for _ in range(4)]
    bench = ImageBench(path, data, calibration=2, limit=2)
    noisy = load_config("cim-pcm").replace(noise_model="gaussian", prog_noise_scale=0.1,
                                           read_noise_scale=0.0, t_inference_s=0.0)
    ranked = sensitivity(bench, noisy)
    assert len(ranked) >= 3 and ranked[0].gain >= ranked[-1].gain
    top = ranked[0].layer
    base = bench.measure(noisy)
    kept = bench.measure(noisy.replace(digital_layers=top))
    assert kept.metrics["cosine"] == pytest.approx(ranked[0].cosine)
    assert kept.metrics["cosine"] > base.metrics["cosine"]
    analog = [ly["name"] for la in bench.last_launches for ly in la.program.meta["layers"]
              if any(ly["first"] <= i <= ly["last"] for i in la.result.cim.analog)]
    assert top not in analog
    bench.measure(noisy, limit=1)                       # every layer analog again
    macs, weights = analog_share(bench.last_launches, [top])
    layers = {ly["name"]: ly for la in bench.last_launches for ly in la.program.meta["layers"]}
    on_xbars = [layers[n] for n in set(analog_layers(bench.last_launches))]
    assert macs == pytest.approx(layers[top]["macs"] / sum(ly["macs"] for ly in on_xbars))
    assert weights == pytest.approx(
        layers[top]["weight_bytes"] / sum(ly["weight_bytes"] for ly in on_xbars))
    assert 0 < macs < 1 and analog_share(bench.last_launches, []) == (0.0, 0.0)
    st = study_cnn(path, data, hw=noisy, adc=[8], noise=[0.1], drift=["0s"],
                   mitigate=["digital=1"], calibration=2, limit=2, progress=None)
    plain, mitigated = st.points
    assert mitigated.metrics["cosine"] > plain.metrics["cosine"]


def test_a_misspelt_digital_layer_is_reported():
    from dsa_tvm.report import build_report

    qdq = get_model("small_cnn", quantized=True)
    mod = from_onnx(qdq, keep_params_in_input=False)
    x = np.zeros([d.dim_value for d in qdq.graph.input[0].type.tensor_type.shape.dim],
                 np.float32)
    _, launches = _run(load_config("cim-pcm").replace(
        digital_layers="dsa_region0.0:conv2d, dsa_region0.0:convv2d"), mod, x)
    rep = build_report(launches, trace=False)
    assert rep.cim_unknown_layers == ["dsa_region0.0:convv2d"]
    assert "which no layer of this run has" in str(rep)
    first = launches[0].program.meta["layers"][0]
    assert not any(first["first"] <= i <= first["last"] for i in launches[0].result.cim.analog)


def test_calibration_survives_many_programs_under_conditions(monkeypatch):
    """Every program keeps its own programmed crossbars under cim_conditions, so a model
    of more programs than a simulator keeps arrays for stays calibrated (bias correction
    changes the result) instead of silently running uncalibrated."""
    import dsa_tvm.sim.simulator as simulator
    from dsa_tvm.cim_study.llm import LlmBench

    monkeypatch.setattr(simulator, "ARRAYS_CACHE_ENTRIES", 1)
    bench = LlmBench("tiny", tokens=24, new_tokens=2)
    assert not bench.digital.wide_down     # the analog views run down_proj's input int8
    assert not bench.digital.wide_mlp      # and the MLP's interior
    noisy = load_config("cim-pcm").replace(adc_bits=24, adc_range=1.0, noise_model="gaussian",
                                           prog_noise_scale=0.05, read_noise_scale=0.0,
                                           t_inference_s=0.0)
    plain = bench.measure(noisy, decode=False).metrics["perplexity"]
    fixed = bench.measure(noisy.replace(bias_correction=True), calibrate=True,
                          decode=False).metrics["perplexity"]
    assert fixed != plain
