"""The grouped dense (``layers.ir.GroupedDense``, GGUF Q4_1's per-group grid): the grid
found in real weights, the integer layer against float math, the device bit-exact against
the integer reference on every preset, the physics bounds, and what stays on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsa_tvm.layers import ir as L
from dsa_tvm.layers.checks import violations
from dsa_tvm.layers.group_grid import FACTOR_MAX, find_grid, group_grid, grouped_dense
from dsa_tvm.lowering.region import compile_region, lowering_supports
from tir_schedules.kinds import run_layer

from .test_lowering import CFGS, check, region


def _q4_1(rng, n: int, k: int, group: int) -> np.ndarray:
    """Weights on a Q4_1 grid (fp16 steps and minima, as GGUF stores them)."""
    ng = -(-k // group)
    d = rng.uniform(0.001, 0.02, (n, ng)).astype(np.float16).astype(np.float64)
    lo = (-d * rng.uniform(0, 15, (n, ng))).astype(np.float16).astype(np.float64)
    q = rng.integers(0, 16, (n, ng * group))
    q[:, ::group] = 0                      # every group spans its whole grid
    q[:, 1::group] = 15
    w = np.repeat(d, group, 1) * q + np.repeat(lo, group, 1)
    return w[:, :k]


def _float_output(ly: L.GroupedDense, x: np.ndarray, w: np.ndarray, bias: np.ndarray):
    """The layer's real output for int8 ``x``, clamped to the output's codes."""
    t, y = ly.input, ly.output
    ref = ((x.astype(np.float64) - t.zero_point) * t.scale) @ w.T + bias
    lo, hi = ly.requant.clip
    return np.clip(ref / y.scale + y.zero_point, lo, hi)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 9), k=st.integers(1, 100), group=st.sampled_from([1, 8, 32, 33]),
       seed=st.integers(0, 2**31))
def test_a_q4_1_grid_is_found_exactly(n, k, group, seed):
    """Weights on a grid of that form come back exactly (codes, steps, offsets), partial
    last group included; the codes are centred int4."""
    w = _q4_1(np.random.default_rng(seed), n, k, group)
    g = group_grid(w, group)
    np.testing.assert_allclose(g.values(), w, rtol=0, atol=1e-12)
    assert g.codes.dtype == np.int8 and g.codes.min() >= -8 and g.codes.max() <= 7


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 6), groups=st.integers(1, 4), lo=st.integers(0, 8),
       span=st.integers(1, 15), zero=st.integers(0, 15), seed=st.integers(0, 2**31))
def test_a_grid_the_weights_are_already_on_is_kept(n, groups, lo, span, zero, seed):
    """A group whose codes use only part of a 4-bit grid (GGUF Q4_0's symmetric ``d (q -
    8)``, an integer zero point's ``d (q - z)``) keeps that grid exactly, where the
    minimum-to-maximum grid would round it onto a finer one; random weights take the
    minimum-to-maximum grid."""
    rng = np.random.default_rng(seed)
    d = rng.uniform(1e-3, 2.0, (n, groups)).astype(np.float32).astype(np.float64)
    q = rng.integers(lo, min(lo + span, 15) + 1, (n, groups * 32))
    w = (np.repeat(d, 32, 1) * (q - zero)).astype(np.float32).astype(np.float64)
    assert np.abs(group_grid(w, 32).values() - w).max() <= 1e-6 * np.abs(w).max()
    assert find_grid(w.astype(np.float32)) is not None
    r = rng.normal(0, 1, (n, groups * 32))
    blocks = r.reshape(n, groups, 32)
    np.testing.assert_allclose(group_grid(r, 32).step, np.ptp(blocks, axis=2) / 15)


def test_a_constant_group_and_hostile_weights():
    g = group_grid(np.full((2, 4), 0.5), 4)
    assert (g.step == 0).all() and np.allclose(g.values(), 0.5)
    with pytest.raises(ValueError, match="NaN or infinity"):
        group_grid(np.array([[1.0, np.nan]]), 2)
    with pytest.raises(ValueError, match="group 0"):
        group_grid(np.ones((2, 2)), 0)
    with pytest.raises(ValueError, match="non-empty"):
        group_grid(np.ones((0, 4)), 2)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 5), k=st.integers(1, 130), n=st.integers(1, 20),
       group=st.sampled_from([4, 16, 32]), zp=st.integers(-128, 127),
       w_scale=st.sampled_from([1e-6, 0.05, 30.0]), offset=st.sampled_from([0.0, 0.3, -2.0]),
       wide=st.booleans(), seed=st.integers(0, 2**31))
@example(m=2, k=1536, n=3, group=32, zp=0, w_scale=0.05, offset=0.0, wide=False, seed=0)
def test_the_integer_layer_is_the_float_dense_rounded_once(m, k, n, group, zp, w_scale,
                                                          offset, wide, seed):
    """Against float64 math on the grid's own weights: within the rounding the layer
    does (the requantize's half step, each int16 factor's half unit on the group's sums,
    each group's shift and the bias, in accumulator units times the requantize factor);
    on int8 outputs that is at most one step. For any zero point, tiny or huge weights,
    groups all of one sign (``offset``) and saturating outputs; and no intermediate int32
    ever wraps (the reference equals unwrapped int64 math)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(offset, 1.0, (n, k)) * w_scale
    bias = rng.normal(0, 1.0, n) * w_scale
    x_t = L.QTensor("x", (m, k), 0.02, zp)
    y_scale = float(np.abs(w).sum(1).max()) * 0.02 * 128 / (3000 if wide else 100) + 1e-30
    y_t = L.QTensor("y", (m, n), y_scale, 0 if wide else 3, "int16" if wide else "int8")
    grid = group_grid(w, group)
    ly = grouped_dense("gd", x_t, y_t, grid, bias, L.WIDE_CLIP if wide else (-128, 127))
    assert np.abs(ly.scales).max() <= FACTOR_MAX and np.abs(ly.offsets).max() <= FACTOR_MAX
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    x[0] = -128 if m > 1 else x[0]                   # the worst-case input row
    got = run_layer(ly, {"x": x}).astype(np.float64)
    want = _float_output(ly, x, grid.values(), bias)
    xs = x.astype(np.int64)
    rounding = np.zeros((m, n))                  # accumulator units the integers may drift
    for g0 in range(0, k, group):
        p = xs[:, g0:g0 + group] @ ly.weight[:, g0:g0 + group].T.astype(np.int64)
        s = xs[:, g0:g0 + group].sum(1, keepdims=True)
        v = p * ly.scales[:, g0 // group] + s * ly.offsets[:, g0 // group].astype(np.int64)
        assert np.abs(v).max() < 2**31 and np.abs(p * ly.scales[:, g0 // group]).max() < 2**31
        rounding += (0.5 * (np.abs(p) + np.abs(s)) + 0.5) / 2.0**ly.shift + 0.5
    mult, shift = ly.requant.per_channel(n)
    bound = 0.5 + 1e-6 + (rounding + 0.5) * mult * 2.0 ** -shift.astype(np.float64)
    assert (np.abs(got - want) <= bound).all(), (np.abs(got - want) - bound).max()
    if not wide:
        assert np.abs(got - want).max() <= 1.0, np.abs(got - want).max()


def _layer(rng, m: int, k: int, n: int, group: int, zp: int, wide: bool = False):
    x = L.QTensor("x", (m, k), 0.02, zp)
    y = L.QTensor("y", (m, n), 0.04, 0 if wide else -3, "int16" if wide else "int8")
    return grouped_dense("gd", x, y, group_grid(rng.normal(0, 0.05, (n, k)), group),
                         rng.normal(0, 0.2, n), L.WIDE_CLIP if wide else (-128, 127))


@pytest.mark.parametrize("preset", list(CFGS))
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 6), groups=st.integers(1, 5), n=st.integers(1, 40),
       zp=st.integers(-128, 127), wide=st.booleans(), seed=st.integers(0, 2**31))
def test_the_device_is_bit_exact_and_physical(preset, m, groups, n, zp, wide, seed):
    """Several row and output-block tiles, groups of two K blocks (Q4_1's 32 on
    ``default``), channels off the block, int8 and int16 outputs; the program reads every
    weight (int4, two a byte), factor and input once at least and takes no fewer cycles
    than its MACs need."""
    cfg = CFGS[preset]
    rng = np.random.default_rng(seed)
    ly = _layer(rng, m, 2 * cfg.block_in * groups, n, 2 * cfg.block_in, zp, wide)
    res = check(region([ly.input], [ly]), cfg, rng)
    (entry,) = compile_region(region([ly.input], [ly]), cfg).program.meta["layers"]
    assert entry.get("int4_weights")                     # the codes move at 4 bits
    c = res.counters
    bad = violations(ly.macs, c["cycles"], c["dram_read_bytes"], c["dram_write_bytes"],
                     entry["min_read_bytes"], entry["min_write_bytes"],
                     cfg.block_in * cfg.block_out)
    assert not bad, bad
    assert entry["min_read_bytes"] >= ly.weight.size // 2 + 4 * ly.scales.size


@pytest.mark.parametrize("preset", list(CFGS))
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.integers(1, 2), h=st.integers(1, 7), w=st.integers(1, 9),
       groups=st.integers(1, 3), n=st.integers(1, 40), zp=st.integers(-128, 127),
       seed=st.integers(0, 2**31))
def test_a_pointwise_conv_runs_on_the_image_bit_exact(preset, batch, h, w, groups, n, zp, seed):
    """An NCHW image in and out (a 1x1 conv, ``grouped_conv1x1``): the DSA keeps it as
    rows of pixels, so the grouped dense runs on it unchanged. The device equals the
    reference, the reference equals the same layer over the pixels as matrix rows
    (the image transposed in numpy) and the float conv within one code, and no bound is
    broken."""
    cfg = CFGS[preset]
    rng = np.random.default_rng(seed)
    k = 2 * cfg.block_in * groups
    wgt, bias = rng.normal(0, 0.05, (n, k)), rng.normal(0, 0.2, n)
    x = L.QTensor("x", (batch, k, h, w), 0.02, zp)
    y = L.QTensor("y", (batch, n, h, w), 0.04, -3)
    ly = grouped_dense("gd", x, y, group_grid(wgt, 2 * cfg.block_in), bias)
    xs = rng.integers(-128, 128, x.shape, dtype=np.int8)
    res = check(region([x], [ly]), cfg, rng, xs={"x": xs})
    got = run_layer(ly, {"x": xs})
    rows = _layer(rng, batch * h * w, k, n, 2 * cfg.block_in, zp)
    rows = grouped_dense("gd", rows.input, rows.output, group_grid(wgt, 2 * cfg.block_in), bias)
    flat = xs.transpose(0, 2, 3, 1).reshape(-1, k)
    want = run_layer(rows, {"x": flat}).reshape(batch, h, w, n).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got, want)
    real = _float_output(rows, flat, group_grid(wgt, 2 * cfg.block_in).values(), bias)
    assert np.abs(real.reshape(batch, h, w, n).transpose(0, 3, 1, 2) - got).max() <= 1
    (entry,) = compile_region(region([x], [ly]), cfg).program.meta["layers"]
    c = res.counters
    assert not violations(ly.macs, c["cycles"], c["dram_read_bytes"], c["dram_write_bytes"],
                          entry["min_read_bytes"], entry["min_write_bytes"],
                          cfg.block_in * cfg.block_out)
    assert ly.macs == batch * h * w * k * n


@pytest.mark.parametrize("preset", list(CFGS))
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 5), groups=st.integers(1, 4), n=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_an_int16_input_runs_as_byte_planes_bit_exact(preset, m, groups, n, seed):
    """An int16 input (an LLM's down_proj: the SiLU-gate product) becomes BytePlanes and a
    plane grouped dense; on the device bit-exact, and within about one output step of the
    float dense on the exact int16 codes (codes at both ends of int16 included)."""
    cfg = CFGS[preset]
    rng = np.random.default_rng(seed)
    k = 2 * cfg.block_in * groups
    x = L.QTensor("x", (1, m, k), 1e-4, 0, "int16")
    w = rng.normal(0, 0.05, (n, k))
    bias = rng.normal(0, 0.05, n)
    y_scale = float(np.abs(w).sum(1).max()) * 1e-4 * 32768 / 100
    y = L.QTensor("y", (1, m, n), y_scale, 1)
    grid = group_grid(w, 2 * cfg.block_in)
    split, ly = grouped_dense("gd", x, y, grid, bias)
    assert ly.planes and split.output is ly.input
    codes = rng.integers(-32768, 32768, (1, m, k)).astype(np.int16)
    codes.flat[:2] = (32767, -32768)
    reg = region([x], [split, ly])
    check(reg, cfg, rng, xs={"x": codes})
    got = run_layer(ly, {ly.input.name: run_layer(split, {"x": codes})}).astype(np.float64)
    want = (np.minimum(codes, 32639).astype(np.float64) * x.scale) @ grid.values().T + bias
    want = np.clip(want / y.scale + y.zero_point, -128, 127)
    assert np.abs(got - want).max() <= 1.0


def test_what_the_device_cannot_take_stays_on_the_cpu():
    """Groups not made of whole K blocks, or not tiling K, are refused by name (the CPU
    reference still runs them)."""
    cfg = CFGS["default"]
    rng = np.random.default_rng(0)
    for k, group in ((40, 8), (40, 32)):
        ly = _layer(rng, 2, k, 5, group, 0)
        why = lowering_supports(ly, cfg)
        assert why and f"groups of {group} input rows over K={k}" in why, why
        assert run_layer(ly, {"x": np.zeros((2, k), np.int8)}).shape == (2, 5)
    x = L.QTensor("x", (2, 3, 32), 1e-4, 0, "int16")       # planes of two matrices
    _, ly = grouped_dense("gd", x, L.QTensor("y", (2, 3, 4), 0.1, 0),
                          group_grid(rng.normal(0, 1, (4, 32)), 32))
    assert "byte planes need one matrix" in lowering_supports(ly, cfg)
    with pytest.raises(ValueError, match="int16 input needs zero point 0"):
        grouped_dense("gd", L.QTensor("x", (2, 32), 1e-4, 5, "int16"), ly.output,
                      group_grid(rng.normal(0, 1, (4, 32)), 32))


# ----------------------------------------------------------------------------- end to end
def _mlp():
    """MatMul -> Relu -> MatMul + bias, K = 64 and 96 (two and three groups of 32)."""
    from .. import qdq_models as Q

    rng = np.random.default_rng(0)
    inits = {"W1": Q.rand(rng, 64, 96), "W2": Q.rand(rng, 96, 40), "B2": Q.rand(rng, 40)}
    nodes = [Q.node("MatMul", ["x", "W1"], ["h"], name="mm1"), Q.node("Relu", ["h"], ["r"]),
             Q.node("MatMul", ["r", "W2"], ["m2"], name="mm2"),
             Q.node("Add", ["m2", "B2"], ["out"])]
    fp32 = Q.make_model(nodes, inits, {"x": (3, 64)}, {"out": None})
    return fp32, [rng.standard_normal((3, 64)).astype(np.float32) for _ in range(4)]


def _on_dsa(qm):
    import tvm
    from tvm import relax

    import dsa_tvm
    from dsa_tvm.runtime import take_launches
    from dsa_tvm.target import target
    from tir_schedules.options import options

    with options(offload="all"):
        ex = tvm.compile(qm.to_relax(), target=target("default"))
    rep = dsa_tvm.last_compile_report()
    take_launches()
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return rep, lambda x: (vm["main"](tvm.runtime.tensor(x)).numpy(), take_launches())


def test_quantized_per_group_the_model_runs_on_the_dsa_as_onnxruntime_runs_it():
    """``quantize_onnx(weight_group=32)`` leaves each MatMul's weight in float32 on its
    Q4_1 grid (``wide_weights``: 8 bits); the compiler finds the grids, both MatMuls run
    as grouped denses on the DSA, each launch bit-exact against the integer reference and
    the output within one step of onnxruntime on the same graph."""
    import onnx
    import onnxruntime as ort

    from dsa_tvm.quant.api import quantize_onnx
    from tir_schedules.kinds import run_region

    fp32, cal = _mlp()
    qm = quantize_onnx(fp32, cal, show_progress=False, weight_bits=4, weight_group=32,
                       wide_weights={"mm2"})
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in qm.model.graph.initializer}
    for node, bits in (("mm1", 4), ("mm2", 8)):
        w = inits[f"{node}/W_grouped"]
        assert w.dtype == np.float32
        np.testing.assert_allclose(group_grid(w.T, 32, bits).values(), w.T, rtol=0, atol=1e-6)
    assert "per-32-row-group" in qm.summary()
    rep, run = _on_dsa(qm)
    (region,) = rep.regions
    assert region.target == "dsa"
    kinds = [type(ly).__name__ for ly in region.region.layers]
    assert kinds == ["GroupedDense", "GroupedDense"], kinds
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(qm.model.SerializeToString(), so)
    step = float(inits["out/scale"])
    for x in cal:
        y, (launch,) = run(x)
        want = run_region(region.region, launch.inputs)
        for name, got in launch.outputs.items():
            np.testing.assert_array_equal(got, want[name])
        assert np.abs(y - sess.run(None, {"x": x})[0]).max() <= step * 1.01


def _pointwise_cnn():
    """Conv 3x3 -> Relu -> Conv 1x1 (32 -> 24, bias) -> Relu -> Conv 1x1 (24 -> 8, no bias)
    -> Conv 1x1 stride 2 (8 -> 8): the first 1x1 splits into groups of 16 channels."""
    from .. import qdq_models as Q

    rng = np.random.default_rng(1)
    inits = {"W0": Q.rand(rng, 32, 3, 3, 3), "W1": Q.rand(rng, 24, 32, 1, 1),
             "B1": Q.rand(rng, 24) + 0.5, "W2": Q.rand(rng, 8, 24, 1, 1),
             "W3": Q.rand(rng, 8, 8, 1, 1)}
    nodes = [Q.node("Conv", ["x", "W0"], ["c0"], name="stem", pads=[1] * 4),
             Q.node("Relu", ["c0"], ["r0"]),
             Q.node("Conv", ["r0", "W1", "B1"], ["c1"], name="expand"),
             Q.node("Relu", ["c1"], ["r1"]),
             Q.node("Conv", ["r1", "W2"], ["c2"], name="project"),
             Q.node("Conv", ["c2", "W3"], ["out"], name="down", strides=[2, 2])]
    fp32 = Q.make_model(nodes, inits, {"x": (1, 3, 6, 6)}, {"out": None})
    return fp32, [(rng.standard_normal((1, 3, 6, 6)) + 0.3).astype(np.float32)
                  for _ in range(4)]


def test_quantized_per_group_pointwise_convs_run_on_the_dsa_as_onnxruntime_runs_them():
    """``quantize_onnx(weight_group=16)`` puts the 1x1 conv whose 32 input channels split
    into groups on a grid (its bias corrected for the grid's rounding), and leaves the
    others per channel (24 channels, a stride); the DSA runs it as a grouped dense on the
    image, each launch bit-exact against the integer reference, the output within one step
    of onnxruntime on the same graph."""
    import onnx
    import onnxruntime as ort

    from dsa_tvm.quant.api import quantize_onnx
    from tir_schedules.kinds import run_region

    fp32, cal = _pointwise_cnn()
    inits0 = {i.name: onnx.numpy_helper.to_array(i) for i in fp32.graph.initializer}
    qm = quantize_onnx(fp32, cal, show_progress=False, weight_bits=4, weight_group=16)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in qm.model.graph.initializer}
    w = inits["expand/W_grouped"].reshape(24, 32)
    np.testing.assert_allclose(group_grid(w, 16, 4).values(), w, rtol=0, atol=1e-6)
    assert not np.array_equal(inits["expand/B_corrected"], inits0["B1"])
    assert not any(k.startswith(("project/W_grouped", "down/W_grouped", "stem/W_grouped"))
                   for k in inits)
    assert "per-16-row-group (MatMul, 1x1 Conv)" in qm.summary()
    rep, run = _on_dsa(qm)
    kinds = [type(ly).__name__ for r in rep.regions if r.target == "dsa"
             for ly in r.region.layers]
    assert kinds.count("GroupedDense") == 1 and kinds.count("Conv2d") == 3, kinds
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(qm.model.SerializeToString(), so)
    step = float(inits["out/scale"])
    regions = [r.region for r in rep.regions if r.target == "dsa"]
    for x in cal:
        y, launches = run(x)
        for reg, launch in zip(regions, launches):
            want = run_region(reg, launch.inputs)
            for name, got in launch.outputs.items():
                np.testing.assert_array_equal(got, want[name])
        assert np.abs(y - sess.run(None, {"x": x})[0]).max() <= step * 1.01


def test_a_float_weight_on_no_grid_stays_on_the_cpu_named():
    import onnx

    from dsa_tvm.quant.api import quantize_onnx

    fp32, cal = _mlp()
    qm = quantize_onnx(fp32, cal, show_progress=False, weight_bits=4, weight_group=32)
    for init in qm.model.graph.initializer:
        if init.name == "mm1/W_grouped":      # off the grid: the codes no longer fit
            w = onnx.numpy_helper.to_array(init)
            w = w + np.random.default_rng(0).normal(0, 1e-3, w.shape).astype(np.float32)
            init.CopyFrom(onnx.numpy_helper.from_array(w, init.name))
    rep, _ = _on_dsa(qm)
    text = str(rep)
    assert "grid: the float32 weight (64, 96) is on no per-group grid" in text, text
    assert "GroupedDense" in text               # the other MatMul still runs on the DSA


@pytest.mark.parametrize("bad", [-1, 2.5, "32", True])
def test_a_bad_weight_group_is_refused_naming_it(bad):
    from dsa_tvm.quant.api import quantize_onnx

    fp32, cal = _mlp()
    with pytest.raises(ValueError, match="weight_group must be a whole number"):
        quantize_onnx(fp32, cal, show_progress=False, weight_group=bad)
    with pytest.raises(ValueError, match=r"wide_weights names no MatMul or Conv node.*'head'"):
        quantize_onnx(fp32, cal, show_progress=False, weight_group=32, wide_weights={"head"})


def test_cli_quantize_weight_group_writes_the_grids(tmp_path, capsys):
    import onnx

    from dsa_tvm.cli import main

    fp32, cal = _mlp()
    src = tmp_path / "mlp.onnx"
    onnx.save(fp32, src)
    np.savez(tmp_path / "cal.npz", x=np.stack(cal))
    assert main(["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "--weight-bits",
                 "4", "--weight-group", "32", "--quiet"]) == 0
    assert "per-32-row-group (MatMul, 1x1 Conv) int4 weights" in capsys.readouterr().out
    q = onnx.load(str(tmp_path / "mlp_w4g32.onnx"))      # the default name says what it is
    grids = [onnx.numpy_helper.to_array(i) for i in q.graph.initializer
             if i.name.endswith("/W_grouped")]
    assert len(grids) == 2 and all(np.allclose(group_grid(w.T, 32, 4).values(), w.T,
                                               rtol=0, atol=1e-6) for w in grids)
    with pytest.raises(SystemExit):
        main(["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "--weight-group", "0"])
    assert "--weight-group: must be a positive integer" in capsys.readouterr().err
