"""int16-input dense layers (W8A16) as two int8 byte planes joined in the accumulator
(``relay_passes.kinds.dense_planes``, ``Dense.planes``): one launch, bit-exact against the
integer reference on every preset, within the join's stated rounding of onnxruntime over
ranks, widths off the block, biases and int8 / int16 outputs; the saturation the split
defines; what it cannot take stays on the CPU with the reason; the LLM's MLP tail (an
int16 SiLU-gate product into down_proj into the int16 residual add) in one launch."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import helper
from tvm import relax

from dsa_tvm.layers.ir import Dense
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_layer, run_region

from .test_wide_mul import _model, _qdq
from .test_wide_output import _compile

X_STEP = 1e-3


def _planes_model(lead: tuple[int, ...], k: int, n: int, seed: int, y_step: float,
                  out16: bool = True, x_zp: int = 0, bias: bool = False,
                  relu: bool = False) -> onnx.ModelProto:
    """x -> Q/DQ int16 -> MatMul(int8 per-channel W) [+ bias] [-> Relu] -> Q/DQ int16 (or
    int8)."""
    rng = np.random.default_rng(seed)
    w_s = rng.uniform(0.002, 0.02, n).astype(np.float32)
    y_t = np.int16 if out16 else np.int8
    inits = {"x_s": np.float32(X_STEP), "x_z": np.int16(x_zp),
             "w_q": rng.integers(-127, 128, (k, n)).astype(np.int8), "w_s": w_s,
             "w_z": np.zeros(n, np.int8), "y_s": np.float32(y_step), "y_z": y_t(0)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["mm"])]
    out = "mm"
    if bias:
        inits.update(b_q=rng.integers(-300, 300, n).astype(np.int32),
                     b_s=(X_STEP * w_s).astype(np.float32), b_z=np.zeros(n, np.int32))
        nodes += [helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["bd"], axis=0),
                  helper.make_node("Add", ["mm", "bd"], ["mb"])]
        out = "mb"
    if relu:
        nodes.append(helper.make_node("Relu", [out], ["act"]))
        out = "act"
    nodes += [helper.make_node("QuantizeLinear", [out, "y_s", "y_z"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"])]
    return _model(nodes, inits, {"x": (*lead, k)}, (*lead, n), "planes")


def _run(ex, *xs: np.ndarray) -> np.ndarray:
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, xs)).numpy()


def _ort(model: onnx.ModelProto, **feeds: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so).run(None, feeds)[0]


def _tolerance(rep, y_step: float) -> float:
    """What the planes may differ from onnxruntime's exact int16 x int8 product: one output
    step (both sides round) and the join's rounding, half a joined unit for the lo plane's
    sums and half for the bias, a joined unit being the requantize's factor
    ``256 s_x s_w / s_y`` output steps."""
    dense = next(ly for ly in rep.regions[0].region.layers if isinstance(ly, Dense))
    factor = dense.requant.multiplier.astype(np.float64) * 2.0 ** -dense.requant.shift
    return y_step * (1.01 + float(factor.max()))


def _one_launch_bit_exact(ex, rep, *xs) -> np.ndarray:
    assert [r.target for r in rep.regions] == ["dsa"], rep
    take_launches()
    got = _run(ex, *xs)
    (launch,) = take_launches()
    want = run_region(rep.regions[0].region, launch.inputs)
    for name, out in launch.outputs.items():
        np.testing.assert_array_equal(out, want[name])
    return got


@settings(max_examples=8, deadline=None)
@given(lead=st.sampled_from([(1,), (3,), (7,), (2, 3), (1, 5)]), k=st.integers(1, 90),
       n=st.integers(1, 40), seed=st.integers(0, 2 ** 16), out16=st.booleans(),
       y_step=st.sampled_from([2e-4, 5e-3, 0.2]), bias=st.booleans())
@example(lead=(2, 3), k=70, n=33, seed=1, out16=True, y_step=2e-4, bias=False)  # saturates
def test_int16_input_dense_runs_as_byte_planes(lead, k, n, seed, out16, y_step, bias):
    model = _planes_model(lead, k, n, seed, y_step, out16, bias=bias)
    ex, rep = _compile(model)
    layers = rep.regions[0].region.layers
    kinds = [type(ly).__name__ for ly in layers]
    assert kinds == ["BytePlanes", "Dense"] and layers[-1].planes, kinds
    # inside the grid (|x| < 32640 codes: beyond, the split saturates; see below)
    x = np.random.default_rng(seed).uniform(-32000, 32000, (*lead, k)).astype(np.float32)
    got = _one_launch_bit_exact(ex, rep, x * np.float32(X_STEP))
    ref = _ort(model, x=x * np.float32(X_STEP))
    assert np.abs(got - ref).max() <= _tolerance(rep, y_step)


def test_the_planes_read_the_weights_once_and_split_exactly():
    """One dense over both planes (the weights stream once), joined before its one
    requantize (no int16 partial sums in DRAM); hi and lo rebuild x."""
    model = _planes_model((4,), 48, 24, 0, 5e-3)
    ex, rep = _compile(model)
    layers = rep.regions[0].region.layers
    dense = [ly for ly in layers if isinstance(ly, Dense)]
    assert len(dense) == 1 and dense[0].input.shape == (8, 48) and dense[0].planes
    assert dense[0].output.shape == (4, 24)
    xq = np.random.default_rng(1).integers(-32768, 32640, (4, 48)).astype(np.int16)
    xq[0, :3] = (-32768, 32639, -129)
    planes = run_layer(layers[0], {layers[0].input.name: xq}).astype(np.int64)
    hi, lo = planes[:4], planes[4:]
    np.testing.assert_array_equal(256 * hi + lo, xq)
    assert lo.min() >= -128 and lo.max() <= 127


def test_codes_past_32639_saturate_there():
    """x = 32767 codes splits as hi 127 (saturated), lo 127: the dense sees 32639."""
    model = _planes_model((2,), 16, 8, 3, 5e-3)
    ex, rep = _compile(model)
    x = np.full((2, 16), 40.0, np.float32)                 # beyond the grid: 32767 codes
    got = _one_launch_bit_exact(ex, rep, x)
    at = _ort(model, x=np.full((2, 16), 32639 * X_STEP, np.float32))
    assert np.abs(got - at).max() <= _tolerance(rep, 5e-3)


@pytest.mark.parametrize("what,reason", [
    ("zero_point", "an int16 input with zero point 5"),
    ("tiny_output", "requant_range"),                # an output step of 1e-15
])
def test_what_the_planes_cannot_take_stays_on_the_cpu(what, reason):
    model = _planes_model((3,), 16, 8, 0, 1e-15 if what == "tiny_output" else 5e-3,
                          x_zp=5 if what == "zero_point" else 0)
    ex, rep = _compile(model)
    assert not [r for r in rep.regions if r.target == "dsa"]
    assert reason in str(rep)
    x = np.random.default_rng(1).uniform(-20, 20, (3, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(ex, x), _ort(model, x=x), atol=1e-5)


def _mlp_tail(t: int, k: int, n: int, seed: int) -> onnx.ModelProto:
    """An LLM block's MLP tail: g, u int8 -> Mul -> Q/DQ int16 -> MatMul (down_proj) ->
    Q/DQ int16 -> Add with the int16 residual r -> Q/DQ int16."""
    rng = np.random.default_rng(seed)
    inits = {"w_q": rng.integers(-127, 128, (k, n)).astype(np.int8),
             "w_s": rng.uniform(0.001, 0.004, n).astype(np.float32),
             "w_z": np.zeros(n, np.int8)}
    nodes = (_qdq("g", "int8", 0.05, 2, inits) + _qdq("u", "int8", 0.04, -1, inits)
             + _qdq("r", "int16", 1e-3, 0, inits)
             + [helper.make_node("Mul", ["gd", "ud"], ["p"])] + _qdq("p", "int16", 2e-4, 0, inits)
             + [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"], axis=1),
                helper.make_node("MatMul", ["pd", "wd"], ["d"])] + _qdq("d", "int16", 4e-4, 0, inits)
             + [helper.make_node("Add", ["rd", "dd"], ["res"])]
             + _qdq("res", "int16", 1e-3, 0, inits)
             + [helper.make_node("Identity", ["resd"], ["y"])])
    return _model(nodes, inits, {"g": (1, t, k), "u": (1, t, k), "r": (1, t, n)}, (1, t, n),
                  "mlp_tail")


@pytest.mark.parametrize("t", [1, 5])
def test_an_llm_mlp_tail_runs_in_one_launch(t):
    model = _mlp_tail(t, 96, 32, t)
    ex, rep = _compile(model)
    rng = np.random.default_rng(t)
    # products within the int16 grid (6.55): past 32639 codes the planes saturate early
    g, u = (rng.uniform(-2.5, 2.5, (1, t, 96)).astype(np.float32) for _ in range(2))
    r = rng.uniform(-20, 20, (1, t, 32)).astype(np.float32)
    got = _one_launch_bit_exact(ex, rep, g, u, r)
    ref = _ort(model, g=g, u=u, r=r)
    # a few int16 steps of the residual (the down_proj output's planes and two requants)
    assert np.abs(got - ref).max() <= 1e-3 * 8


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
def test_prefill_sized_planes_are_bit_exact_on_every_preset(preset):
    """300 rows of planes against 512 outputs (many row and channel tiles, each tile both
    planes of its rows) on each preset's scratchpads."""
    model = _planes_model((300,), 16, 512, 4, 0.05)
    ex, rep = _compile(model, preset)
    x = np.random.default_rng(2).uniform(-32, 32, (300, 16)).astype(np.float32)
    got = _one_launch_bit_exact(ex, rep, x)
    assert np.abs(got - _ort(model, x=x)).max() <= _tolerance(rep, 0.05)


@pytest.mark.parametrize("spread,lo_shift", [(127, 1), (40, 0)])
def test_the_join_is_the_exact_product_within_its_stated_rounding(spread, lo_shift):
    """The join's lo shift is the smallest that keeps int32 for any input: 0 (the exact
    product) for weights whose rows sum as SmolLM2's down_proj's do, 1 for K = 1,536
    uniform int8 weights. Against the int16 codes' exact product (int64, no planes) the
    layers' integer result differs by at most half a joined unit (the lo plane's sums)
    plus half the requantize's own step; with the shift of 8 (the join's first form) it
    misses by up to 128 product units."""
    from dsa_tvm.isa import semantics as sem
    from dsa_tvm.layers.ir import QTensor, Requant
    from relay_passes.kinds.dense_planes import byte_plane_layers, plane_lo_shift

    rng = np.random.default_rng(9)
    k, n, m = 1536, 40, 64
    w = rng.integers(-spread, spread + 1, (n, k), dtype=np.int8)
    assert plane_lo_shift(w, np.zeros(n)) == lo_shift
    x = QTensor("x", (m, k), 1e-4, 0, "int16")
    y = QTensor("y", (m, n), 2e-5, 0, "int16")
    unit = 1e-4 * 3e-3 / 2e-5                         # product units, in output steps
    xq = rng.integers(-32640, 32640, (m, k)).astype(np.int16)
    xq[:8] //= 300                                    # rows of small codes: all lo plane
    exact = np.clip((xq.astype(np.int64) @ w.astype(np.int64).T) * unit, -32768, 32767)
    for s in (lo_shift, 8):
        mult, shift = sem.quantize_multipliers(np.full(n, (1 << s) * unit))
        layers = byte_plane_layers("d", x, y, w, np.zeros(n, np.int32),
                                   Requant(mult, shift, 0, (-32768, 32767)), s)
        err = np.abs(run_region_layers(layers, {"x": xq}) - exact).max()
        assert err <= 0.5 * (1 << s) * unit + 0.5 + 1e-6
        if s == 0:
            assert err <= 0.5 + 1e-6                  # exact up to the requantize's rounding


def run_region_layers(layers, env: dict) -> np.ndarray:
    """The integer reference of a chain of layers, its last output."""
    env = dict(env)
    for ly in layers:
        env[ly.output.name] = run_layer(ly, env)
    return env[layers[-1].output.name].astype(np.int64)


def test_a_fused_relu_folds_into_the_planes_requantize():
    """int16 in, ReLU, int8 out: the clip lands on the plane dense's requantize."""
    model = _planes_model((5,), 40, 24, 7, 0.2, out16=False, relu=True)
    ex, rep = _compile(model)
    assert rep.regions[0].region.layers[-1].requant.clip[0] == 0      # zero point 0: ReLU
    x = np.random.default_rng(3).uniform(-30, 30, (5, 40)).astype(np.float32)
    got = _one_launch_bit_exact(ex, rep, x)
    assert got.min() >= 0
    assert np.abs(got - _ort(model, x=x)).max() <= _tolerance(rep, 0.2)


def test_a_prefill_chunk_of_down_proj_past_the_dma_stride_field():
    """SmolLM2's down_proj over a 511-token chunk: its planes are 1,022 rows of 96 blocks
    (98,112 blocks, past the 16-bit DMA stride): one group needs no stride, so it runs."""
    model = _planes_model((1, 511), 1536, 16, 5, 0.05)
    ex, rep = _compile(model)
    split = rep.regions[0].region.layers[0]
    assert split.output.shape[-2] * split.output.shape[-1] // 16 > 65535
    x = np.random.default_rng(4).uniform(-32, 32, (1, 511, 1536)).astype(np.float32)
    got = _one_launch_bit_exact(ex, rep, x)
    assert np.abs(got - _ort(model, x=x)).max() <= _tolerance(rep, 0.05)
