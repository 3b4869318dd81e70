"""Front end of softmax / layer_norm / rms_norm (relay_passes/kinds/rownorm.py): hand-made
QDQ ONNX graphs (as exporters give them) are matched, read back into integer layers
whose reference is within a step or two of float math on the same int8 codes; without
[norm] units they stay on the CPU with the reason, with them the check passes."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

from dsa_tvm.hw.config import load_config  # noqa: E402
from dsa_tvm.layers.ir import LayerNorm, RMSNorm, Softmax  # noqa: E402
from relay_passes.kinds import check, describe, layer_from_match  # noqa: E402
from relay_passes.kinds.match import qtensor  # noqa: E402
from relay_passes.partition import partition_for_dsa  # noqa: E402
from tir_schedules.kinds import run_layer  # noqa: E402

from .. import qdq_models as qm  # noqa: E402

S_IN, S_OUT = 0.04, 0.03
N = 40


def _model(kind: str, shape: tuple[int, ...]):
    """x -> Q/DQ -> <kind> -> Q/DQ -> y, the op written as ONNX exporters write it."""
    rng = np.random.default_rng(0)
    gamma = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
    beta = rng.normal(0, 0.2, shape[-1]).astype(np.float32)
    s_out, zp_out = (1 / 256, -128) if kind == "softmax" else (S_OUT, 0)
    inits = {"s_in": np.float32(S_IN), "zp_in": np.int8(0), "s_out": np.float32(s_out),
             "zp_out": np.int8(zp_out), "gamma": gamma, "beta": beta, "two": np.float32(2.0),
             "eps": np.float32(1e-5), "one": np.float32(1.0)}
    n = qm.node
    nodes = [n("QuantizeLinear", ["x", "s_in", "zp_in"], ["xq"]),
             n("DequantizeLinear", ["xq", "s_in", "zp_in"], ["xd"])]
    if kind == "softmax":
        nodes += [n("Softmax", ["xd"], ["h"], axis=-1)]
    elif kind == "layernorm":
        nodes += [n("LayerNormalization", ["xd", "gamma", "beta"], ["h"], axis=-1, epsilon=1e-5)]
    elif kind == "layernorm_decomposed":
        nodes += [n("ReduceMean", ["xd"], ["mu"], axes=[-1], keepdims=1),
                  n("Sub", ["xd", "mu"], ["d"]), n("Pow", ["d", "two"], ["d2"]),
                  n("ReduceMean", ["d2"], ["var"], axes=[-1], keepdims=1),
                  n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
                  n("Div", ["d", "sd"], ["nd"]), n("Mul", ["nd", "gamma"], ["g"]),
                  n("Add", ["g", "beta"], ["h"])]
    elif kind == "rmsnorm_rsqrt":  # torch.rsqrt as exported: x * (1 / sqrt(...)) * weight
        nodes += [n("Pow", ["xd", "two"], ["x2"]),
                  n("ReduceMean", ["x2"], ["ms"], axes=[-1], keepdims=1),
                  n("Add", ["ms", "eps"], ["me"]), n("Sqrt", ["me"], ["rt"]),
                  n("Div", ["one", "rt"], ["inv"]), n("Mul", ["xd", "inv"], ["nd"]),
                  n("Mul", ["nd", "gamma"], ["h"])]
    else:  # rmsnorm (Llama): x * 1/sqrt(mean(x^2) + eps) * weight
        nodes += [n("Pow", ["xd", "two"], ["x2"]),
                  n("ReduceMean", ["x2"], ["ms"], axes=[-1], keepdims=1),
                  n("Add", ["ms", "eps"], ["me"]), n("Sqrt", ["me"], ["rt"]),
                  n("Div", ["xd", "rt"], ["nd"]), n("Mul", ["nd", "gamma"], ["h"])]
    nodes += [n("QuantizeLinear", ["h", "s_out", "zp_out"], ["hq"]),
              n("DequantizeLinear", ["hq", "s_out", "zp_out"], ["y"])]
    return qm.make_model(nodes, inits, {"x": shape}, {"y": shape}), gamma, beta


def _float(kind, x, gamma, beta):
    if kind == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if kind.startswith("rmsnorm"):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * gamma
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta


def _last_quantize(mod):
    binds, last = {}, None
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            binds[b.var] = b.value
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == \
                    "relax.quantize":
                last = b.value
    return last, binds


KINDS = {"softmax": ("softmax", Softmax), "layernorm": ("layer_norm", LayerNorm),
         "layernorm_decomposed": ("layer_norm", LayerNorm), "rmsnorm": ("rms_norm", RMSNorm),
         "rmsnorm_rsqrt": ("rms_norm", RMSNorm)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("shape", [(3, N), (2, 3, 17)])
def test_match_reads_back_to_integer_layer(kind, shape):
    model, gamma, beta = _model(kind, shape)
    mod = from_onnx(model, keep_params_in_input=False)
    root, binds = _last_quantize(mod)
    name, layer_type = KINDS[kind]
    m = describe(name, root, binds)
    ins = [qtensor("x", op.shape, op.qp) for op in m.inputs]
    layer = layer_from_match(m, "ly", ins, qtensor("y", m.out_shape, m.out))
    assert isinstance(layer, layer_type)
    q = np.random.default_rng(1).integers(-128, 128, shape).astype(np.int8)
    got = run_layer(layer, {"x": q}).astype(np.float64)
    out = layer.output
    f = _float(kind, S_IN * q.astype(np.float64), gamma[: shape[-1]], beta[: shape[-1]])
    want = np.clip(np.round(f / out.scale) + out.zero_point, -128, 127)
    assert np.abs(got - want).max() <= 1
    ok, why = check(m, load_config("default").replace(norm_units=0))
    assert not ok and "no [norm] units" in why
    ok, why = check(m, load_config("default").replace(norm_units=1))
    assert ok, why


@pytest.mark.parametrize("kind", list(KINDS))
def test_partition_reports_the_norm_unit_reason(kind):
    """Through the partitioner (which gives each reader of a tensor its own dequantize)."""
    model, _, _ = _model(kind, (3, N))
    _, report = partition_for_dsa(from_onnx(model, keep_params_in_input=False),
                                  load_config("default").replace(norm_units=0))
    want = f"dsa.{KINDS[kind][0]}"
    assert any(want in c.reason and "no [norm] units" in c.reason for c in report.cpu_ops), \
        report


def test_softmax_over_other_axis_is_not_a_match():
    model, _, _ = _model("softmax", (3, N))
    model.graph.node[2].attribute[0].i = 0
    mod = from_onnx(model, keep_params_in_input=False)
    root, binds = _last_quantize(mod)
    with pytest.raises(ValueError):
        describe("softmax", root, binds)
