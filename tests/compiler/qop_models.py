"""Tiny QOperator int8 models written by hand: float input -> QuantizeLinear -> one
QOperator node -> DequantizeLinear -> float output, with seeded integer weights and the
scales and zero points a test chooses (uint8 or int8 activations)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
OPSET = 17


@dataclass
class QParams:
    scale: float
    zp: int


@dataclass
class OneOp:
    model: onnx.ModelProto
    feed: dict[str, np.ndarray]
    step: float          # output quantization step
    op: str


class Builder:
    def __init__(self, dtype: str, seed: int = 0):
        self.np_dtype = np.uint8 if dtype == "u8" else np.int8
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def const(self, v: np.ndarray, base: str = "c") -> str:
        self.n += 1
        name = f"{base}{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(v), name))
        return name

    def sz(self, qp: QParams) -> tuple[str, str]:
        return (self.const(np.array(qp.scale, np.float32), "s"),
                self.const(np.array(qp.zp, self.np_dtype), "z"))

    def quantize(self, x: str, qp: QParams) -> tuple[str, str, str]:
        s, z = self.sz(qp)
        out = f"{x}_q"
        self.nodes.append(helper.make_node("QuantizeLinear", [x, s, z], [out]))
        return out, s, z

    def node(self, op: str, inputs: list[str], domain: str = "", **attrs) -> str:
        self.n += 1
        out = f"{op.lower()}{self.n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{self.n}", domain=domain, **attrs))
        return out

    def model(self, inputs: dict[str, tuple], y: str, yq: QParams | None) -> onnx.ModelProto:
        if yq is not None:
            s, z = self.sz(yq)
            self.nodes.append(helper.make_node("DequantizeLinear", [y, s, z], ["out"]))
        else:
            self.nodes.append(helper.make_node("Identity", [y], ["out"]))
        g = helper.make_graph(
            self.nodes, "qop",
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET),
                                                helper.make_opsetid(MS, 1)])
        m.ir_version = 8
        return m


def _act(b: Builder, scale_rng=(0.03, 0.06)) -> QParams:
    lo, hi = (0, 255) if b.np_dtype == np.uint8 else (-128, 127)
    return QParams(float(b.rng.uniform(*scale_rng)), int(b.rng.integers(lo + 40, hi - 40)))


def _fit(yq: QParams, rng: np.random.Generator, k: int, ws: np.ndarray) -> QParams:
    """An output scale that holds about +-4 sigma of a K-term product of the test's inputs
    (float std 1.5) and weights (uniform int8 codes times ``ws``): few saturated outputs."""
    sigma = np.sqrt(k) * 1.5 * 127 / np.sqrt(3) * float(np.mean(ws))
    return QParams(float(sigma * 8 / 255 * rng.uniform(0.7, 1.5)), yq.zp)


def one_op(op: str, dtype: str = "u8", seed: int = 0, shape: tuple[int, ...] = (1, 8, 6, 6),
           per_channel: bool = True, **kw) -> OneOp:
    """A one-op QOperator model of ``op`` (a key of :data:`OPS`)."""
    b = Builder(dtype, seed)
    rng = b.rng
    xq = _act(b)
    x, xs, xz = b.quantize("x", xq)
    yq = _act(b, (0.02, 0.2))
    inputs = {"x": shape}
    feeds = {"x": (rng.standard_normal(shape) * 1.5).astype(np.float32)}
    if op == "QLinearConv":
        cout, k, group = kw.get("cout", 8), kw.get("k", 3), kw.get("group", 1)
        cin = shape[1]
        w = rng.integers(-127, 128, (cout, cin // group, k, k)).astype(np.int8)
        ws = rng.uniform(0.002, 0.01, cout if per_channel else 1).astype(np.float32)
        ws = ws if per_channel else ws.reshape(())
        wz = np.zeros(ws.shape, np.int8)
        bias = rng.integers(-3000, 3000, cout).astype(np.int32)
        yq = _fit(yq, rng, cin // group * k * k, ws)
        ys, yz = b.sz(yq)
        y = b.node("QLinearConv", [x, xs, xz, b.const(w, "w"), b.const(ws, "ws"), b.const(wz, "wz"),
                                   ys, yz, b.const(bias, "b")],
                   pads=[k // 2] * 4, strides=[kw.get("stride", 1)] * 2, group=group)
    elif op == "QLinearMatMul":
        kdim, n = shape[-1], kw.get("n", 12)
        w = rng.integers(-127, 128, (kdim, n)).astype(np.int8)
        ws = rng.uniform(0.01, 0.05, n if per_channel else 1).astype(np.float32)
        ws = ws if per_channel else ws.reshape(())
        yq = _fit(yq, rng, kdim, ws)
        ys, yz = b.sz(yq)
        y = b.node("QLinearMatMul", [x, xs, xz, b.const(w, "w"), b.const(ws, "ws"),
                                     b.const(np.zeros(ws.shape, np.int8), "wz"), ys, yz])
    elif op == "QGemm":
        kdim, n = shape[-1], kw.get("n", 12)
        w = rng.integers(-127, 128, (n, kdim)).astype(np.int8)
        ws = rng.uniform(0.01, 0.05, n if per_channel else 1).astype(np.float32)
        ws = ws if per_channel else ws.reshape(())
        bias = rng.integers(-3000, 3000, n).astype(np.int32)
        yq = _fit(yq, rng, kdim, ws * float(kw.get("alpha", 1.0)))
        ys, yz = b.sz(yq)
        y = b.node("QGemm", [x, xs, xz, b.const(w, "w"), b.const(ws, "ws"),
                             b.const(np.zeros(ws.shape, np.int8), "wz"), b.const(bias, "b"), ys, yz],
                   domain=MS, transB=1, alpha=float(kw.get("alpha", 1.0)))
    elif op in ("QLinearAdd", "QLinearMul"):
        inputs["x2"] = shape
        feeds["x2"] = (rng.standard_normal(shape)).astype(np.float32)
        x2, x2s, x2z = b.quantize("x2", _act(b))
        ys, yz = b.sz(yq)
        y = b.node(op, [x, xs, xz, x2, x2s, x2z, ys, yz], domain=MS)
    elif op == "QLinearConcat":
        inputs["x2"] = shape
        feeds["x2"] = (rng.standard_normal(shape)).astype(np.float32)
        x2, x2s, x2z = b.quantize("x2", _act(b))
        ys, yz = b.sz(yq)
        y = b.node(op, [ys, yz, x, xs, xz, x2, x2s, x2z], domain=MS, axis=1)
    elif op in ("QLinearGlobalAveragePool", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool",
                "QLinearSoftmax"):
        ys, yz = b.sz(yq)
        nhwc = int(kw.get("channels_last", 0))
        attrs = {"QLinearGlobalAveragePool": {"channels_last": nhwc},
                 "QLinearLeakyRelu": {"alpha": 0.1},
                 "QLinearAveragePool": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4,
                                        "count_include_pad": kw.get("count_include_pad", 1),
                                        "channels_last": nhwc},
                 "QLinearSoftmax": {"axis": -1, "opset": 13}}.get(op, {})
        if op == "QLinearSoftmax":  # probabilities: ORT's quantizer uses 1/256
            ys, yz = b.sz(QParams(1 / 256, 0 if dtype == "u8" else -128))
            yq = QParams(1 / 256, 0 if dtype == "u8" else -128)
        y = b.node(op, [x, xs, xz, ys, yz], domain=MS, **attrs)
    else:
        raise KeyError(op)
    return OneOp(b.model(inputs, y, yq), feeds, yq.scale, op)


OPS = ("QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearMul", "QLinearConcat",
       "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSigmoid", "QLinearLeakyRelu",
       "QLinearSoftmax")


def torch_resnet(seed: int = 0) -> onnx.ModelProto:
    """A small ResNet written in torch (stem, three basic blocks with residual adds, one
    strided with a 1x1 projection, GAP, linear), exported to ONNX (opset 17, TorchScript
    exporter) and simplified with onnxslim (ORT's quantizer cannot read the exporter's
    Identity-fed weights)."""
    import io

    import onnxslim
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.sc = (nn.Identity() if stride == 1 and cin == cout else
                       nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + self.sc(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                      nn.ReLU(), nn.MaxPool2d(2))
            self.layers = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 32, 1))
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1)
            return self.fc(torch.flatten(x, 1))

    torch.manual_seed(seed)
    net = Net().eval()
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.randn(1, 3, 32, 32),), buf, opset_version=OPSET, dynamo=False,
                      input_names=["input"], output_names=["logits"])
    return onnxslim.slim(onnx.load_from_string(buf.getvalue()))
