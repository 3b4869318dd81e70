"""Conv1d and ConvTranspose2d models end to end: torch -> ONNX -> dsa_tvm.quantize -> compile.

Prints per model: % of MACs on the DSA (every MAC op counted in the denominator,
conv1d and conv_transpose included), DSA launches, what stays on the CPU and the
largest output difference (in output quantization steps) against TVM's llvm build
of the same quantized module.

    PYTHONPATH=$PWD python benchmarks/bench_conv_models.py
"""

from __future__ import annotations

import io
import sys

import numpy as np
import onnx
import torch
import tvm
from torch import nn
from tvm import relax

import dsa_tvm
from dsa_tvm.quant import quantize_onnx


class Audio1d(nn.Module):
    """A keyword-spotting-like Conv1d stack: stem stride 2, dilated, depthwise, pointwise."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(16, 32, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv1d(32, 32, 3, padding=2, dilation=2), nn.ReLU(),
            nn.Conv1d(32, 32, 3, padding=1, groups=32), nn.ReLU6(),
            nn.Conv1d(32, 64, 1), nn.ReLU(),
            nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU())

        self.res = nn.Conv1d(64, 64, 3, padding=1)
        self.head = nn.Conv1d(64, 12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return self.head(torch.relu(self.res(y) + y))


class TinyUNet(nn.Module):
    """Down by a stride-2 conv, up by ConvTranspose2d, then a skip add and a head conv."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.down = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.head = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.enc(x)
        return self.head(torch.relu(self.up(self.down(e))) + e)


MODELS = {"audio_conv1d": (Audio1d, (1, 16, 128)), "tiny_unet": (TinyUNet, (1, 8, 16, 16))}


def export(net: nn.Module, shape: tuple[int, ...]) -> onnx.ModelProto:
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(net.eval(), (torch.randn(*shape),), buf, opset_version=13, dynamo=False,
                      input_names=["x"], output_names=["y"])
    return onnx.load_from_string(buf.getvalue())


def measure(name: str) -> dict:
    """Quantize, compile for ``default`` and run one model; the numbers the table prints."""
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = export(cls(), shape)
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    qm = quantize_onnx(model, calib, show_progress=False)
    mod = qm.to_relax()
    dsa_tvm.setup()
    ex = tvm.compile(mod, target=dsa_tvm.target("default"))
    rep = dsa_tvm.compile_report(ex)
    ref = relax.VirtualMachine(tvm.compile(qm.to_relax(), target="llvm"), tvm.cpu())
    x = calib[0]["x"]
    y = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    y_ref = ref["main"](tvm.runtime.tensor(x)).numpy()
    out_scale = _output_scale(qm.model)
    dsa = sum(r.macs for r in rep.regions if r.target == "dsa")
    cpu = sum(r.macs for r in rep.regions if r.target != "dsa") + \
        sum(op.macs for op in rep.partition.cpu_ops)
    return {"model": name, "macs": dsa + cpu, "dsa_pct": 100.0 * dsa / max(dsa + cpu, 1),
            "launches": sum(r.target == "dsa" for r in rep.regions),
            "steps": float(np.abs(y - y_ref).max() / out_scale),
            "cpu": sorted({f"{op.op.replace('relax.', '')}: {op.reason[:90]}"
                           for op in rep.partition.cpu_ops if op.macs})}


def _output_scale(model: onnx.ModelProto) -> float:
    """The scale of the last DequantizeLinear (the graph output's quantization step)."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    consts = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
              for n in model.graph.node if n.op_type == "Constant"}
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    return float({**consts, **inits}[last.input[1]].reshape(-1)[0])


def main(argv: list[str]) -> None:
    names = argv or list(MODELS)
    print(f"{'model':<14} {'MACs':>10} {'on DSA':>7} {'launches':>8} {'steps vs llvm':>13}")
    for n in names:
        r = measure(n)
        print(f"{r['model']:<14} {r['macs']:>10,} {r['dsa_pct']:>6.1f}% {r['launches']:>8} "
              f"{r['steps']:>13.1f}")
        for c in r["cpu"]:
            print(f"    CPU {c}")


if __name__ == "__main__":
    main(sys.argv[1:])
