"""QOperator int8 ResNet-18 (onnxruntime quantize_static, QOperator, per-channel int8 weights)
rewritten to QDQ and compiled for the DSA: share of MACs on the DSA and agreement with
onnxruntime running the QOperator model (graph optimizations off), in output steps.

    python benchmarks/bench_qoperator.py                 # 16 inputs, uint8 and int8 activations
    python benchmarks/bench_qoperator.py --inputs 64 --preset edge
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.frontend.qoperator import to_qdq
from dsa_tvm.models import calibration_data, resnet18, run_onnxruntime
from dsa_tvm.models.quantize import _reader


def qoperator_quantize(model: onnx.ModelProto, calib, activations: str) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "qop.onnx"
        onnx.save(model, src)
        quantize_static(str(src), str(dst), _reader(calib), quant_format=QuantFormat.QOperator,
                        per_channel=True, weight_type=QuantType.QInt8,
                        activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8)
        return onnx.load(str(dst))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=16)
    ap.add_argument("--preset", default="default")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # ORT's quantizer warns about pre-processing
    fp32 = resnet18(input_size=32, width=16, num_classes=100)
    # a slow host: every region is worth offloading (the point is the rewrite, not the cost model)
    cfg = dsa_tvm.load_config(args.preset).replace(cpu_gmacs=0.01)
    feeds = calibration_data(fp32, n=args.inputs, seed=21)
    for act in ("uint8", "int8"):
        qop = qoperator_quantize(fp32, calibration_data(fp32, n=4), act)
        t = time.perf_counter()
        qdq, notes = to_qdq(qop)
        t_rewrite = time.perf_counter() - t
        ex = tvm.compile(from_onnx(qdq, keep_params_in_input=False), target=dsa_tvm.target(cfg))
        rep = dsa_tvm.last_compile_report()
        dsa = sum(d.macs for d in rep.regions if d.target == "dsa")
        total = dsa + sum(d.macs for d in rep.regions if d.target != "dsa") + sum(
            op.macs for op in rep.partition.cpu_ops)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        got = np.stack([vm["main"](tvm.runtime.tensor(f["input"])).numpy() for f in feeds])
        ref = np.stack([run_onnxruntime(qop, f, optimize=False)[0] for f in feeds])
        (out,) = qop.graph.output
        dq = next(n for n in qop.graph.node if out.name in n.output)
        step = float(onnx.numpy_helper.to_array(
            next(i for i in qop.graph.initializer if i.name == dq.input[1])))
        d = np.abs(got.astype(np.float64) - ref) / step
        print(f"ResNet-18 QOperator, {act} activations, '{cfg.name}': rewrite {t_rewrite * 1e3:.0f} ms; "
              f"{dsa / total:.2%} of {total:,} MACs on the DSA; vs ORT: max {d.max():.2f} steps, "
              f"{(d > 0.5).mean():.2%} of {d.size} outputs differ")
        for n in notes:
            print("   ", n)


if __name__ == "__main__":
    main()
