"""The per-op table of the QOperator -> QDQ rewrite.

Each QOperator node becomes ``DequantizeLinear`` of its quantized inputs, the float op,
and ``QuantizeLinear`` into the node's own output name, so its consumers stay wired.
That is what onnxruntime computes for these ops (integer accumulate, then requantize
with round-half-to-even), written the way the DSA's QDQ patterns read it: a QLinearConv
bias is the int32 tensor dequantized with scale ``x_scale * w_scale`` and zero point 0.

Integer ops without a quantized output (ConvInteger) become an exact float64
computation on the CPU. Ops that move quantized codes without arithmetic (MaxPool,
Flatten, Reshape, ...) get the same DQ -> op -> Q treatment with their input's
parameters, which is exact and lets the uint8 -> int8 shift reach their tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from .qoperator_graph import Emitter, QOperatorError

MS = "com.microsoft"


@dataclass(frozen=True)
class Spec:
    """Input names of an op; a trailing ``?`` marks an optional input."""

    inputs: tuple[str, ...]

    def read(self, node: onnx.NodeProto, em: Emitter) -> dict[str, str]:
        """Input name -> tensor name ('' when absent); a missing required input is an error."""
        got: dict[str, str] = {}
        for i, spec in enumerate(self.inputs):
            key, optional = spec.rstrip("?"), spec.endswith("?")
            name = node.input[i] if i < len(node.input) else ""
            if name and not _defined(name, em):
                raise QOperatorError(
                    f"{_where(node)}: input {i} ({key}) refers to '{name}', which no node, "
                    f"initializer or graph input defines")
            if not name and not optional:
                why = ("a quantized tensor needs its scale" if "scale" in key
                       else "the op cannot be rewritten without it")
                raise QOperatorError(
                    f"{_where(node)}: input {i} ({key}) is missing: {why}. Re-quantize the model "
                    f"(onnxruntime's quantize_static writes every scale) or add the initializer")
            got[key] = name
        return got


def _defined(name: str, em: Emitter) -> bool:
    g = em.g
    return name in g.inits or name in g.producer or name in g.inputs


def _where(node: onnx.NodeProto) -> str:
    dom = f"{node.domain}." if node.domain not in ("", "ai.onnx") else ""
    return f"{dom}{node.op_type} node '{node.name or node.output[0]}'"


def _attrs(node: onnx.NodeProto, drop: tuple[str, ...] = ()) -> list[onnx.AttributeProto]:
    return [a for a in node.attribute if a.name not in drop]


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


Rewrite = Callable[[onnx.NodeProto, Emitter], None]


def _bias(em: Emitter, b: str, x_scale: str, w_scale: str, base: str) -> str:
    """An int32 bias dequantized with scale x_scale * w_scale, zero point 0."""
    scale = em.mul(x_scale, w_scale, base + "_bias_scale")
    v = em.value(scale)
    zp = em.const(np.zeros(() if v is None or v.size == 1 else v.shape, np.int32), base + "_bias_zp")
    return em.dq(b, scale, zp, base + "_bias", axis=0)


def _transpose_codes(em: Emitter, codes: str, scale: str, zp: str, perm: list[int], out: str) -> str:
    """Transpose quantized codes as DQ -> Transpose -> Q (same parameters: exact, and the
    DSA's canonicalization moves the int8 tensor itself)."""
    (t,) = em.node("Transpose", [em.dq(codes, scale, zp, out + "_in")], out + "_t", perm=perm)
    return em.q(t, scale, zp, out)


def _maybe_nhwc(node: onnx.NodeProto, em: Emitter, rank: int, x: tuple[str, str, str],
                y: tuple[str, str], body: Callable[[str, str], None]) -> None:
    """Run ``body(x_codes, out_name)`` (an NCHW DQ -> op -> Q group); for com.microsoft's
    ``channels_last=1`` form, between transposes of the NHWC codes."""
    if not int(_attr(node, "channels_last", 0)):
        body(x[0], node.output[0])
        return
    base = node.output[0]
    xn = _transpose_codes(em, *x, [0, rank - 1, *range(1, rank - 1)], em.fresh(base + "_x_nchw"))
    yn = em.fresh(base + "_nchw")
    body(xn, yn)
    _transpose_codes(em, yn, *y, [0, *range(2, rank), 1], node.output[0])


def qlinear_conv(node: onnx.NodeProto, em: Emitter) -> None:
    """QLinearConv (and com.microsoft's, NHWC with OIHW weights when channels_last=1)."""
    i = SPECS["QLinearConv"].read(node, em)
    base = node.output[0]
    w = em.dq(i["w"], i["w_scale"], i["w_zero_point"], base + "_w", axis=0)
    b = _bias(em, i["B"], i["x_scale"], i["w_scale"], base) if i["B"] else None

    def body(x: str, out: str) -> None:
        ins = [em.dq(x, i["x_scale"], i["x_zero_point"], base + "_x"), w] + ([b] if b else [])
        (y,) = em.node("Conv", ins, base + "_conv", attrs=_attrs(node, drop=("channels_last",)))
        em.q(y, i["y_scale"], i["y_zero_point"], out)

    w_shape = em.g.shape(i["w"])
    _maybe_nhwc(node, em, len(w_shape) if w_shape else 4,
                (i["x"], i["x_scale"], i["x_zero_point"]), (i["y_scale"], i["y_zero_point"]), body)


def qlinear_matmul(node: onnx.NodeProto, em: Emitter) -> None:
    i = SPECS["QLinearMatMul"].read(node, em)
    base = node.output[0]
    a = em.dq(i["a"], i["a_scale"], i["a_zero_point"], base + "_a", axis=-2)
    b = em.dq(i["b"], i["b_scale"], i["b_zero_point"], base + "_b", axis=-1)
    (y,) = em.node("MatMul", [a, b], base + "_matmul")
    em.q(y, i["y_scale"], i["y_zero_point"], node.output[0])


def qgemm(node: onnx.NodeProto, em: Emitter) -> None:
    """com.microsoft QGemm: Y = alpha * A'B' + C, C an int32 accumulator-scale bias."""
    i = SPECS["QGemm"].read(node, em)
    base = node.output[0]
    trans_b = int(_attr(node, "transB", 0))
    alpha = float(_attr(node, "alpha", 1.0))
    a = em.dq(i["A"], i["a_scale"], i["a_zero_point"], base + "_a")
    b = em.dq(i["B"], i["b_scale"], i["b_zero_point"], base + "_b", axis=0 if trans_b else 1)
    ins = [a, b]
    if i["C"]:
        scale = em.mul(i["a_scale"], i["b_scale"], base + "_bias_scale")
        if alpha != 1.0:
            scale = em.mul(scale, em.const(np.array(alpha, np.float32), base + "_alpha"), base)
        v = em.value(scale)
        zp = em.const(np.zeros(() if v is None or v.size == 1 else v.shape, np.int32), base + "_bias_zp")
        ins.append(em.dq(i["C"], scale, zp, base + "_bias", axis=0))
    attrs = [helper.make_attribute("alpha", alpha), helper.make_attribute("beta", 1.0),
             helper.make_attribute("transA", int(_attr(node, "transA", 0))),
             helper.make_attribute("transB", trans_b)]
    if not i["y_scale"]:  # float output
        em.node("Gemm", ins, base + "_gemm", outputs=[node.output[0]], attrs=attrs)
        return
    (y,) = em.node("Gemm", ins, base + "_gemm", attrs=attrs)
    em.q(y, i["y_scale"], i["y_zero_point"], node.output[0])


def _binary(op: str) -> Rewrite:
    def rewrite(node: onnx.NodeProto, em: Emitter) -> None:
        i = SPECS[f"QLinear{op}"].read(node, em)
        base = node.output[0]
        a = em.dq(i["A"], i["A_scale"], i["A_zero_point"], base + "_a")
        b = em.dq(i["B"], i["B_scale"], i["B_zero_point"], base + "_b")
        (y,) = em.node(op, [a, b], base + "_" + op.lower())
        em.q(y, i["C_scale"], i["C_zero_point"], node.output[0])
    return rewrite


def _unary(spec: str, float_op: Callable[[onnx.NodeProto, Emitter, str, str], str]) -> Rewrite:
    """X, X_scale, X_zero_point, Y_scale, Y_zero_point ops: DQ -> float op -> Q."""
    def rewrite(node: onnx.NodeProto, em: Emitter) -> None:
        i = SPECS[spec].read(node, em)
        base = node.output[0]

        def body(x: str, out: str) -> None:
            y = float_op(node, em, em.dq(x, i["X_scale"], i["X_zero_point"], base + "_x"), base)
            em.q(y, i["Y_scale"], i["Y_zero_point"], out)

        kernel = _attr(node, "kernel_shape")
        shape = em.g.shape(i["X"])
        rank = len(kernel) + 2 if kernel else len(shape) if shape else 4
        _maybe_nhwc(node, em, rank, (i["X"], i["X_scale"], i["X_zero_point"]),
                    (i["Y_scale"], i["Y_zero_point"]), body)
    return rewrite


def _global_avg(node: onnx.NodeProto, em: Emitter, x: str, base: str) -> str:
    return em.node("GlobalAveragePool", [x], base + "_gap")[0]


def _avg_pool(node: onnx.NodeProto, em: Emitter, x: str, base: str) -> str:
    attrs = _attrs(node, drop=("channels_last",))
    return em.node("AveragePool", [x], base + "_avgpool", attrs=attrs)[0]


def _sigmoid(node: onnx.NodeProto, em: Emitter, x: str, base: str) -> str:
    return em.node("Sigmoid", [x], base + "_sigmoid")[0]


def _leaky_relu(node: onnx.NodeProto, em: Emitter, x: str, base: str) -> str:
    return em.node("LeakyRelu", [x], base + "_leaky", alpha=float(_attr(node, "alpha", 0.01)))[0]


def qlinear_concat(node: onnx.NodeProto, em: Emitter) -> None:
    """Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input."""
    n_in = len(node.input) - 2
    if n_in <= 0 or n_in % 3:
        raise QOperatorError(f"{_where(node)}: {len(node.input)} inputs; QLinearConcat takes "
                             f"Y_scale, Y_zero_point and a (X, X_scale, X_zero_point) triple per input")
    names = ["Y_scale", "Y_zero_point"] + [f"{k}{j}" for j in range(n_in // 3)
                                            for k in ("X", "X_scale", "X_zero_point")]
    i = Spec(tuple(names)).read(node, em)
    base = node.output[0]
    xs = [em.dq(i[f"X{j}"], i[f"X_scale{j}"], i[f"X_zero_point{j}"], f"{base}_x{j}")
          for j in range(n_in // 3)]
    (y,) = em.node("Concat", xs, base + "_concat", axis=int(_attr(node, "axis")))
    em.q(y, i["Y_scale"], i["Y_zero_point"], node.output[0])


def conv_integer(node: onnx.NodeProto, em: Emitter) -> None:
    """ConvInteger: (x - x_zp) conv (w - w_zp) in int32, computed exactly in float64."""
    i = SPECS["ConvInteger"].read(node, em)
    base = node.output[0]

    def centered(t: str, zp: str, per_channel_rank: int | None, key: str) -> str:
        (d,) = em.node("Cast", [t], f"{base}_{key}_f64", to=onnx.TensorProto.DOUBLE)
        if not zp:
            return d
        z = em.value(zp)
        if z is not None:
            z = z.astype(np.float64)
            if z.size > 1 and per_channel_rank:
                z = z.reshape((-1,) + (1,) * (per_channel_rank - 1))
            zc = em.const(z, f"{base}_{key}_zp_f64")
        else:
            (zc,) = em.node("Cast", [zp], f"{base}_{key}_zp_f64", to=onnx.TensorProto.DOUBLE)
        return em.node("Sub", [d, zc], f"{base}_{key}_centered")[0]

    w_shape = em.g.shape(i["w"])
    x = centered(i["x"], i["x_zero_point"], None, "x")
    w = centered(i["w"], i["w_zero_point"], len(w_shape) if w_shape else 4, "w")
    (y,) = em.node("Conv", [x, w], base + "_conv", attrs=_attrs(node))
    em.node("Cast", [y], base + "_int32", outputs=[node.output[0]], to=onnx.TensorProto.INT32)


def _integer_matmul_to_float(em: Emitter, node: onnx.NodeProto, a: str, a_zp: str, b: str, b_zp: str,
                             a_scale: str, b_scale: str, bias: str) -> None:
    """MatMulInteger (TVM imports it), then acc * (a_scale * b_scale) (+ bias) in float."""
    base = node.output[0]
    (acc,) = em.node("MatMulInteger", [a, b, a_zp, b_zp], base + "_acc")
    (f,) = em.node("Cast", [acc], base + "_accf", to=onnx.TensorProto.FLOAT)
    scaled = [node.output[0]] if not bias else None
    (y,) = em.node("Mul", [f, em.mul(a_scale, b_scale, base + "_scale")], base + "_mul", outputs=scaled)
    if bias:
        em.node("Add", [y, bias], base + "_bias", outputs=[node.output[0]])


def matmul_integer_to_float(node: onnx.NodeProto, em: Emitter) -> None:
    """com.microsoft MatMulIntegerToFloat (ORT's fusion of MatMulInteger + Cast + Mul)."""
    i = SPECS["MatMulIntegerToFloat"].read(node, em)
    _integer_matmul_to_float(em, node, i["A"], i["a_zero_point"], i["B"], i["b_zero_point"],
                             i["a_scale"], i["b_scale"], i["bias"])


def dynamic_quantize_matmul(node: onnx.NodeProto, em: Emitter) -> None:
    """com.microsoft DynamicQuantizeMatMul: A quantized to uint8 at run time (DynamicQuantizeLinear)."""
    i = SPECS["DynamicQuantizeMatMul"].read(node, em)
    aq, a_scale, a_zp = em.node("DynamicQuantizeLinear", [i["A"]], node.output[0] + "_a", n_out=3)
    _integer_matmul_to_float(em, node, aq, a_zp, i["B"], i["b_zero_point"], a_scale, i["b_scale"],
                             i["bias"])


def _std_qdq(node: onnx.NodeProto, em: Emitter) -> None:
    """com.microsoft Quantize/DequantizeLinear on 8-bit tensors: the standard op."""
    em.node(node.op_type, list(node.input), node.output[0], outputs=list(node.output),
            attrs=_attrs(node))


SPECS: dict[str, Spec] = {
    "QLinearConv": Spec(("x", "x_scale", "x_zero_point?", "w", "w_scale", "w_zero_point?",
                         "y_scale", "y_zero_point?", "B?")),
    "QLinearMatMul": Spec(("a", "a_scale", "a_zero_point?", "b", "b_scale", "b_zero_point?",
                           "y_scale", "y_zero_point?")),
    "QGemm": Spec(("A", "a_scale", "a_zero_point?", "B", "b_scale", "b_zero_point?", "C?",
                   "y_scale?", "y_zero_point?")),
    "QLinearAdd": Spec(("A", "A_scale", "A_zero_point?", "B", "B_scale", "B_zero_point?",
                        "C_scale", "C_zero_point?")),
    "QLinearMul": Spec(("A", "A_scale", "A_zero_point?", "B", "B_scale", "B_zero_point?",
                        "C_scale", "C_zero_point?")),
    "QLinearUnary": Spec(("X", "X_scale", "X_zero_point?", "Y_scale", "Y_zero_point?")),
    "ConvInteger": Spec(("x", "w", "x_zero_point?", "w_zero_point?")),
    "MatMulIntegerToFloat": Spec(("A", "B", "a_scale", "b_scale", "a_zero_point?", "b_zero_point?",
                                  "bias?")),
    "DynamicQuantizeMatMul": Spec(("A", "B", "b_scale", "b_zero_point?", "bias?")),
}

#: (domain, op type) -> rewrite. The standard domain is "".
REWRITES: dict[tuple[str, str], Rewrite] = {
    ("", "QLinearConv"): qlinear_conv,
    ("", "QLinearMatMul"): qlinear_matmul,
    ("", "ConvInteger"): conv_integer,
    (MS, "QGemm"): qgemm,
    (MS, "QLinearConv"): qlinear_conv,
    (MS, "QLinearAdd"): _binary("Add"),
    (MS, "QLinearMul"): _binary("Mul"),
    (MS, "QLinearGlobalAveragePool"): _unary("QLinearUnary", _global_avg),
    (MS, "QLinearAveragePool"): _unary("QLinearUnary", _avg_pool),
    (MS, "QLinearSigmoid"): _unary("QLinearUnary", _sigmoid),
    (MS, "QLinearLeakyRelu"): _unary("QLinearUnary", _leaky_relu),
    (MS, "QLinearConcat"): qlinear_concat,
    (MS, "MatMulIntegerToFloat"): matmul_integer_to_float,
    (MS, "DynamicQuantizeMatMul"): dynamic_quantize_matmul,
    (MS, "QuantizeLinear"): _std_qdq,
    (MS, "DequantizeLinear"): _std_qdq,
}

#: ops that move quantized codes without arithmetic: DQ -> op -> Q with the input's
#: parameters is the same function (data is input 0; the others are shapes/indices; a
#: constant Pad's value becomes its float value, Resize only in nearest mode)
PASSTHROUGH = frozenset({"MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
                         "Identity", "Slice", "Split", "DepthToSpace", "SpaceToDepth", "Expand",
                         "Tile", "Gather", "Pad", "Resize"})

#: ops whose (non-float) outputs are quantized codes, and the inputs holding their parameters
QUANTIZED_OUTPUT: dict[str, tuple[int, int]] = {
    "QuantizeLinear": (1, 2), "QLinearConv": (6, 7), "QLinearMatMul": (6, 7), "QGemm": (7, 8),
    "QLinearAdd": (6, 7), "QLinearMul": (6, 7), "QLinearGlobalAveragePool": (3, 4),
    "QLinearAveragePool": (3, 4), "QLinearSigmoid": (3, 4), "QLinearLeakyRelu": (3, 4),
    "QLinearConcat": (0, 1), "QLinearSoftmax": (3, 4),
}
