"""QDQ ONNX models of activation chains for the table tests: ``x -> QDQ -> act -> QDQ``,
the activations written as exporters write them, and the builds to compare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from tests.qdq_models import QDQGraph


def _hardswish_ops(g: QDQGraph, x: str) -> str:
    """x * clip(x + 3, 0, 6) / 6, as TVM's importer sees torch's exported HardSwish."""
    a = g.op("Add", [x, g.const(np.array(3, np.float32))])
    c = g.op("Clip", [a, g.const(np.array(0, np.float32)), g.const(np.array(6, np.float32))])
    m = g.op("Mul", [x, c])
    return g.op("Div", [m, g.const(np.array(6, np.float32))])


def _gelu_erf(g: QDQGraph, x: str) -> str:
    d = g.op("Div", [x, g.const(np.array(1.4142135, np.float32))])
    e = g.op("Erf", [d])
    a = g.op("Add", [e, g.const(np.array(1, np.float32))])
    m = g.op("Mul", [x, a])
    return g.op("Mul", [m, g.const(np.array(0.5, np.float32))])


def _gelu_tanh(g: QDQGraph, x: str) -> str:
    x3 = g.op("Mul", [g.op("Mul", [x, x]), x])
    inner = g.op("Add", [x, g.op("Mul", [x3, g.const(np.array(0.044715, np.float32))])])
    t = g.op("Tanh", [g.op("Mul", [inner, g.const(np.array(0.7978846, np.float32))])])
    h = g.op("Add", [t, g.const(np.array(1, np.float32))])
    return g.op("Mul", [g.op("Mul", [x, h]), g.const(np.array(0.5, np.float32))])


def _silu_qdq(g: QDQGraph, x: str) -> str:
    """x * sigmoid(x) with the sigmoid's own Q/DQ pair (as quantizers leave it)."""
    s = g.qdq(g.op("Sigmoid", [x]), 1 / 256, -128)
    return g.op("Mul", [x, s])


ACTS = {
    "sigmoid": lambda g, x: g.op("Sigmoid", [x]),
    "silu": lambda g, x: g.op("Mul", [x, g.op("Sigmoid", [x])]),
    "silu_qdq": _silu_qdq,
    "hardswish": _hardswish_ops,
    "hardswish_onnx": lambda g, x: g.op("HardSwish", [x]),
    "hardsigmoid": lambda g, x: g.op("HardSigmoid", [x], alpha=0.2, beta=0.5),
    "gelu_erf": _gelu_erf,
    "gelu_tanh": _gelu_tanh,
    "leaky_relu": lambda g, x: g.op("LeakyRelu", [x], alpha=0.1),
    "tanh": lambda g, x: g.op("Tanh", [x]),
    "exp": lambda g, x: g.op("Exp", [x]),
    "log": lambda g, x: g.op("Log", [x]),          # NaN below 0, -inf at 0
    "sqrt_div": lambda g, x: g.op("Div", [g.const(np.array(1, np.float32)), g.op("Sqrt", [x])]),
}


def act_model(path: Path, act: str, s_in: float, z_in: int, s_out: float, z_out: int,
              shape=(1, 4, 8, 8)) -> Path:
    g = QDQGraph(0)
    x = g.qdq("x", s_in, z_in)
    y = g.qdq(ACTS[act](g, x), s_out, z_out)
    return g.save(path / f"{act}.onnx", {"x": shape}, y, shape)


def all_acts_model(path: Path, s_in: float, z_in: int, outs: dict[str, tuple[float, int]],
                   shape=(1, 4, 8, 8), name: str = "acts") -> Path:
    """One input, one branch per activation of ``outs`` (its output scale and zero point),
    each ``x -> QDQ -> act -> QDQ -> out_<act>``: one build compares all of them."""
    from tests.qdq_models import make_model, node

    g = QDQGraph(0)
    x = g.qdq("x", s_in, z_in)
    names = {}
    for act, (s_out, z_out) in outs.items():
        y = g.qdq(ACTS[act](g, x), s_out, z_out)
        g.nodes.append(node("Identity", [y], [f"out_{act}"]))
        names[f"out_{act}"] = shape
    file = path / f"{name}.onnx"
    onnx.save(make_model(g.nodes, g.inits, {"x": shape}, names), file)
    return file


def every_code(s_in: float, z_in: int, shape=(1, 4, 8, 8)) -> np.ndarray:
    """An input whose quantized codes are -128..127 (each once, when the shape has 256)."""
    codes = np.resize(np.arange(-128, 128), int(np.prod(shape)))
    return (np.float32(s_in) * (codes - z_in).astype(np.float32)).reshape(shape)


def load(path: Path) -> onnx.ModelProto:
    return onnx.load(path)
