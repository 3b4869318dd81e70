"""Whole QOperator models through the rewrite: ORT's QOperator ResNet-18 (uint8 and int8
activations) must import, run 100% of its MACs on the DSA, be bit-exact per launch and stay
within one output step of onnxruntime (optimizations off); a torch ResNet and an encoder
block too. One-op models and the integer ops are in test_qoperator.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.frontend.qoperator import has_qoperator, to_qdq
from dsa_tvm.models import calibration_data, resnet18, run_onnxruntime, transformer_encoder
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

from .qop_harness import (
    SLOW_HOST_GMACS,
    compile_for,
    mac_share,
    ort_quantize,
    run,
    steps,
)
from .qop_models import torch_resnet

# ----------------------------------------------------------------------------- ResNet-18


@dataclass
class Net:
    qop: onnx.ModelProto
    qdq: onnx.ModelProto
    notes: list[str]
    report: object
    launches: list
    got: list[np.ndarray]
    ref: list[np.ndarray]
    step: float


@pytest.fixture(scope="module")
def resnet_fp32():
    m = resnet18(input_size=32, width=16, num_classes=100)
    return m, calibration_data(m, n=4)


def _output_step(qop: onnx.ModelProto) -> float:
    (out,) = qop.graph.output
    dq = next(n for n in qop.graph.node if out.name in n.output)
    assert dq.op_type == "DequantizeLinear"
    return float(numpy_helper.to_array(next(i for i in qop.graph.initializer if i.name == dq.input[1])))


@pytest.fixture(scope="module", params=["u8", "s8"])
def resnet(request, resnet_fp32) -> Net:
    fp32, calib = resnet_fp32
    qop = ort_quantize(fp32, calib, request.param)
    qdq, notes = to_qdq(qop)
    ex, report = compile_for(qdq)
    feeds = calibration_data(fp32, n=4, seed=21)
    take_launches()
    got = [run(ex, f) for f in feeds]
    launches = take_launches()
    ref = [run_onnxruntime(qop, f, optimize=False)[0] for f in feeds]
    return Net(qop, qdq, notes, report, launches, got, ref, _output_step(qop))


def test_tvm_importer_rejects_qoperator(resnet):
    """Why the rewrite exists: TVM 0.27 cannot import what ORT's QOperator quantizer writes."""
    assert has_qoperator(resnet.qop) and not has_qoperator(resnet.qdq)
    with pytest.raises(Exception, match="QLinearConv"):
        from_onnx(resnet.qop, keep_params_in_input=False)


def test_resnet_notes_say_what_was_rewritten(resnet):
    text = "\n".join(resnet.notes)
    assert "QLinearConv x20" in text and "QLinearAdd x8" in text and "QGemm x1" in text
    assert "QLinearGlobalAveragePool x1" in text and "MaxPool x1" in text
    ops = {n.op_type for n in resnet.qdq.graph.node}
    assert not {op for op in ops if op.startswith("Q") and op != "QuantizeLinear"}
    if any(i.data_type == TensorProto.UINT8 for i in resnet.qop.graph.initializer):
        assert "uint8 -> int8" in text
    # every quantized activation is int8 now: what the DSA's patterns match
    zps = {i.name: i.data_type for i in resnet.qdq.graph.initializer}
    for n in resnet.qdq.graph.node:
        if n.op_type == "QuantizeLinear":
            assert zps[n.input[2]] == TensorProto.INT8, n.name


def test_resnet_all_macs_on_the_dsa(resnet):
    share = mac_share(resnet.report)
    print(f"QOperator ResNet-18: {share:.2%} of MACs on the DSA")
    assert share == 1.0, str(resnet.report)
    convs = [ly for d in resnet.report.regions if d.target == "dsa" for ly in d.region.layers
             if type(ly).__name__ == "Conv2d"]
    assert len(convs) == 20


def test_resnet_launches_bit_exact(resnet):
    regions = {d.name: d.region for d in resnet.report.regions if d.target == "dsa"}
    assert resnet.launches
    for launch in resnet.launches:
        want = run_region(regions[launch.program.name], launch.inputs)
        for name, got in launch.outputs.items():
            np.testing.assert_array_equal(got, want[name], err_msg=f"{launch.program.name}:{name}")


def test_resnet_within_one_step_of_onnxruntime(resnet):
    """DSA requantize rounds half up, ORT half to even: ties may differ by one step."""
    got, ref = np.stack(resnet.got), np.stack(resnet.ref)
    assert np.ptp(ref) > 10 * resnet.step, "a near-constant output proves nothing"
    worst, frac = steps(got, ref, resnet.step)
    print(f"QOperator ResNet-18 on the DSA vs ORT (QOperator, optimizations off): max {worst:.2f} "
          f"steps, {frac:.4f} of {got.size} outputs differ")
    assert worst <= 1.0 + 1e-3 and frac < 0.05


def test_rewritten_graph_on_ort_equals_qoperator(resnet, resnet_fp32):
    """The QDQ graph itself (ORT, optimizations off) computes what the QOperator model does."""
    for f in calibration_data(resnet_fp32[0], n=2, seed=5):
        a = run_onnxruntime(resnet.qop, f, optimize=False)[0]
        b = run_onnxruntime(resnet.qdq, f, optimize=False)[0]
        assert steps(a, b, resnet.step)[0] <= 1.0 + 1e-3


def test_torch_resnet_qoperator_on_the_dsa():
    """A ResNet written in torch, exported, quantized by ORT (QOperator, per-channel, uint8
    activations): imports, every MAC on the DSA, within one step of ORT."""
    pytest.importorskip("torch")
    fp32 = torch_resnet()
    qop = ort_quantize(fp32, calibration_data(fp32, n=4), "u8")
    assert {"QLinearConv", "QLinearAdd", "QGemm"} <= {n.op_type for n in qop.graph.node}
    qdq, _ = to_qdq(qop)
    ex, report = compile_for(qdq)
    assert mac_share(report) == 1.0, str(report)
    feeds = calibration_data(fp32, n=2, seed=9)
    got = np.stack([run(ex, f) for f in feeds])
    ref = np.stack([run_onnxruntime(qop, f, optimize=False)[0] for f in feeds])
    step = _output_step(qop)
    assert np.ptp(ref) > 10 * step
    worst, frac = steps(got, ref, step)
    print(f"torch ResNet (QOperator) on the DSA vs ORT: max {worst:.2f} steps, {frac:.4f} of "
          f"{got.size} differ")
    assert worst <= 1.0 + 1e-3 and frac < 0.05


def test_transformer_encoder_qoperator_on_the_dsa():
    """ORT's QOperator encoder block: QLinearMatMul (projections and both attention matmuls),
    QLinearAdd/Mul, QLinearSoftmax (its shape known only once the ops before it are plain
    ONNX): every MAC on the DSA, output (after a float LayerNorm) matching ORT."""
    fp32 = transformer_encoder(seq_len=16, hidden=64, heads=2, ffn=128)
    qop = ort_quantize(fp32, calibration_data(fp32, n=4), "u8")
    assert {"QLinearMatMul", "QLinearSoftmax"} <= {n.op_type for n in qop.graph.node}
    qdq, notes = to_qdq(qop)
    assert any("QLinearSoftmax x1" in n for n in notes)
    # ORT's float LayerNorm is the reference here: a part without [norm] units keeps it so
    no_norm = dsa_tvm.load_config("default").replace(cpu_gmacs=SLOW_HOST_GMACS, norm_units=0)
    ex, report = compile_for(qdq, dsa_tvm.target(no_norm))
    assert mac_share(report) == 1.0, str(report)
    ex_norm, report_norm = compile_for(qdq)  # the default part runs it as an integer norm
    assert "LayerNorm" in [type(ly).__name__ for d in report_norm.regions if d.target == "dsa"
                         for ly in d.region.layers], str(report_norm)
    for f in calibration_data(fp32, n=2, seed=21):
        ref = run_onnxruntime(qop, f, optimize=False)[0]
        got = run(ex, f)
        print(f"encoder: max |DSA - ORT| {np.abs(got - ref).max():.2e} (output range {np.ptp(ref):.2f})")
        np.testing.assert_allclose(got, ref, atol=1e-3 * np.ptp(ref))
        g2 = run(ex_norm, f)
        assert float((g2 * ref).sum() / np.linalg.norm(g2) / np.linalg.norm(ref)) > 0.999
