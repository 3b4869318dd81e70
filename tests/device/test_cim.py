"""Analog in-memory compute (``dsa_tvm.cim``): a program's constant-weight GEMMs read on
crossbars. Exact when the devices are noiseless and the ADC resolves every sum, seeded
noise otherwise; weights never move; the capacity is real."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.cim.crossbar import Geometry, analog_matmul, effective_weights, weight_digits
from dsa_tvm.cim.devices import DeviceModel
from dsa_tvm.hw.config import ConfigError, load_config
from dsa_tvm.lowering.program_cache import restamp
from dsa_tvm.programs.matmul import MatmulTiling, matmul_program, pad_cols, reference_matmul
from dsa_tvm.sim.cim_arrays import calibrating
from dsa_tvm.sim.cim_mapping import analog_peak_macs_per_cycle, map_program, read_cycles
from dsa_tvm.sim.simulator import Simulator

NOISELESS = dict(prog_noise_scale=0.0, read_noise_scale=0.0, drift_scale=0.0)


def exact_part(**changes):
    """cim-pcm with noiseless devices and an ADC that resolves every column sum."""
    return load_config("cim-pcm").replace(**{"adc_bits": 32, "adc_range": 1.0, **NOISELESS,
                                             **changes})


def _matmul(cfg, m, n, k, seed=0, const_w=True, tiling=None):
    rng = np.random.default_rng(seed)
    x = pad_cols(rng.integers(-128, 128, (m, k), dtype=np.int8), cfg.block_in)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    prog = matmul_program(cfg, m, n, k, requant=False, w=w if const_w else None,
                          tiling=tiling)
    inputs = {"x": x}
    if not const_w:
        from dsa_tvm.programs.matmul import pack_weights
        inputs["w"] = pack_weights(w, cfg).reshape(prog.regions_of("input")[1].shape)
    return prog, inputs, reference_matmul(x, w, None, cfg)


# ------------------------------------------------------------------ exactness
@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 70), kb=st.integers(1, 40),
       cell=st.sampled_from([(8, 1), (4, 2), (2, 4), (1, 8), (3, 3)]),
       dac=st.sampled_from([1, 2, 4, 8]), rows=st.sampled_from([16, 64, 256]),
       seed=st.integers(0, 2**16))
def test_noiseless_crossbars_with_enough_adc_bits_are_bit_exact(m, n, kb, cell, dac, rows,
                                                                seed):
    """Every cell split, DAC slicing and crossbar height reproduces the digital
    accumulators exactly, including reductions split across crossbars and -128 codes."""
    bits, cells = cell
    cfg = exact_part(bits_per_cell=bits, cells_per_weight=cells, dac_bits=dac,
                     crossbar_rows=rows)
    assert Geometry.from_config(cfg).exact()
    prog, inputs, ref = _matmul(cfg, m, n, kb * cfg.block_in - 3, seed)
    res = Simulator(cfg).run(prog, inputs)
    assert res.cim is not None and len(res.cim.analog) > 0
    np.testing.assert_array_equal(res.outputs["out"], ref)


def test_extreme_codes_are_exact():
    """All -128 inputs against all -128 weights: the largest column sum there is."""
    cfg = exact_part()
    geom = Geometry.from_config(cfg)
    x = np.full((1, 1, 3, 2 * geom.rows), -128, np.int8)
    w = np.full((2 * geom.rows, 5), -128, np.int8)
    eff = effective_weights(w[None], geom, DeviceModel.from_config(cfg), 0.0, None)
    got = analog_matmul(x, eff, geom, None)
    assert (got == 2 * geom.rows * 128 * 128).all()


def test_digits_recombine_to_the_magnitude():
    geom = Geometry.from_config(exact_part(bits_per_cell=3, cells_per_weight=3))
    codes = np.arange(-128, 128, dtype=np.int8)
    d = weight_digits(codes, geom)
    mag = sum(d[c].astype(int) << (3 * c) for c in range(3))
    np.testing.assert_array_equal(mag, np.abs(codes.astype(int)))
    assert all(d[c].max() <= geom.weight_digit_max(c) for c in range(3))


def test_a_batch_is_bit_for_bit_its_single_runs():
    cfg = exact_part()
    prog, inputs, _ = _matmul(cfg, 9, 40, 300)
    rng = np.random.default_rng(3)
    xs = rng.integers(-128, 128, (4,) + inputs["x"].shape, dtype=np.int8)
    sim = Simulator(cfg)
    many = sim.run_batch(prog, {"x": xs}).outputs["out"]
    for k in range(4):
        np.testing.assert_array_equal(many[k], sim.run(prog, {"x": xs[k]}).outputs["out"])


# ------------------------------------------------------------------ noise
def _noisy_run(cfg, prog, inputs):
    return Simulator(cfg).run(restamp(prog, cfg), inputs).outputs["out"].astype(np.int64)


def test_same_seed_same_result_other_seed_other_result():
    cfg = load_config("cim-pcm").replace(mvm_noise=0.01)
    prog, inputs, ref = _matmul(cfg, 8, 48, 200)
    a, b = _noisy_run(cfg, prog, inputs), _noisy_run(cfg, prog, inputs)
    c = _noisy_run(cfg.replace(noise_seed=1), prog, inputs)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    a, ref = a.astype(np.float64), ref.astype(np.float64)
    cos = (a * ref).sum() / np.sqrt((a * a).sum() * (ref * ref).sum())
    assert 0.9 < cos < 1.0


def test_error_falls_with_adc_bits_and_rises_with_noise():
    base = exact_part()
    prog, inputs, ref = _matmul(base, 16, 64, 256, seed=5)
    ref = ref.astype(np.int64)

    def err(**changes):
        out = _noisy_run(base.replace(**changes), prog, inputs)
        return float(np.sqrt(np.mean((out - ref) ** 2)))

    adc = [err(adc_bits=b) for b in (6, 10, 14, 18)]
    assert adc[0] > adc[1] > adc[2] > adc[3], adc
    noise = [err(noise_model="gaussian", prog_noise_scale=s) for s in (0.0, 0.01, 0.05)]
    assert noise[0] == 0.0 < noise[1] < noise[2], noise


# ------------------------------------------------------------------ published statistics
def test_pcm_statistics_match_aihwkit_coefficients():
    """Sampled devices against the PCMLikeNoiseModel fit: programming std
    (0.26348 + 1.9650 g + -1.1731 g^2 uS at g_max 25), drift exponent mean and std,
    1/f read noise, drift decay of the mean conductance."""
    model = DeviceModel.from_config(load_config("cim-pcm"))
    rng = np.random.default_rng(0)
    n = 200_000
    for rel in (0.1, 0.5, 1.0):
        g = np.full(n, rel * 25.0)
        prog = model.program(g, rng)
        want_std = 0.26348 + 1.9650 * rel - 1.1731 * rel ** 2
        assert abs(prog.mean() - g[0]) < 0.01 * 25
        assert abs(prog.std() / want_std - 1) < 0.02, (rel, prog.std(), want_std)
        nu = model.drift_exponents(g, rng)
        mu = np.clip(-0.0155 * np.log(rel) + 0.0244, 0.049, 0.1)
        sd = np.clip(-0.0125 * np.log(rel) - 0.0059, 0.008, 0.045)
        assert abs(nu.mean() - mu) < 0.002 and abs(nu.std() / sd - 1) < 0.05, (rel, nu.mean())
        # drift alone (no read noise): mean decay follows E[(1 + t/t0)^-nu]
        drift_only = DeviceModel("pcm", 25.0, 1.0, 0.0, 1.0, 0.05)
        for t in (3600.0, 86400.0 * 365):
            got = drift_only.at_time(g, nu, t, rng).mean() / g[0]
            want = np.mean(((t + 20.0) / 20.0) ** -nu)
            assert abs(got - want) < 1e-9
        # read noise: relative std Q_s sqrt(ln((t + t_read) / 2 t_read)) at t = 20 s
        read = DeviceModel("pcm", 25.0, 0.0, 1.0, 0.0, 0.05).at_time(g, nu, 0.0, rng)
        q_s = min(0.0088 / max(rel ** 0.65, 1e-3), 0.2)
        want = q_s * np.sqrt(np.log((20.0 + 250e-9) / (2 * 250e-9)))
        assert abs(read.std() / g[0] / want - 1) < 0.02


def test_drift_shrinks_outputs_over_time():
    """A year of drift lowers the read conductances by (1 + t/t0)^-nu, nu ~ 0.05-0.1."""
    base = load_config("cim-pcm").replace(adc_bits=32, adc_range=1.0, prog_noise_scale=0.0,
                                          read_noise_scale=0.0)
    prog, inputs, ref = _matmul(base, 8, 32, 128)
    ref = ref.astype(np.float64)
    gain = []
    for t in (0.0, 3600.0, 86400.0 * 365):
        out = _noisy_run(base.replace(t_inference_s=t), prog, inputs)
        gain.append(float((out * ref).sum() / (ref * ref).sum()))
    assert gain[0] == 1.0 and 0.5 < gain[2] < gain[1] < 0.9, gain


# ------------------------------------------------------------------ mapping, timing, capacity
def test_weights_never_move_and_timing_is_the_reads():
    cfg = exact_part()
    digital = load_config("default")
    prog, inputs, _ = _matmul(cfg, 46, 200, 384, tiling=MatmulTiling(46, 13))
    d = Simulator(digital).run(restamp(prog, digital), inputs)
    a = Simulator(cfg).run(prog, inputs)
    wbytes = sum(r.nbytes for r in prog.regions if r.name == "w")
    assert d.counters["dram_read_bytes"] - a.counters["dram_read_bytes"] == wbytes
    assert a.counters["cim.resident_weight_bytes"] == wbytes
    assert a.counters["macs"] == 0 and a.counters["cim.fits"] == 1
    cmap = a.cim
    geom = Geometry.from_config(cfg)
    reads = sum(cmap.reads.values())
    assert reads == 46 * len(cmap.analog) * geom.passes
    gemm_cycles = reads * read_cycles(cfg, 13 * cfg.block_out)
    assert a.cycles >= gemm_cycles
    macs = 46 * 200 * 384
    assert a.cycles >= macs / analog_peak_macs_per_cycle(cfg)


def test_activation_weights_stay_digital():
    """A GEMM whose weights are a program input (attention's K or V) runs on the array."""
    cfg = exact_part()
    prog, inputs, ref = _matmul(cfg, 8, 32, 64, const_w=False)
    res = Simulator(cfg).run(prog, inputs)
    assert res.cim.analog == {} and res.counters["cim.gemms"] == 0
    assert res.counters["macs"] > 0
    np.testing.assert_array_equal(res.outputs["out"], ref)


def test_a_program_too_big_for_the_crossbars_is_time_shared():
    small = exact_part(crossbars=1)
    prog, inputs, ref = _matmul(small, 8, 300, 600)
    big = exact_part()
    cmap = map_program(prog, small)
    assert not cmap.fits and cmap.crossbars_needed > 1 and "NOT fit" in cmap.summary()
    shared = Simulator(small).run(prog, inputs)
    resident = Simulator(big).run(restamp(prog, big), inputs)
    np.testing.assert_array_equal(shared.outputs["out"], ref)
    wbytes = sum(r.nbytes for r in prog.regions if r.name == "w")
    assert (shared.counters["dram_read_bytes"] - resident.counters["dram_read_bytes"]
            == wbytes)
    assert shared.cycles > resident.cycles


@pytest.mark.parametrize("changes,field", [
    (dict(bits_per_cell=2, cells_per_weight=3), "cim.bits_per_cell"),
    (dict(crossbar_rows=40), "cim.crossbar_rows"),
    (dict(cols_per_adc=512), "cim.cols_per_adc"),
    (dict(noise_model="rram"), "cim.noise_model"),
    (dict(adc_range=0.0), "cim.adc_range"),
])
def test_bad_cim_descriptions_name_the_field(changes, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config("cim-pcm").replace(**changes)


# ------------------------------------------------------------------ mitigations
def _normal_matmul(cfg, m=32, n=96, k=512, x_mean=0.0):
    """Weights and inputs shaped like a real layer's (normal codes, not uniform; after a
    ReLU the codes sit near the zero point -128: ``x_mean``)."""
    rng = np.random.default_rng(11)
    w = np.clip(np.rint(rng.normal(0, 30, (n, k))), -127, 127).astype(np.int8)
    prog = matmul_program(cfg, m, n, k, requant=False, w=w)

    def inputs(seed):
        r = np.random.default_rng(1000 + seed)
        x = np.clip(np.rint(r.normal(x_mean, 25, (m, k))), -128, 127).astype(np.int8)
        return {"x": pad_cols(x, cfg.block_in)}
    return prog, w, inputs


def _rel_error(cfg, calibrate=False, seeds=(0, 1)):
    prog, w, inputs = _normal_matmul(cfg)
    sim = Simulator(cfg)
    if calibrate:
        with calibrating():
            for s in range(100, 104):
                sim.run(prog, inputs(s))
    errs = []
    for s in seeds:
        feed = inputs(s)
        ref = reference_matmul(feed["x"], w, None, cfg).astype(np.float64)
        out = sim.run(prog, feed).outputs["out"].astype(np.float64)
        errs.append(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref ** 2)))
    return float(np.mean(errs))


def test_per_column_adc_ranges_from_calibration_beat_the_global_range():
    cfg = load_config("cim-pcm").replace(**NOISELESS)
    plain, tuned = _rel_error(cfg), _rel_error(cfg.replace(adc_calibration=True), True)
    assert tuned < plain / 2, (plain, tuned)


def test_calibrating_an_exact_part_keeps_it_exact():
    """Ranges from calibration never clip what calibration saw and never coarsen a step
    of 1; the mean error of an exact part is 0, so bias correction subtracts nothing."""
    cfg = exact_part(adc_bits=20, adc_calibration=True, bias_correction=True)
    prog, w, inputs = _normal_matmul(cfg)
    sim = Simulator(cfg)
    with calibrating():
        sim.run(prog, inputs(7))
    out = sim.run(prog, inputs(7)).outputs["out"]
    np.testing.assert_array_equal(out, reference_matmul(inputs(7)["x"], w, None, cfg))


def test_drift_compensation_undoes_the_mean_drift():
    year = load_config("cim-pcm").replace(t_inference_s=3.15e7, adc_bits=12)
    plain, comp = _rel_error(year), _rel_error(year.replace(drift_compensation=True))
    assert comp < 0.7 * plain, (plain, comp)


def test_bias_correction_removes_the_mean_error():
    """Post-ReLU codes (mean -100) turn the devices' systematic errors (cells programmed
    to 0 read slightly positive) into a per-column offset that calibration measures."""
    cfg = load_config("cim-pcm").replace(adc_bits=14)
    prog, w, inputs = _normal_matmul(cfg, x_mean=-100.0)

    def mean_error(part, calibrate):
        sim, prog_here = Simulator(part), restamp(prog, part)
        if calibrate:
            with calibrating():
                for s in range(100, 108):
                    sim.run(prog_here, inputs(s))
        feed = inputs(0)
        ref = reference_matmul(feed["x"], w, None, part).astype(np.float64)
        return np.abs((sim.run(prog_here, feed).outputs["out"] - ref).mean(axis=0)).mean()

    assert mean_error(cfg.replace(bias_correction=True), True) < 0.5 * mean_error(cfg, False)


def test_averaging_reads_cuts_read_noise_and_costs_time():
    cfg = load_config("cim-pcm").replace(**NOISELESS, adc_bits=12, mvm_noise=0.02)
    one, eight = _rel_error(cfg), _rel_error(cfg.replace(reads_per_mvm=8))
    assert eight < 0.6 * one, (one, eight)
    prog, _, inputs = _normal_matmul(cfg)
    a = Simulator(cfg).run(prog, inputs(0))
    eight_reads = cfg.replace(reads_per_mvm=8)
    b = Simulator(eight_reads).run(restamp(prog, eight_reads), inputs(0))
    assert b.counters["cim.crossbar_reads"] == 8 * a.counters["cim.crossbar_reads"]
    assert b.cycles > 4 * a.cycles


@settings(max_examples=40, deadline=None)
@given(blocks=st.lists(st.tuples(st.integers(1, 1100), st.integers(1, 700)), min_size=1,
                       max_size=30),
       cells=st.sampled_from([1, 2]))
def test_packing_is_between_the_area_bound_and_one_crossbar_set_per_block(blocks, cells):
    geom = Geometry.from_config(load_config("cim-pcm").replace(bits_per_cell=8 // cells * 1,
                                                               cells_per_weight=cells))
    packed = geom.pack(blocks)
    area = sum(k * n * cells for k, n in blocks) / (geom.rows * geom.cols)
    assert np.ceil(area - 1e-9) <= packed <= sum(geom.crossbars_for(k, n) for k, n in blocks)


@settings(max_examples=25, deadline=None)
@given(zp=st.integers(-128, 127), k=st.integers(1, 700), seed=st.integers(0, 2**16))
def test_zero_point_inputs_are_exact_with_enough_bits(zp, k, seed):
    """The DACs drive x - zero point (magnitudes up to 255) and the zero point's share
    comes back digitally: still the exact product."""
    cfg = exact_part()
    geom = Geometry.from_config(cfg)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 2, 5, k), dtype=np.int8)
    w = rng.integers(-128, 128, (2, k, 7), dtype=np.int8)
    eff = effective_weights(w, geom, DeviceModel.from_config(cfg), 0.0, None)
    got = analog_matmul(x, eff, geom, None, zero_point=zp,
                        colsum=w.astype(np.float64).sum(axis=1))
    want = np.matmul(x.astype(np.int64), w.astype(np.int64))
    np.testing.assert_array_equal(got, want)


def test_zero_point_encoding_keeps_post_relu_inputs_quiet():
    """Post-ReLU codes (zero point -128): as raw codes every zero activation drives -128
    through noisy cells; as x - zero point it drives nothing. Same devices, same exact ADC:
    several times less error."""
    rng = np.random.default_rng(2)
    x = np.clip(np.rint(rng.exponential(20, (1, 1, 64, 512)) - 128), -128, 127).astype(np.int8)
    w = np.clip(np.rint(rng.normal(0, 30, (1, 512, 64))), -127, 127).astype(np.int8)
    want = np.matmul(x.astype(np.float64), w.astype(np.float64))
    useful = want - (-128) * w.astype(np.float64).sum(axis=1)[None, :, None, :]
    errs = {}
    for enc in ("signed", "zero_point"):
        cfg = exact_part(noise_model="gaussian", prog_noise_scale=0.02, input_encoding=enc)
        geom = Geometry.from_config(cfg)
        eff = effective_weights(w, geom, DeviceModel.from_config(cfg), 0.0,
                                np.random.default_rng(0))
        zp = -128 if enc == "zero_point" else 0
        got = analog_matmul(x, eff, geom, None, zero_point=zp,
                            colsum=w.astype(np.float64).sum(axis=1))
        errs[enc] = float(np.sqrt(np.mean((got - want) ** 2) / np.mean(useful ** 2)))
    assert errs["zero_point"] < errs["signed"] / 3, errs
