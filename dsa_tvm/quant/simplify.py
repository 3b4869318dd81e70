"""Graph clean-ups before quantization: fold constant subgraphs, fold zero Pad into Conv.

Exporters emit TF-style "same" padding as a shape-computing subgraph feeding a Pad
before strided convolutions. Folding it to a constant and then into the Conv's own
``pads`` keeps the conv one DSA layer (a separate Pad would be a CPU op between int8
tensors, with a quantization step of its own).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .onnx_graph import Graph

#: ops never folded even with constant inputs
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
           "QuantizeLinear", "DequantizeLinear"}
#: largest constant (elements) a fold may produce; bigger ones are left to the runtime
MAX_FOLD_ELEMENTS = 1 << 22


def fold_constants(model: onnx.ModelProto) -> int:
    """Replace nodes whose inputs are all constants by initializers; returns how many."""
    from onnx.reference import ReferenceEvaluator

    g = Graph(model)
    consts = {k: g.const(k) for k in g.inits}
    keep, folded = [], 0
    for n in model.graph.node:
        if n.op_type == "Constant":
            keep.append(n)
            continue
        ins = [i for i in n.input if i]
        if n.op_type in NO_FOLD or n.domain not in ("", "ai.onnx") or not ins or \
                not all(i in consts for i in ins) or any(a.type == onnx.AttributeProto.GRAPH
                                                         for a in n.attribute):
            keep.append(n)
            continue
        try:
            ev = ReferenceEvaluator(helper.make_model(
                helper.make_graph([n], "fold", [], [helper.make_tensor_value_info(o, 0, None)
                                                    for o in n.output],
                                  [numpy_helper.from_array(np.asarray(consts[i]), i) for i in set(ins)]),
                opset_imports=model.opset_import))
            outs = ev.run(None, {})
        except Exception:  # noqa: BLE001 - an op the reference cannot run stays in the graph
            keep.append(n)
            continue
        if any(np.asarray(o).size > MAX_FOLD_ELEMENTS for o in outs):
            keep.append(n)
            continue
        for name, val in zip(n.output, outs):
            consts[name] = np.asarray(val)
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(val), name))
        folded += 1
    del model.graph.node[:]
    model.graph.node.extend(keep)
    _drop_dead(model)
    return folded


def fold_pads(model: onnx.ModelProto) -> int:
    """Fold ``Pad(x, const pads, 0)`` (constant mode, spatial pads only) into the Conv that
    alone consumes it; returns how many."""
    g = Graph(model)
    drop = []
    for pad in model.graph.node:
        if pad.op_type != "Pad" or (g.attr(pad, "mode", b"constant") or b"constant") not in (b"constant",
                                                                                          "constant"):
            continue
        cons = g.consumers.get(pad.output[0], [])
        if len(cons) != 1 or cons[0].op_type != "Conv" or pad.output[0] in g.outputs:
            continue
        conv = cons[0]
        if len(pad.input) < 2 or not g.is_const(pad.input[1]):
            continue
        if len(pad.input) > 2 and pad.input[2] and (not g.is_const(pad.input[2])
                                                    or np.any(g.const(pad.input[2]) != 0)):
            continue
        if len(pad.input) > 3 and pad.input[3]:
            continue  # explicit axes: rare, keep the Pad
        p = [int(v) for v in g.const(pad.input[1]).reshape(-1)]
        r = len(p) // 2
        begin, end = p[:r], p[r:]
        if r != 4 or any(begin[:2]) or any(end[:2]) or min(p) < 0:
            continue
        if (g.attr(conv, "auto_pad", b"NOTSET") or b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        old = list(g.attr(conv, "pads", [0, 0, 0, 0]))
        new = [old[0] + begin[2], old[1] + begin[3], old[2] + end[2], old[3] + end[3]]
        for a in list(conv.attribute):
            if a.name == "pads":
                conv.attribute.remove(a)
        conv.attribute.append(helper.make_attribute("pads", new))
        conv.input[0] = pad.input[0]
        drop.append(pad)
    for n in drop:
        model.graph.node.remove(n)
    _drop_dead(model)
    return len(drop)


def _drop_dead(model: onnx.ModelProto) -> None:
    """Remove nodes and initializers nothing reads (walking back from the outputs)."""
    needed = {o.name for o in model.graph.output}
    live = []
    for n in reversed(list(model.graph.node)):
        if any(o in needed for o in n.output):
            live.append(n)
            needed.update(i for i in n.input if i)
    del model.graph.node[:]
    model.graph.node.extend(reversed(live))
    inits = [i for i in model.graph.initializer if i.name in needed]
    names = {i.name for i in model.graph.initializer}
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    inputs = [i for i in model.graph.input if i.name in needed or i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
