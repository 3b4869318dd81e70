"""Tiny QDQ int8 ONNX models for the partition/offload tests.

Two ways to get one: build an FP32 graph and quantize it with onnxruntime's
``quantize_static`` (QDQ, per-channel int8 weights, int8 activations), the way
users' models arrive; or write the QDQ graph by hand (:class:`QDQGraph`) when a
test needs something the quantizer never emits (an explicit Relu/Clip between
the conv and its quantize, asymmetric weights). Files go to the test's tmp_path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make_model(nodes: list, inits: dict[str, np.ndarray], inputs: dict[str, tuple],
               outputs: dict[str, tuple | None]) -> onnx.ModelProto:
    """An FP32 (or hand-made QDQ) model from nodes, initializers and float I/O shapes."""
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, None if v is None else list(v))
         for k, v in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m


def node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, **attrs)


def quantize(model: onnx.ModelProto, tmp_path: Path, seed: int = 0, batches: int = 4,
             name: str = "model", reduce_range: bool = False, per_channel: bool = True) -> Path:
    """quantize_static(QDQ, per-channel, int8/int8) of ``model``; returns the QDQ file path.

    ``reduce_range`` (7-bit weights) keeps ORT's optimized x86 int8 kernels from
    saturating their 16-bit pair sums, so they compute what the QDQ graph says."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
                            for _ in range(batches)])

        def get_next(self):
            return next(self.it, None)

    fp32, q = tmp_path / f"{name}_fp32.onnx", tmp_path / f"{name}_qdq.onnx"
    onnx.save(model, fp32)
    quantize_static(str(fp32), str(q), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    reduce_range=reduce_range)
    return q


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- FP32 builders


def conv_net(tmp_path: Path, cin=3, cout=8, hw=8, k=3, stride=1, pad=1, groups=1, bias=True,
             act: str | None = None, dilation=1, seed=0, per_channel=True) -> Path:
    rng = np.random.default_rng(seed)
    inits = {"W": rand(rng, cout, cin // groups, k, k)}
    ins = ["x", "W"] + (["B"] if bias else [])
    if bias:
        inits["B"] = rand(rng, cout)
    nodes = [node("Conv", ins, ["c"], pads=[pad] * 4, strides=[stride] * 2, group=groups,
                  dilations=[dilation] * 2)]
    out = "c"
    if act == "relu":
        nodes.append(node("Relu", ["c"], ["y"]))
        out = "y"
    elif act == "relu6":
        inits.update(lo=np.array(0, np.float32), hi=np.array(6, np.float32))
        nodes.append(node("Clip", ["c", "lo", "hi"], ["y"]))
        out = "y"
    nodes.append(node("Identity", [out], ["out"]))
    m = make_model(nodes, inits, {"x": (1, cin, hw, hw)}, {"out": None})
    return quantize(m, tmp_path, seed, per_channel=per_channel)


def chain_net(tmp_path: Path, seed=0, reduce_range=False) -> Path:
    """conv -> relu -> depthwise conv (stride 2) -> maxpool -> global avg pool -> flatten -> gemm."""
    rng = np.random.default_rng(seed)
    inits = {"W": rand(rng, 8, 3, 3, 3), "B": rand(rng, 8), "W2": rand(rng, 8, 1, 3, 3),
             "Wf": rand(rng, 4, 8), "Bf": rand(rng, 4)}
    nodes = [node("Conv", ["x", "W", "B"], ["c"], pads=[1] * 4),
             node("Relu", ["c"], ["r"]),
             node("Conv", ["r", "W2"], ["d"], pads=[1] * 4, group=8, strides=[2, 2]),
             node("MaxPool", ["d"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             node("GlobalAveragePool", ["m"], ["g"]),
             node("Flatten", ["g"], ["f"]),
             node("Gemm", ["f", "Wf", "Bf"], ["y"], transB=1)]
    m = make_model(nodes, inits, {"x": (1, 3, 8, 8)}, {"y": (1, 4)})
    return quantize(m, tmp_path, seed, name="chain", reduce_range=reduce_range)


def single_op_net(tmp_path: Path, op: str, shape=(1, 8, 8, 8), seed=0, **attrs) -> Path:
    """x -> conv 1x1 (so the op sees a quantized activation) -> op -> out."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    inits = {"W": rand(rng, c, c, 1, 1)}
    nodes = [node("Conv", ["x", "W"], ["c"]), node(op, ["c"], ["y"], **attrs)]
    m = make_model(nodes, inits, {"x": shape}, {"y": None})
    return quantize(m, tmp_path, seed, name=op.lower())


def branch_net(tmp_path: Path, seed=0) -> Path:
    """conv1 feeds a CPU Softmax and conv2; add(softmax, conv2): a region with two outputs
    (a Sigmoid would be a DSA table now, in the region)."""
    rng = np.random.default_rng(seed)
    inits = {"W1": rand(rng, 4, 3, 3, 3), "W2": rand(rng, 4, 4, 1, 1)}
    nodes = [node("Conv", ["x", "W1"], ["c"], pads=[1] * 4), node("Softmax", ["c"], ["s"], axis=1),
             node("Conv", ["c", "W2"], ["d"]), node("Add", ["s", "d"], ["y"])]
    m = make_model(nodes, inits, {"x": (1, 3, 5, 5)}, {"y": None})
    return quantize(m, tmp_path, seed, name="branch")


def residual_net(tmp_path: Path, relu=True, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    inits = {"W": rand(rng, 4, 4, 3, 3), "B": rand(rng, 4)}
    nodes = [node("Conv", ["x", "W", "B"], ["c"], pads=[1] * 4), node("Add", ["c", "x"], ["a"])]
    if relu:
        nodes.append(node("Relu", ["a"], ["y"]))
    else:
        nodes.append(node("Identity", ["a"], ["y"]))
    m = make_model(nodes, inits, {"x": (1, 4, 6, 6)}, {"y": None})
    return quantize(m, tmp_path, seed, name="residual")


def dense_net(tmp_path: Path, gemm=True, seed=0, m=3, k=20, n=10) -> Path:
    rng = np.random.default_rng(seed)
    if gemm:
        inits = {"W": rand(rng, n, k), "B": rand(rng, n)}
        nodes = [node("Gemm", ["x", "W", "B"], ["y"], transB=1)]
    else:
        inits = {"W": rand(rng, k, n)}
        nodes = [node("MatMul", ["x", "W"], ["y"])]
    model = make_model(nodes, inits, {"x": (m, k)}, {"y": None})
    return quantize(model, tmp_path, seed, name="dense" if gemm else "matmul")


def attention_net(tmp_path: Path, b=2, s=6, d=8, seed=0) -> Path:
    """scores = (x Wq) @ (x Wk)^T -> softmax -> @ (x Wv): matmuls on the DSA, softmax on the CPU."""
    rng = np.random.default_rng(seed)
    inits = {"Wq": rand(rng, d, d), "Wk": rand(rng, d, d), "Wv": rand(rng, d, d)}
    nodes = [node("MatMul", ["x", "Wq"], ["q"]), node("MatMul", ["x", "Wk"], ["k"]),
             node("MatMul", ["x", "Wv"], ["v"]),
             node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             node("MatMul", ["q", "kt"], ["sc"]), node("Softmax", ["sc"], ["p"], axis=-1),
             node("MatMul", ["p", "v"], ["y"])]
    model = make_model(nodes, inits, {"x": (b, s, d)}, {"y": None})
    return quantize(model, tmp_path, seed, name="attention")


# ----------------------------------------------------------------------------- hand-written QDQ


class QDQGraph:
    """Write a QDQ graph node by node (what a quantizer would emit, plus what it never does)."""

    def __init__(self, seed: int = 0):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def _name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def const(self, value: np.ndarray, base: str = "c") -> str:
        name = self._name(base)
        self.inits[name] = value
        return name

    def q(self, x: str, scale: float, zp: int) -> str:
        out = self._name("q")
        self.nodes.append(node("QuantizeLinear", [x, self.const(np.array(scale, np.float32)),
                                                  self.const(np.array(zp, np.int8))], [out]))
        return out

    def dq(self, xq: str, scale, zp, axis: int | None = None) -> str:
        out = self._name("dq")
        attrs = {} if axis is None else {"axis": axis}
        self.nodes.append(node("DequantizeLinear", [xq, self.const(np.asarray(scale, np.float32)),
                                                    self.const(np.asarray(zp))], [out], **attrs))
        return out

    def qdq(self, x: str, scale: float, zp: int) -> str:
        return self.dq(self.q(x, scale, zp), scale, np.array(zp, np.int8))

    def weight(self, w: np.ndarray, scales: np.ndarray, zps: np.ndarray | None = None,
               axis: int = 0) -> str:
        wq = self.const(w.astype(np.int8), "w")
        zps = np.zeros(len(scales), np.int8) if zps is None else zps.astype(np.int8)
        return self.dq(wq, scales.astype(np.float32), zps, axis=axis)

    def bias(self, b: np.ndarray, scales: np.ndarray) -> str:
        bq = self.const(b.astype(np.int32), "b")
        return self.dq(bq, scales.astype(np.float32), np.zeros(len(scales), np.int32), axis=0)

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(node(op, inputs, [out], **attrs))
        return out

    def save(self, path: Path, inputs: dict[str, tuple], output: str, shape: tuple) -> Path:
        self.nodes.append(node("Identity", [output], ["out"]))
        onnx.save(make_model(self.nodes, self.inits, inputs, {"out": shape}), path)
        return path


def hand_conv(tmp_path: Path, act: str | None = "relu", w_zero_point: int = 0, seed: int = 0,
              cin: int = 4, cout: int = 6, hw: int = 6) -> Path:
    """x -> QDQ -> Conv(bias) -> [Relu | Clip(0, 6)] -> QDQ: the activation left in the graph."""
    g = QDQGraph(seed)
    rng = g.rng
    xs, ws = 0.05, (rng.uniform(0.005, 0.02, cout)).astype(np.float32)
    x = g.qdq("x", xs, 3)
    w = rng.integers(-127, 128, (cout, cin, 3, 3))
    zps = np.full(cout, w_zero_point)
    wd = g.weight(w, ws, zps)
    bd = g.bias(rng.integers(-2000, 2000, cout), ws * xs)
    c = g.op("Conv", [x, wd, bd], pads=[1, 1, 1, 1])
    if act == "relu":
        c = g.op("Relu", [c])
    elif act == "relu6":
        c = g.op("Clip", [c, g.const(np.array(0, np.float32)), g.const(np.array(6, np.float32))])
    y = g.qdq(c, 0.03, -100)
    return g.save(tmp_path / f"hand_conv_{act}_{w_zero_point}.onnx", {"x": (1, cin, hw, hw)}, y,
                  (1, cout, hw, hw))
