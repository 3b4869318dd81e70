"""Helpers the QOperator tests share: ORT's quantizers, compiling and running a model,
output steps and the share of MACs on the DSA."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.models.quantize import _reader

#: a host slow enough that every region of these small models is worth offloading
SLOW_HOST_GMACS = 0.01
#: one-op models whose op has a DSA pattern (the rest run on the CPU by design)
OFFLOADED = {"QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearMul",
             "QLinearSigmoid", "QLinearLeakyRelu",  # activation tables
             "QLinearGlobalAveragePool", "QLinearAveragePool"}


def ort_quantize(model: onnx.ModelProto, feeds, act: str, dynamic: bool = False) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    with tempfile.TemporaryDirectory(prefix="dsa_tvm_qop_") as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "qop.onnx"
        onnx.save(model, src)
        if dynamic:
            quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
        else:
            quantize_static(str(src), str(dst), _reader(feeds), quant_format=QuantFormat.QOperator,
                            per_channel=True, weight_type=QuantType.QInt8,
                            activation_type=QuantType.QUInt8 if act == "u8" else QuantType.QInt8)
        return onnx.load(str(dst))


def run(ex, feed: dict[str, np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feed.values()])
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def compile_for(model: onnx.ModelProto, target="dsa"):
    if target == "dsa":
        target = dsa_tvm.target(dsa_tvm.load_config("default").replace(cpu_gmacs=SLOW_HOST_GMACS))
    ex = tvm.compile(from_onnx(model, keep_params_in_input=False), target=target)
    return ex, (dsa_tvm.last_compile_report() if target != "llvm" else None)


def steps(got: np.ndarray, ref: np.ndarray, step: float) -> tuple[float, float]:
    """(max difference in output steps, fraction of outputs that differ)."""
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64)) / step
    return float(d.max()), float((d > 0.5).mean())


def mac_share(report) -> float:
    dsa = sum(d.macs for d in report.regions if d.target == "dsa")
    cpu = sum(d.macs for d in report.regions if d.target != "dsa")
    cpu += sum(op.macs for op in report.partition.cpu_ops)
    return dsa / (dsa + cpu) if dsa + cpu else 0.0
