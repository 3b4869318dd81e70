"""int16 outputs: a dense layer whose output QuantizeLinear is int16 (an LLM's residual
stream) runs on the DSA with REQUANT's wide mode and an ACC16 store, bit-exact against
the integer reference and within one int16 step of onnxruntime; what the wide mode
cannot do (a fused ReLU, an int16 input) stays on the CPU with the reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.version_converter
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import dsa_tvm
from dsa_tvm.isa.instructions import Buffer, Store
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

OPSET = 21


def _wide_dense(m: int, k: int, n: int, seed: int, out_step: float, relu: bool = False,
                wide_input: bool = False) -> onnx.ModelProto:
    """x -> Q/DQ int8 (int16 with ``wide_input``) -> MatMul(int8 per-channel W) + bias
    [-> Relu] -> Q/DQ int16."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.02, n).astype(np.float32)
    in_type = np.int16 if wide_input else np.int8
    x_s = np.float32(0.05 if not wide_input else 0.0005)
    inits = {
        "x_s": x_s, "x_z": in_type(3), "w_q": w, "w_s": w_scale, "w_z": np.zeros(n, np.int8),
        "b_q": rng.integers(-3000, 3000, n).astype(np.int32),   # bias: int32 at s_x * s_w
        "b_s": (x_s * w_scale).astype(np.float32), "b_z": np.zeros(n, np.int32),
        "y_s": np.float32(out_step), "y_z": np.int16(-7),
    }
    mm_out = "mm"
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"], axis=1),
        helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["bd"], axis=0),
        helper.make_node("MatMul", ["xd", "wd"], ["mm0"]),
        helper.make_node("Add", ["mm0", "bd"], [mm_out]),
    ]
    if relu:
        nodes.append(helper.make_node("Relu", [mm_out], ["act"]))
        mm_out = "act"
    nodes += [helper.make_node("QuantizeLinear", [mm_out, "y_s", "y_z"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"])]
    g = helper.make_graph(
        nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return model


def _compile(model: onnx.ModelProto, hw: str | None = None):
    with dsa_tvm.options(offload="all"):
        ex = dsa_tvm.compile(model, hw, verbose=False)
    return ex, dsa_tvm.last_compile_report()


def _run(ex, x: np.ndarray) -> np.ndarray:
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return out.numpy()


def run_one_wide_launch(ex, rep, *inputs: np.ndarray):
    """Run ``ex``: one DSA launch whose int16 output is bit-exact against the integer
    reference and stored by ACC16 (REQUANT's wide mode); (the result, the launch)."""
    assert [r.target for r in rep.regions] == ["dsa"], rep
    take_launches()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, inputs)).numpy()
    (launch,) = take_launches()
    (out,) = launch.outputs.values()
    assert out.dtype == np.int16
    want = run_region(rep.regions[0].region, launch.inputs)
    np.testing.assert_array_equal(out, next(iter(want.values())))
    assert any(isinstance(i, Store) and i.buffer == Buffer.ACC16
               for i in launch.program.instructions)
    return got, launch


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so).run(None, {"x": x})[0]


@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 70), n=st.integers(1, 40),
       seed=st.integers(0, 2 ** 16), tiny=st.booleans())
def test_int16_dense_output_is_bit_exact_and_matches_onnxruntime(m, k, n, seed, tiny):
    # a tiny output step saturates most outputs at the int16 ends: the clamp is tested too
    step = 1e-5 if tiny else 2e-3
    model = _wide_dense(m, k, n, seed, step)
    ex, rep = _compile(model)
    x = np.random.default_rng(seed + 1).standard_normal((m, k)).astype(np.float32) * 3
    got, _ = run_one_wide_launch(ex, rep, x)
    ref = _ort(model, x)      # saturates at the int16 ends as the wide REQUANT must
    assert np.abs(got - ref).max() <= step * 1.01   # (float32 dequantization ulps)


def test_int16_output_keeps_what_int8_cannot_hold():
    """The same dense with an int8 output saturates; the int16 one keeps the values."""
    model = _wide_dense(4, 64, 16, 3, out_step=2e-3)
    ex, _ = _compile(model)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32) * 3
    got, ref = _run(ex, x), _ort(model, x)
    assert np.abs(ref).max() > 127 * 2e-3 * 4       # far beyond an int8 grid of this step
    assert np.abs(got - ref).max() <= 2e-3 * (1 + 1e-3)


@pytest.mark.parametrize("what,reason", [
    ("relu", "int16 output"),
    ("wide_input", "an int16 input with zero point 3"),
])
def test_what_the_wide_mode_cannot_do_stays_on_the_cpu(what, reason):
    model = _wide_dense(3, 16, 8, 0, 2e-3, relu=what == "relu", wide_input=what == "wide_input")
    ex, rep = _compile(model)
    assert not [r for r in rep.regions if r.target == "dsa"]
    assert reason in str(rep)
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(ex, x), _ort(model, x), atol=1e-5)


def _wide_add(shape: tuple[int, ...], dtypes: tuple[str, str, str], scales, zps,
              broadcast: bool = False) -> onnx.ModelProto:
    """a, b -> Q/DQ (``dtypes[0]``, ``dtypes[1]``) -> Add -> Q/DQ ``dtypes[2]``."""
    np_t = {"int8": np.int8, "int16": np.int16}
    b_shape = shape[:2] + (1,) * (len(shape) - 2) if broadcast else shape
    inits, nodes = {}, []
    for name, dt, s, z in zip(("a", "b", "y"), dtypes, scales, zps):
        inits[f"{name}_s"], inits[f"{name}_z"] = np.float32(s), np_t[dt](z)
    for name in ("a", "b"):
        nodes += [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}q"]),
                  helper.make_node("DequantizeLinear", [f"{name}q", f"{name}_s", f"{name}_z"],
                                   [f"{name}d"])]
    nodes += [helper.make_node("Add", ["ad", "bd"], ["sum"]),
              helper.make_node("QuantizeLinear", ["sum", "y_s", "y_z"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"])]
    g = helper.make_graph(
        nodes, "wide_add",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(shape)),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return model


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 6), width=st.integers(1, 80),
       dtypes=st.sampled_from([("int16", "int16", "int16"), ("int8", "int16", "int16"),
                               ("int16", "int16", "int8"), ("int8", "int8", "int16")]),
       ratio=st.floats(0.01, 100.0), seed=st.integers(0, 2 ** 16))
def test_residual_add_on_int16_codes_is_bit_exact(rows, width, dtypes, ratio, seed):
    """The residual stream's add: int16 (or mixed) operands in the add room, widened by
    ACC16 loads, the sum stored as int16 (or int8), bit-exact against the reference."""
    rng = np.random.default_rng(seed)
    base = 1e-3
    scales = [base if d == "int16" else base * 256 for d in dtypes]
    scales[1] *= ratio
    model = _wide_add((rows, width), dtypes, scales, (5, -3, 2))
    ex, rep = _compile(model)
    assert [r.target for r in rep.regions] == ["dsa"], rep
    a = (rng.standard_normal((rows, width)) * 20).astype(np.float32)
    b = (rng.standard_normal((rows, width)) * 20 * ratio).astype(np.float32)
    take_launches()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(a),
                                                      tvm.runtime.tensor(b)).numpy()
    (launch,) = take_launches()
    want = run_region(rep.regions[0].region, launch.inputs)
    for name, out in launch.outputs.items():
        assert out.dtype == np.dtype(dtypes[2])
        np.testing.assert_array_equal(out, want[name])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), so).run(None, {"a": a, "b": b})[0]
    # within one output step of onnxruntime, plus the multipliers' rounding at their shared
    # shift n (half a unit of 2**-n each, times the operand's centred codes)
    (layer,) = rep.regions[0].region.layers
    n = int(layer.requant.shift[0])
    codes = sum(np.abs(launch.inputs[t.name].astype(np.int64) - t.zero_point)
                for t in (layer.a, layer.b))
    assert np.all(np.abs(got - ref) <= scales[2] * (1.01 + 0.5 * 2.0 ** -n * codes))


def test_an_int16_add_that_broadcasts_stays_on_the_cpu():
    """A per-channel broadcast the int8 add room takes is refused for int16 operands."""
    model = _wide_add((1, 16, 2, 2), ("int16", "int16", "int16"), (1e-3, 1e-3, 1e-3),
                      (0, 0, 0), broadcast=True)
    ex, rep = _compile(model)
    assert not [r for r in rep.regions if r.target == "dsa"]
    assert "a residual add" in str(rep)


def _widened(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """``model`` with the Q/DQ pair of ``tensor`` retyped to int16 (zero point 0, a step
    256 times finer): the wide residual stream's grid."""
    out = onnx.version_converter.convert_version(model, OPSET)   # int16 Q/DQ: opset 21
    del out.graph.value_info[:]   # the converter's inferred types say int8
    for init in out.graph.initializer:
        if init.name == f"{tensor}/zero_point":
            init.CopyFrom(numpy_helper.from_array(np.array(0, np.int16), init.name))
        elif init.name == f"{tensor}/scale":
            s = numpy_helper.to_array(init) / 256
            init.CopyFrom(numpy_helper.from_array(s.astype(np.float32), init.name))
    return out


def test_dense_int16_into_rmsnorm_in_one_region_is_bit_exact():
    """The LLM's pattern in miniature: a dense writes the int16 stream, the RMSNorm room
    reads it (ACC16 loads, NORM in_wide), a dense reads the int8 result; one launch,
    bit-exact, and closer to FP32 than the same model with the stream on int8."""
    from dsa_tvm.quant.api import quantize_onnx

    from .test_norm_models import FAST_DSA, _feeds, _model

    cfg = dsa_tvm.load_config("default").replace(norm_units=1, **FAST_DSA)
    fp32, feeds = _model("rmsnorm"), _feeds((1, 10, 40))
    int8 = quantize_onnx(fp32, feeds, show_progress=False, quantize_norms=True).model
    wide = _widened(int8, "l1.add")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = feeds[0]["x"]
    want = ort.InferenceSession(fp32.SerializeToString(), so).run(None, {"x": x})[0]
    err = {}
    for name, model in (("int8", int8), ("int16", wide)):
        ex = dsa_tvm.compile(model, cfg, verbose=False)
        rep = dsa_tvm.compile_report(ex)
        layers = [[type(ly).__name__ for ly in r.region.layers] for r in rep.regions
                  if r.target == "dsa"]
        assert layers == [["Dense", "RMSNorm", "Dense"]], str(rep.partition)
        take_launches()
        got = _run(ex, x)
        (launch,) = take_launches()
        ref = run_region(rep.regions[0].region, launch.inputs)
        for k, v in launch.outputs.items():
            np.testing.assert_array_equal(v, ref[k])
        err[name] = float(np.abs(got - want).max())
        if name == "int16":
            norms = [i for i in launch.program.instructions if type(i).__name__ == "Norm"]
            assert norms and all(n.in_wide for n in norms)
    assert err["int16"] <= err["int8"] * 1.05, err
