"""Fold inference-mode BatchNormalization into the convolution that feeds it.

BN after a conv is a per-output-channel affine map, so it folds exactly into the
conv's weights and bias: W' = W * g / sqrt(v + eps), b' = (b - m) * g / sqrt(v + eps) + beta.
Quantizing the folded conv keeps one requantize per layer (an unfolded BN would stay
an FP32 op between two int8 layers and cost a quantization step of its own).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..frontend.onnx_graph import Graph, drop_unused_initializers


def fold_batch_norms(model: onnx.ModelProto) -> list[str]:
    """Fold every Conv -> BatchNormalization pair in place; returns the folded BN names.

    A BN is folded when its input is produced by a Conv with constant weights (and
    bias, if any) whose output feeds only the BN, and the BN parameters are constants.
    """
    g = Graph(model)
    folded: list[str] = []
    drop: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    for bn in list(model.graph.node):
        if bn.op_type != "BatchNormalization" or len(bn.output) > 1 and any(bn.output[1:]):
            continue
        conv = g.producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or not g.only_reader(conv.output[0], bn):
            continue
        params = bn.input[1:5]
        if not all(g.is_const(p) for p in params) or not g.is_const(conv.input[1]):
            continue
        if len(conv.input) > 2 and conv.input[2] and not g.is_const(conv.input[2]):
            continue
        gamma, beta, mean, var = (g.const(p).astype(np.float64) for p in params)
        eps = float(g.attr(bn, "epsilon", 1e-5))
        w = g.const(conv.input[1]).astype(np.float64)
        b = g.const(conv.input[2]).astype(np.float64) if len(conv.input) > 2 and conv.input[2] \
            else np.zeros(w.shape[0])
        k = gamma / np.sqrt(var + eps)
        w2 = (w * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        b2 = ((b - mean) * k + beta).astype(np.float32)
        wname, bname = f"{conv.name}_W_bnfold", f"{conv.name}_B_bnfold"
        new_inits += [numpy_helper.from_array(w2, wname), numpy_helper.from_array(b2, bname)]
        del conv.input[1:]
        conv.input.extend([wname, bname])
        conv.output[0] = bn.output[0]
        drop.append(bn)
        folded.append(bn.name)
    for n in drop:
        model.graph.node.remove(n)
    model.graph.initializer.extend(new_inits)
    drop_unused_initializers(model)
    return folded


def _channel_scale(c: np.ndarray, out_ch: int, axis_last: bool) -> np.ndarray | None:
    """``c`` as one factor per output channel when it varies along that axis only (the last
    axis of a MatMul's output, axis 1 of a Conv's), else None."""
    if c.size == 1:
        return np.full(out_ch, float(c.reshape(-1)[0]))
    shape = list(c.shape)
    if not shape:
        return None
    ch = len(shape) - 1 if axis_last else len(shape) - 3
    if ch < 0 or shape[ch] != out_ch or any(d != 1 for i, d in enumerate(shape) if i != ch):
        return None
    return c.reshape(-1).astype(np.float64)


def fold_channel_scales(model: onnx.ModelProto) -> list[str]:
    """Fold every ``Mul`` by a per-output-channel constant (a layer scale, ConvNeXt's gamma)
    into the MatMul (+ bias Add) or Conv before it; returns the folded Mul names.

    ``(x @ W + b) * g = x @ (W * g) + b * g`` per output channel, so the product needs no
    int8 op of its own (the quantizer has none for a constant that varies along the last
    axis of an NHWC tensor) and ends no DSA region. Folded only where every intermediate
    feeds the next op alone, the weights and bias are constants and the folded values
    are finite."""
    g = Graph(model)
    folded: list[str] = []
    drop: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    for mul in list(model.graph.node):
        if mul.op_type != "Mul" or len(mul.input) != 2:
            continue
        consts = [i for i in mul.input if g.is_const(i)]
        if len(consts) != 1:
            continue
        src = mul.input[0] if mul.input[1] == consts[0] else mul.input[1]
        prod = g.producer.get(src)
        if prod is None or not g.only_reader(src, mul):
            continue
        bias_add, layer, bias = None, prod, None
        if prod.op_type == "Add":
            ins = list(prod.input)
            bc = [i for i in ins if g.is_const(i)]
            other = [i for i in ins if not g.is_const(i)]
            if len(bc) != 1 or len(other) != 1:
                continue
            layer = g.producer.get(other[0])
            if layer is None or not g.only_reader(other[0], prod):
                continue
            bias_add, bias = prod, bc[0]
        if layer.op_type == "MatMul" and g.is_const(layer.input[1]):
            w = g.const(layer.input[1]).astype(np.float64)
            if w.ndim != 2:
                continue
            k = _channel_scale(g.const(consts[0]), w.shape[1], axis_last=True)
            if k is None:
                continue
            w2 = w * k[None, :]
        elif layer.op_type == "Conv" and g.is_const(layer.input[1]) and bias_add is None:
            w = g.const(layer.input[1]).astype(np.float64)
            k = _channel_scale(g.const(consts[0]), w.shape[0], axis_last=False)
            if k is None or (len(layer.input) > 2 and layer.input[2]
                             and not g.is_const(layer.input[2])):
                continue
            w2 = w * k.reshape(-1, *([1] * (w.ndim - 1)))
            if len(layer.input) > 2 and layer.input[2]:
                bias = layer.input[2]
        else:
            continue
        with np.errstate(over="ignore"):
            finite = np.isfinite(w2.astype(np.float32)).all()
        if not (np.isfinite(k).all() and finite):
            continue  # a non-finite scale stays a Mul of its own (the quantizer names it)
        if bias is not None:
            b = g.const(bias).astype(np.float64)
            per_channel = (b.ndim == 1 and b.size == k.size) if layer.op_type == "Conv" \
                else _channel_scale(b, k.size, axis_last=True) is not None
            if not per_channel:
                continue  # a bias that varies along another axis: not one per channel
            with np.errstate(over="ignore"):
                b2 = (np.broadcast_to(b.reshape(-1), k.shape) * k).astype(np.float32)
            if not np.isfinite(b2).all():
                continue
            bname = f"{mul.name}_B_scalefold"
            new_inits.append(numpy_helper.from_array(
                b2.reshape(b.shape if b.size == k.size else (k.size,)), bname))
            host = bias_add if bias_add is not None else layer
            idx = list(host.input).index(bias)
            host.input[idx] = bname
        wname = f"{mul.name}_W_scalefold"
        new_inits.append(numpy_helper.from_array(w2.astype(np.float32), wname))
        layer.input[1] = wname
        (bias_add or layer).output[0] = mul.output[0]
        drop.append(mul)
        folded.append(mul.name)
        g.producer[mul.output[0]] = bias_add or layer
    for n in drop:
        model.graph.node.remove(n)
    model.graph.initializer.extend(new_inits)
    drop_unused_initializers(model)
    return folded
