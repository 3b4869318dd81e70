"""int16 products: the element-wise Mul of two int8 activations whose output QuantizeLinear
is int16 (an LLM's SiLU-gate product ``silu(gate) * up`` on a wide grid) runs in the binary
room with REQUANT's wide mode and an ACC16 store, bit-exact against the integer reference
(which clamps at int16) and within one int16 step of onnxruntime; its int16 bytes count in
the layer's DRAM bounds and cycle estimate; it feeds the add room's int16 operand in the
same launch; a fused ReLU on it stays on the CPU with the reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import dsa_tvm
from dsa_tvm.layers.ir import WIDE_CLIP, Mul
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import recipe, run_region
from tir_schedules.kinds.binary import BinaryKnobs, binary_perf_shape, estimate_binary_cycles

from .test_wide_output import OPSET, _compile, run_one_wide_launch

_NP = {"int8": np.int8, "int16": np.int16}


def _qdq(name: str, dtype: str, scale: float, zp: int, inits: dict) -> list:
    """``name`` -> QuantizeLinear / DequantizeLinear (``dtype``) -> ``{name}d``."""
    inits[f"{name}_s"], inits[f"{name}_z"] = np.float32(scale), _NP[dtype](zp)
    return [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}q"]),
            helper.make_node("DequantizeLinear", [f"{name}q", f"{name}_s", f"{name}_z"],
                             [f"{name}d"])]


def _model(nodes: list, inits: dict, inputs: dict[str, tuple], out_shape: tuple,
           name: str) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return model


def _wide_mul(shape: tuple[int, ...], scales, zps, b_shape: tuple[int, ...] | None = None,
              act: str | None = None, const_b: bool = False) -> onnx.ModelProto:
    """``y = Q16(DQ(a) * DQ(b))``: int8 a, b (``b_shape``: b broadcasting), [a fused
    ``act``,] the product on a symmetric int16 grid (``scales[2]``). ``const_b``: b an int8
    constant (a layer scale) instead of an input."""
    b_shape = b_shape or shape
    inits: dict = {}
    nodes = _qdq("a", "int8", scales[0], zps[0], inits)
    if const_b:
        inits["b_c"] = np.arange(1, shape[-1] + 1, dtype=np.int8)
        inits["b_s"], inits["b_z"] = np.float32(scales[1]), np.int8(0)
        nodes.append(helper.make_node("DequantizeLinear", ["b_c", "b_s", "b_z"], ["bd"]))
    else:
        nodes += _qdq("b", "int8", scales[1], zps[1], inits)
    nodes.append(helper.make_node("Mul", ["ad", "bd"], ["prod"]))
    out = "prod"
    if act is not None:
        nodes.append(helper.make_node(act, ["prod"], ["act"]))
        out = "act"
    inits["y_s"], inits["y_z"] = np.float32(scales[2]), np.int16(0)
    nodes += [helper.make_node("QuantizeLinear", [out, "y_s", "y_z"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"])]
    inputs = {"a": shape} if const_b else {"a": shape, "b": b_shape}
    return _model(nodes, inits, inputs, shape, "wide_mul")


def _wide_mul_add(shape: tuple[int, ...], s_prod: float, s_r: float,
                  s_y: float) -> onnx.ModelProto:
    """``y = Q16(DQ16(Q16(DQ(a) * DQ(b))) + DQ16(Q16(r)))``: the int16 product joins an
    int16 residual stream (the decoder's MLP output into the residual add)."""
    inits: dict = {}
    nodes = (_qdq("a", "int8", 0.04, 3, inits) + _qdq("b", "int8", 0.03, -5, inits)
             + _qdq("r", "int16", s_r, 0, inits))
    inits["p_s"], inits["p_z"] = np.float32(s_prod), np.int16(0)
    inits["y_s"], inits["y_z"] = np.float32(s_y), np.int16(0)
    nodes += [helper.make_node("Mul", ["ad", "bd"], ["prod"]),
              helper.make_node("QuantizeLinear", ["prod", "p_s", "p_z"], ["pq"]),
              helper.make_node("DequantizeLinear", ["pq", "p_s", "p_z"], ["pd"]),
              helper.make_node("Add", ["pd", "rd"], ["sum"]),
              helper.make_node("QuantizeLinear", ["sum", "y_s", "y_z"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"])]
    return _model(nodes, inits, {"a": shape, "b": shape, "r": shape}, shape, "wide_mul_add")


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so).run(None, feeds)[0]


def _run(ex, feeds: dict[str, np.ndarray]) -> np.ndarray:
    args = [tvm.runtime.tensor(v) for v in feeds.values()]
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()


def _check_mul(model, feeds, scales) -> tuple:
    """Compile, run, check the launch bit-exact against the integer reference and within
    one int16 step (plus the multiplier's rounding) of onnxruntime; (launch, report)."""
    ex, rep = _compile(model)
    assert [r.target for r in rep.regions] == ["dsa"], rep
    (layer,) = rep.regions[0].region.layers
    assert isinstance(layer, Mul) and layer.output.dtype == "int16", layer
    assert tuple(layer.requant.clip) == WIDE_CLIP
    got, launch = run_one_wide_launch(ex, rep, *feeds.values())
    (out,) = launch.outputs.values()
    # onnxruntime rounds the float product once; the DSA's fixed-point multiplier is
    # mult * 2**-shift, off the real factor by |f - mult * 2**-shift| per unit of the
    # centred product: one step plus that, times the product's codes
    f = scales[0] * scales[1] / scales[2]
    m, s = int(layer.requant.multiplier[0]), int(layer.requant.shift[0])
    acc = np.abs((launch.inputs[layer.a.name].astype(np.int64) - layer.a.zero_point)
                 * (np.broadcast_to(launch.inputs[layer.b.name], out.shape).astype(np.int64)
                    - layer.b.zero_point))
    tol = 1.01 + acc * abs(f - m * 2.0 ** -s)
    ref = _ort(model, feeds)
    assert np.all(np.abs(got - ref) <= scales[2] * tol), float(np.abs(got - ref).max())
    return launch, rep


def test_int16_product_is_bit_exact_and_matches_onnxruntime():
    """The SiLU-gate product of two int8 tensors on an int16 grid 64 times finer than
    int8 would need: values an int8 output would saturate are kept."""
    shape, scales = (3, 37), (0.05, 0.04, 0.05 * 0.04 * 127 * 127 / 32767 * 2)
    rng = np.random.default_rng(0)
    feeds = {k: (rng.standard_normal(shape) * 2.5).astype(np.float32) for k in "ab"}
    launch, rep = _check_mul(_wide_mul(shape, scales, (3, -2)), feeds, scales)
    y = launch.outputs[next(iter(launch.outputs))]
    assert np.abs(y).max() > 127 * 32        # far beyond an int8 grid of this step


@settings(max_examples=8, deadline=None)
@given(lead=st.lists(st.integers(1, 5), min_size=1, max_size=2), width=st.integers(1, 70),
       broadcast=st.booleans(), zps=st.tuples(st.integers(-20, 20), st.integers(-20, 20)),
       s_a=st.floats(0.005, 0.2), s_b=st.floats(0.005, 0.2),
       ratio=st.floats(0.001, 4.0), seed=st.integers(0, 2 ** 16))
@example(lead=[3, 5], width=37, broadcast=True, zps=(7, -9), s_a=0.05, s_b=0.03, ratio=0.01,
         seed=1)
@example(lead=[4], width=70, broadcast=False, zps=(0, 0), s_a=0.1, s_b=0.02, ratio=4.0, seed=2)
def test_int16_product_over_shapes_and_scales_is_bit_exact(lead, width, broadcast, zps, s_a,
                                                           s_b, ratio, seed):
    """Ranks 2 and 3, widths off the 16-lane block, an operand broadcasting over the rows
    (``[.., 1, C]``), and output steps from ones that keep every product to ones so fine
    that most products saturate at the int16 ends (``ratio`` small)."""
    shape = (*lead, width)
    b_shape = (*lead[:-1], 1, width) if broadcast else shape
    # the centred product (up to 1.21 * 128 * 128) spans 2 / ratio * 1.21 * 16384 steps:
    # ratio below about 1.2 saturates the largest products, 4 keeps them all
    s_y = s_a * s_b * 128 * 128 / 32767 * ratio
    scales = (s_a, s_b, s_y)
    rng = np.random.default_rng(seed)
    feeds = {"a": (rng.uniform(-1.1, 1.1, shape) * 128 * s_a).astype(np.float32),
             "b": (rng.uniform(-1.1, 1.1, b_shape) * 128 * s_b).astype(np.float32)}
    _check_mul(_wide_mul(shape, scales, zps, b_shape), feeds, scales)


def test_a_saturating_int16_product_clamps_at_the_int16_ends():
    scales = (0.1, 0.1, 1e-4)   # 127 * 127 * 100 codes: far beyond int16
    rng = np.random.default_rng(3)
    feeds = {k: rng.uniform(-13, 13, (4, 33)).astype(np.float32) for k in "ab"}
    launch, _ = _check_mul(_wide_mul((4, 33), scales, (0, 0)), feeds, scales)
    y = next(iter(launch.outputs.values()))
    assert y.min() == WIDE_CLIP[0] and y.max() == WIDE_CLIP[1]


def test_int16_product_bounds_and_estimate_count_two_bytes_a_code():
    """The physics checks: the layer table's compulsory writes are the int16 bytes and the
    run moves at least that many; the cycle estimate charges the int16 store."""
    from dsa_tvm.report import build_report

    shape, scales = (8, 48), (0.05, 0.04, 1e-4)
    ex, rep = _compile(_wide_mul(shape, scales, (1, 2)))
    region = rep.regions[0]
    (meta,) = region.program.meta["layers"]
    assert meta["min_write_bytes"] == 2 * 8 * 48
    assert meta["min_read_bytes"] == 2 * 8 * 48       # two int8 operands
    rng = np.random.default_rng(4)
    take_launches()
    _run(ex, {k: rng.standard_normal(shape).astype(np.float32) for k in "ab"})
    launches = take_launches()
    (row,) = [r for r in build_report(launches, rep).rows if r.target == "DSA"]
    assert row.check == "", row.check
    assert row.min_written == 2 * 8 * 48 and row.dram_written >= row.min_written
    (layer,) = region.region.layers
    cfg = dsa_tvm.load_config("default")
    r = recipe(layer, cfg, consts=False)
    s = binary_perf_shape(r.shape)
    assert tuple(s.clip) == WIDE_CLIP           # tuning tasks keep the int16 store's cost
    narrow = dataclasses.replace(s, clip=(-128, 127))
    k = BinaryKnobs(**meta["knobs"])
    assert estimate_binary_cycles(cfg, s, k) > estimate_binary_cycles(cfg, narrow, k)


def test_int16_product_into_the_int16_residual_add_is_one_launch():
    """The product writes int16 codes the add room reads (ACC16 loads) in the same
    region: one launch, both layers bit-exact."""
    shape = (2, 40)
    model = _wide_mul_add(shape, s_prod=2e-4, s_r=3e-4, s_y=5e-4)
    ex, rep = _compile(model)
    assert [r.target for r in rep.regions] == ["dsa"], rep
    layers = rep.regions[0].region.layers
    assert [type(ly).__name__ for ly in layers] == ["Mul", "Add"], layers
    assert layers[0].output.dtype == "int16" and layers[1].a.dtype == "int16"
    rng = np.random.default_rng(5)
    feeds = {"a": rng.uniform(-5, 5, shape).astype(np.float32),
             "b": rng.uniform(-3.8, 3.8, shape).astype(np.float32),
             "r": rng.uniform(-9, 9, shape).astype(np.float32)}
    take_launches()
    got = _run(ex, feeds)
    (launch,) = take_launches()
    want = run_region(rep.regions[0].region, launch.inputs)
    for name, out in launch.outputs.items():
        assert out.dtype == np.int16
        np.testing.assert_array_equal(out, want[name])
    ref = _ort(model, feeds)
    # one output step, one product step (its rounding, carried into the sum) and the add's
    # multipliers' rounding at their shared shift n (half a unit of 2**-n times each
    # operand's centred codes; the product's at most the int16 range)
    add = layers[1]
    n = int(add.requant.shift[0])
    r_codes = np.abs(launch.inputs[add.b.name].astype(np.int64) - add.b.zero_point)
    tol = 5e-4 * (1.01 + 0.5 * 2.0 ** -n * (r_codes + 32768)) + 2e-4 * 1.01
    assert np.all(np.abs(got - ref) <= tol)


def test_a_fused_relu_on_an_int16_product_stays_on_the_cpu():
    """REQUANT's wide mode clamps to int16 only: no ReLU bounds to fold in."""
    scales = (0.05, 0.04, 1e-4)
    model = _wide_mul((3, 20), scales, (0, 0), act="Relu")
    ex, rep = _compile(model)
    assert not [r for r in rep.regions if r.target == "dsa"]
    assert "a fused relu on an int16 output" in str(rep).lower(), str(rep)
    rng = np.random.default_rng(6)
    feeds = {k: rng.standard_normal((3, 20)).astype(np.float32) for k in "ab"}
    np.testing.assert_allclose(_run(ex, feeds), _ort(model, feeds), atol=1e-5)


def test_an_int16_product_with_a_constant_stays_on_the_cpu():
    """Only the product of two activations (the binary room) writes int16."""
    model = _wide_mul((3, 20), (0.05, 0.01, 1e-4), (0, 0), const_b=True)
    _, rep = _compile(model)
    assert not [r for r in rep.regions if r.target == "dsa"]
    assert "product of two activations only" in str(rep), str(rep)
