"""Post-training quantization of an FP32 Relax module (dsa_tvm.quant.relax_quantize).

Checked against independent references: scales and integers recomputed with numpy
from the FP32 weights and the FP32 activations; the quantized module offloaded to
the DSA with every launch bit-exact against the integer reference; the int8 output
close to the FP32 one."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx
from tvm.script import ir as I

import dsa_tvm
from dsa_tvm.models import calibration_data, get_model
from dsa_tvm.quant.metrics import cosine
from dsa_tvm.quant.relax_quantize import quantize_relax
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

from .. import qdq_models as qm

SLOW_HOST_GMACS = 0.01  # the cost model then offloads even these tiny layers


def _run(ex, x: np.ndarray) -> np.ndarray:
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _on_dsa(model, qmod, hw: str = "default"):
    """Compile ``qmod`` for the DSA (slow host), run one input; the layers, launches,
    int8 output and FP32 output."""
    cfg = dsa_tvm.load_config(hw).replace(cpu_gmacs=SLOW_HOST_GMACS)
    ex = tvm.compile(qmod, target=dsa_tvm.target(cfg))
    rep = dsa_tvm.last_compile_report()
    (name, x), = calibration_data(model, n=1, seed=99)[0].items()
    take_launches()
    got = _run(ex, x)
    launches = take_launches()
    want = _run(tvm.compile(from_onnx(model, keep_params_in_input=False), target="llvm"), x)
    layers = [ly for d in rep.regions if d.target == "dsa" for ly in d.region.layers]
    return layers, launches, got, want


def _bit_exact(launches, regions) -> None:
    """Every DSA launch equals the integer reference of its region."""
    assert launches, "nothing ran on the DSA"
    by_name = {r.name: r for r in regions}
    for la in launches:
        want = run_region(by_name[la.program.name], la.inputs)
        for name, got in la.outputs.items():
            np.testing.assert_array_equal(got, want[name], err_msg=f"{la.program.name}:{name}")


def _regions():
    return [d.region for d in dsa_tvm.last_compile_report().regions if d.target == "dsa"]


@pytest.fixture(scope="module")
def small_cnn():
    m = get_model("small_cnn", quantized=False)
    mod = from_onnx(m, keep_params_in_input=False)
    qmod, plan = quantize_relax(mod, calibration_data(m, n=8, seed=0))
    return m, qmod, plan


def test_small_cnn_offloads_bit_exact_and_close_to_fp32(small_cnn):
    m, qmod, plan = small_cnn
    layers, launches, got, want = _on_dsa(m, qmod)
    kinds = [type(ly).__name__ for ly in layers]
    assert kinds.count("Conv2d") == 5 and "Add" in kinds and "Pool2d" in kinds, kinds
    assert "GlobalAvgPool" in kinds and "Dense" in kinds, kinds
    _bit_exact(launches, _regions())
    assert cosine(got, want) >= 0.999


def test_other_calibration_methods(small_cnn):
    m = small_cnn[0]
    mod = from_onnx(m, keep_params_in_input=False)
    feeds = calibration_data(m, n=2, seed=0)
    (name, x), = calibration_data(m, n=1, seed=99)[0].items()
    want = _run(tvm.compile(mod, target="llvm"), x)
    for method in ("percentile", "mse"):  # entropy: see tests/quant/test_quant_units.py
        qmod, _ = quantize_relax(mod, feeds, method=method)
        got = _run(tvm.compile(qmod, target="llvm"), x)
        assert cosine(got, want) >= 0.99, method


def _conv_relu_net(rng, c=4, o=6, hw=5):
    """x -> 1x1 conv (bias) -> relu: numpy can redo every number."""
    w = rng.normal(0, 0.5, (o, c, 1, 1)).astype(np.float32)
    w[0] *= 8  # channel scales must differ
    b = rng.normal(0, 0.3, o).astype(np.float32)
    model = qm.make_model([qm.node("Conv", ["x", "W", "B"], ["c"]), qm.node("Relu", ["c"], ["y"])],
                          {"W": w, "B": b}, {"x": (1, c, hw, hw)}, {"y": None})
    return model, w, b


@pytest.mark.parametrize("correct", [False, True])
def test_scales_and_integers_match_numpy(correct):
    """Weights, bias, input and output qparams redone in numpy; with bias correction the
    bias also cancels the mean shift of the rounded weights (sum_c dW[o, c] * E[x_c])."""
    rng = np.random.default_rng(3)
    model, w, b = _conv_relu_net(rng)
    feeds = [{"x": rng.normal(0.3, 1.0, (1, 4, 5, 5)).astype(np.float32)} for _ in range(3)]
    qmod, plan = quantize_relax(from_onnx(model, keep_params_in_input=False), feeds,
                                bias_correction=correct)
    consts = {}

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.dequantize" and \
                not isinstance(e.args[0], relax.Var):
            consts[str(e.args[0].value.numpy().dtype)] = (e.args[0].value.numpy(),
                                                         e.args[1].value.numpy())

    relax.analysis.post_order_visit(qmod["main"].body, visit)
    wq, ws = consts["int8"]
    np.testing.assert_allclose(ws, np.abs(w).reshape(6, -1).max(1) / 127, rtol=1e-6)
    np.testing.assert_array_equal(wq, np.round(w / ws.reshape(6, 1, 1, 1)).astype(np.int8))
    xs = np.concatenate([f["x"] for f in feeds])
    sx = (max(xs.max(), 0) - min(xs.min(), 0)) / 255
    bq, bs = consts["int32"]
    np.testing.assert_allclose(bs, np.float32(sx) * ws, rtol=1e-5)
    shift = 0.0
    if correct:
        dw = (wq.astype(np.float64) * ws.reshape(6, 1, 1, 1) - w)[:, :, 0, 0]
        shift = dw @ xs.mean(axis=(0, 2, 3), dtype=np.float64)
    np.testing.assert_array_equal(bq, np.round((b - shift) / bs).astype(np.int32))
    qs = {}

    def visit_q(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.quantize":
            qs[len(qs)] = (float(e.args[1].value.numpy()), int(e.args[2].value.numpy()))

    relax.analysis.post_order_visit(qmod["main"].body, visit_q)
    (s_in, z_in), (s_out, z_out) = qs[0], qs[1]
    assert s_in == pytest.approx(sx, rel=1e-6) and z_in == round(-128 - xs.min() / sx)
    y = np.maximum(np.einsum("nchw,oc->nohw", xs, w[:, :, 0, 0]) + b[None, :, None, None], 0)
    assert s_out == pytest.approx(y.max() / 255, rel=1e-5) and z_out == -128


def test_transformer_matmuls_on_the_dsa():
    m = get_model("transformer_encoder", quantized=False, seq_len=16, hidden=64, heads=2, ffn=128)
    qmod, plan = quantize_relax(from_onnx(m, keep_params_in_input=False),
                                calibration_data(m, n=4, seed=0))
    layers, launches, got, want = _on_dsa(m, qmod)
    kinds = [type(ly).__name__ for ly in layers]
    assert kinds.count("Dense") == 6 and kinds.count("BatchMatmul") == 2, kinds
    _bit_exact(launches, _regions())
    assert cosine(got, want) >= 0.99


def test_refuses_qdq_and_keeps_layers_in_fp32(small_cnn):
    m = small_cnn[0]
    with pytest.raises(ValueError, match="already quantized"):
        quantize_relax(from_onnx(get_model("small_cnn"), keep_params_in_input=False),
                       calibration_data(m, n=1))
    mod = from_onnx(m, keep_params_in_input=False)
    first = small_cnn[2].chains[0].anchor.name
    qmod, plan = quantize_relax(mod, calibration_data(m, n=2, seed=0), keep_fp32={first})
    assert first in plan.kept_fp32 and first not in [c.anchor.name for c in plan.chains]
    layers, *_ = _on_dsa(m, qmod)
    assert [type(ly).__name__ for ly in layers].count("Conv2d") == 4


@pytest.mark.parametrize("conv_bias", [True, False])
def test_batch_norm_folds_into_the_conv(conv_bias):
    """conv (+ bias) -> BatchNormalization -> ReLU: one DSA conv whose int8 weights are
    the batch-norm-scaled FP32 weights, output close to FP32."""
    rng = np.random.default_rng(4)
    w = rng.normal(0, 0.5, (6, 3, 3, 3)).astype(np.float32)
    g, beta = rng.uniform(0.5, 2, 6).astype(np.float32), rng.normal(0, 0.3, 6).astype(np.float32)
    mean, var = rng.normal(0, 0.3, 6).astype(np.float32), rng.uniform(0.5, 2, 6).astype(np.float32)
    inits = {"W": w, "g": g, "b": beta, "m": mean, "v": var}
    ins = ["x", "W"]
    if conv_bias:
        inits["B"] = rng.normal(0, 0.5, 6).astype(np.float32)
        ins.append("B")
    model = qm.make_model([qm.node("Conv", ins, ["c"], pads=[1, 1, 1, 1]),
                           qm.node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
                           qm.node("Relu", ["n"], ["y"])], inits, {"x": (1, 3, 8, 8)}, {"y": None})
    feeds = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    qmod, plan = quantize_relax(from_onnx(model, keep_params_in_input=False), feeds)
    (c,) = plan.chains
    folded = w * (g / np.sqrt(var + 1e-5))[:, None, None, None]
    ws = np.abs(folded).reshape(6, -1).max(1) / 127
    found = []
    relax.analysis.post_order_visit(qmod["main"].body, lambda e: found.append(e.args[1].value.numpy())
                                    if getattr(getattr(e, "op", None), "name", "") == "relax.dequantize"
                                    and not isinstance(e.args[0], relax.Var)
                                    and e.args[0].value.numpy().dtype == np.int8 else None)
    np.testing.assert_allclose(found[0], ws, rtol=1e-5)
    layers, launches, got, want = _on_dsa(model, qmod)
    assert [type(ly).__name__ for ly in layers] == ["Conv2d"]
    _bit_exact(launches, _regions())
    assert cosine(got, want) >= 0.999


def test_integer_inputs_keep_their_dtype():
    """Token ids (int64) reach calibration as int64: ``dsa_tvm.quantize`` feeds every input
    in the dtype ``main`` declares (a float32 copy is refused by the VM), float arrays
    of whole numbers included; the embedding's dense layer is quantized."""
    from tvm.script import relax as R

    rng = np.random.default_rng(5)
    table = rng.normal(0, 1, (16, 8)).astype(np.float32)
    w = rng.normal(0, 0.5, (8, 4)).astype(np.float32)

    @I.ir_module
    class Tokens:
        @R.function
        def main(ids: R.Tensor((1, 6), "int64")):
            with R.dataflow():
                e = R.take(R.const(table), ids, axis=0)
                y = R.matmul(e, R.const(w))
                R.output(y)
            return y

    calib = [rng.integers(0, 16, (1, 6)) for _ in range(3)]
    calib.append(calib[0].astype(np.float32))  # ids as floats: cast back to int64
    qmod = dsa_tvm.quantize(Tokens, calib, verbose=False, show_progress=False)
    assert [p.ty.dtype for p in qmod["main"].params] == ["int64"]
    ids = calib[1]
    got = relax.VirtualMachine(tvm.compile(qmod, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(ids)).numpy()
    assert cosine(got, table[ids] @ w) >= 0.99
