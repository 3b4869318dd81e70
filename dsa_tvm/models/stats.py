"""Model size figures: parameter count, per-layer MACs, and intermediate activation ranges."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, shape_inference

from .quantize import run_onnxruntime


@dataclass(frozen=True)
class LayerMacs:
    """Multiply-accumulates of one Conv/Gemm/MatMul node."""

    name: str
    op: str
    macs: int


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inferred = shape_inference.infer_shapes(model)
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = tuple(d.dim_value for d in dims)
    for init in model.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def param_count(model: onnx.ModelProto) -> int:
    """Number of weights: initializers with >= 2 elements, int64 shape tensors excluded
    (meant for FP32 models; in a QDQ model per-channel scales would count too)."""
    total = 0
    for init in model.graph.initializer:
        n = int(np.prod(init.dims)) if init.dims else 1
        if n >= 2 and init.data_type != onnx.TensorProto.INT64:
            total += n
    return total


def layer_macs(model: onnx.ModelProto) -> list[LayerMacs]:
    """MACs of every Conv, Gemm and MatMul node (static shapes)."""
    shapes = _shapes(model)
    rows = []
    for node in model.graph.node:
        out = shapes.get(node.output[0])
        if node.op_type == "Conv" and out:
            w = shapes[node.input[1]]           # (cout, cin/group, kh, kw)
            macs = int(np.prod(out)) * int(np.prod(w[1:]))
        elif node.op_type in ("Gemm", "MatMul") and out:
            a = shapes[node.input[0]]
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[-2] if trans_a and node.op_type == "Gemm" else a[-1]
            macs = int(np.prod(out)) * int(k)
        else:
            continue
        rows.append(LayerMacs(node.name, node.op_type, macs))
    return rows


def total_macs(model: onnx.ModelProto) -> int:
    """Sum of :func:`layer_macs`."""
    return sum(r.macs for r in layer_macs(model))


def activation_ranges(model: onnx.ModelProto,
                      feed: Mapping[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """(std, max |x|) of every node output for one input, via onnxruntime."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    existing = {o.name for o in m.graph.output}
    names = [o for n in m.graph.node for o in n.output if o and o not in existing]
    m.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    outs = run_onnxruntime(m, feed, optimize=False)
    allnames = [o.name for o in m.graph.output]
    return {n: (float(np.std(v)), float(np.max(np.abs(v)))) for n, v in zip(allnames, outs)
            if np.asarray(v).dtype.kind == "f"}


def summary(model: onnx.ModelProto) -> dict[str, int]:
    """{"params": ..., "macs": ..., "nodes": ...} of a model."""
    return {"params": param_count(model), "macs": total_macs(model), "nodes": len(model.graph.node)}


__all__ = ["LayerMacs", "activation_ranges", "layer_macs", "param_count", "summary",
           "total_macs"]
