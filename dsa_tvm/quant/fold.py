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

from ..frontend.onnx_graph import Graph


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
        if conv is None or conv.op_type != "Conv" or len(g.consumers[conv.output[0]]) != 1:
            continue
        if conv.output[0] in g.outputs:
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
    _drop_unused_initializers(model)
    return folded


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    inits = {i.name for i in model.graph.initializer}
    keep = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    # graph inputs that only declared a now-dropped initializer go too
    inputs = [i for i in model.graph.input if i.name in used or i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
