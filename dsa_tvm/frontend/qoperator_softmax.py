"""com.microsoft QLinearSoftmax, computed the way onnxruntime's CPU kernel does.

ORT's kernel is not ``Q(softmax(DQ(x)))``: it looks ``exp`` up in a 256-entry float
table indexed by ``x - max(x) + 255`` (scaled by ``exp(bit_shift)`` so the sum stays
finite), multiplies by ``floor(1 / y_scale)`` (not ``1 / y_scale``), rounds half to
even, adds the zero point and clamps only at 255 (the int8 path then wraps). With no
exact QDQ equivalent it stays on the CPU, written in plain ONNX ops with that table;
only the float summation order of the row sum can differ from ORT's sequential loop.
The codes then pass through ``Q(DQ(codes))`` (exact) so the uint8 -> int8 shift and
the DSA patterns of the consumers see an ordinary quantized tensor.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from .qoperator_graph import Emitter, QOperatorError
from .qoperator_ops import SPECS, _attr, _where

FLT_MAX = float(np.finfo(np.float32).max)
#: bits ORT keeps free below FLT_MAX for the row sum (float table)
RESERVE_BITS = 5.0


def exp_table(x_scale: float, reduce_len: int) -> np.ndarray:
    """ORT's float exp table, indexed by ``x - max(x) + 255`` (uint8 and int8 alike)."""
    xs = float(np.float32(x_scale))
    bit_shift = math.log(float(np.float32(FLT_MAX) / np.float32(reduce_len)))
    bit_shift = max(0.0, bit_shift - RESERVE_BITS) / xs
    i = np.arange(256, dtype=np.float64)
    return np.exp((i - 255 + bit_shift) * xs).astype(np.float32)


def qlinear_softmax(node: onnx.NodeProto, em: Emitter) -> None:
    i = SPECS["QLinearUnary"].read(node, em)
    base = node.output[0]
    xs, ys, yz = em.value(i["X_scale"]), em.value(i["Y_scale"]), em.value(i["Y_zero_point"])
    shape = em.g.shape(i["X"])
    if xs is None or ys is None or xs.size != 1 or ys.size != 1:
        raise QOperatorError(f"{_where(node)}: X_scale and Y_scale must be constant scalars "
                             "(ORT builds its exp table from them)")
    if not shape or min(shape) <= 0:
        raise QOperatorError(f"{_where(node)}: the input shape must be static (ORT's exp table "
                             "depends on the softmax length); run onnx shape inference or fix the "
                             "input shape")
    opset = int(_attr(node, "opset", 13))
    rank = len(shape)
    axis = int(_attr(node, "axis", 1 if opset < 13 else -1)) % rank
    signed = yz is not None and yz.dtype == np.int8
    zp = int(yz) if yz is not None else 0

    x, perm, back = i["X"], None, None
    if opset < 13:  # softmax over the flattened [axis:] block
        d = int(np.prod(shape[axis:]))
        (x,) = em.node("Reshape", [x, em.const(np.array([-1, d], np.int64), base + "_2d")], base + "_2d")
        back = shape
    else:
        d = shape[axis]
        if axis != rank - 1:
            perm = list(range(rank))
            perm[axis], perm[-1] = rank - 1, axis
            (x,) = em.node("Transpose", [x], base + "_t", perm=perm)
    (xi,) = em.node("Cast", [x], base + "_i32", to=TensorProto.INT32)
    if em.g.opset() >= 18:  # axes became an input of ReduceMax in opset 18
        (xmax,) = em.node("ReduceMax", [xi, em.const(np.array([-1], np.int64), base + "_axm")],
                          base + "_max", keepdims=1)
    else:
        (xmax,) = em.node("ReduceMax", [xi], base + "_max", axes=[-1], keepdims=1)
    (rel,) = em.node("Sub", [xi, xmax], base + "_rel")
    (idx,) = em.node("Add", [rel, em.const(np.array(255, np.int32), base + "_255")], base + "_idx")
    table = em.const(exp_table(float(xs), d), base + "_exp_table")
    (e,) = em.node("Gather", [table, idx], base + "_exp", axis=0)
    (e64,) = em.node("Cast", [e], base + "_exp64", to=TensorProto.DOUBLE)
    (s64,) = em.node("ReduceSum", [e64, em.const(np.array([-1], np.int64), base + "_ax")], base + "_sum",
                     keepdims=1)
    (vsum,) = em.node("Cast", [s64], base + "_sum32", to=TensorProto.FLOAT)
    inv = np.floor(np.float32(1.0) / np.float32(ys))  # in float32, as ORT computes it
    (num,) = em.node("Mul", [e, em.const(inv, base + "_inv_scale")], base + "_num")
    (r,) = em.node("Round", [em.node("Div", [num, vsum], base + "_div")[0]], base + "_round")
    (ri,) = em.node("Cast", [r], base + "_r32", to=TensorProto.INT32)
    (vq,) = em.node("Add", [ri, em.const(np.array(zp, np.int32), base + "_zp")], base + "_vq")
    (vq,) = em.node("Min", [vq, em.const(np.array(255, np.int32), base + "_cap")], base + "_cap")
    if signed:  # ORT casts the (<= 255) int32 to int8: two's complement wrap
        (vq,) = em.node("Add", [vq, em.const(np.array(128, np.int32), base + "_p128")], base + "_w")
        (vq,) = em.node("Mod", [vq, em.const(np.array(256, np.int32), base + "_256")], base + "_w")
        (vq,) = em.node("Sub", [vq, em.const(np.array(128, np.int32), base + "_m128")], base + "_w")
    (y,) = em.node("Cast", [vq], base + "_codes", to=TensorProto.INT8 if signed else TensorProto.UINT8)
    if back is not None:
        (y,) = em.node("Reshape", [y, em.const(np.array(back, np.int64), base + "_shape")], base + "_nd")
    elif perm is not None:
        (y,) = em.node("Transpose", [y], base + "_tb", perm=perm)
    yd = em.dq(y, i["Y_scale"], i["Y_zero_point"], base + "_y")
    em.q(yd, i["Y_scale"], i["Y_zero_point"], node.output[0])
