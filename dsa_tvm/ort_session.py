"""The one way this project opens an onnxruntime session (quiet, CPU provider, exact).

``optimize=False`` disables every graph optimization: onnxruntime then runs a QDQ graph
op by op in float, the reference the DSA's outputs and the quantizer are checked
against; with optimizations on, it fuses QDQ groups into its own integer kernels.

Exact on every x86 machine: onnxruntime's uint8 x int8 kernels sum neighbouring products
in saturating 16 bits on CPUs without VNNI (255 * 127 * 2 > 32767), so a QOperator
reference would depend on the machine that runs it. Its own fix (the session entry
``session.x64quantprecision``) is a graph transformer that does not run with
optimizations off, so int8 weight constants of uint8-activation integer ops are moved to
uint8 here (``w + 128`` with zero point ``z + 128``: the same integers), which takes the
exact uint8 x uint8 kernels.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

# op -> (activation zero point input, weight input, weight zero point input); activation 0
_INTEGER_OPS = {
    "QLinearConv": (2, 3, 5),
    "QLinearMatMul": (2, 3, 5),
    "QGemm": (2, 3, 5),
    "MatMulInteger": (2, 1, 3),
    "ConvInteger": (2, 1, 3),
    "MatMulIntegerToFloat": (4, 1, 5),
    "DynamicQuantizeMatMul": (None, 1, 3),  # quantizes its float input to uint8 itself
}


def session(model: onnx.ModelProto, optimize: bool = True):
    """An onnxruntime CPU session of ``model`` (``optimize=False``: op by op)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.x64quantprecision", "1")
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = uint8_weights(model)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def uint8_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the int8 weight constants of uint8-activation integer ops in uint8
    (a copy; ``model`` itself when nothing changes)."""
    if not any(n.op_type in _INTEGER_OPS for n in model.graph.node):
        return model
    inits = {t.name: t for t in model.graph.initializer}
    types = _activation_types(model)
    if not any(_shiftable(n, inits, types) for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g, done = out.graph, {}
    for n in (m for m in g.node if _shiftable(m, inits, types)):
        _, w_at, zp_at = _INTEGER_OPS[n.op_type]
        while len(n.input) <= zp_at:
            n.input.append("")
        n.input[w_at] = _shifted(g, done, inits, n.input[w_at])
        n.input[zp_at] = _shifted(g, done, inits, n.input[zp_at])
    return out


def _activation_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor onnx's type inference (or the graph) can name."""
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - inference is a convenience; the graph's own info stays
        graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    for n in model.graph.node:  # contrib ops onnx cannot type
        if n.op_type == "DynamicQuantizeLinear":
            types[n.output[0]] = types[n.output[2]] = TensorProto.UINT8
    return types


def _shiftable(n: onnx.NodeProto, inits: dict, types: dict[str, int]) -> bool:
    spec = _INTEGER_OPS.get(n.op_type)
    if spec is None or n.domain not in ("", "ai.onnx", "com.microsoft"):
        return False
    a_zp, w_at, zp_at = spec
    w = inits.get(n.input[w_at]) if len(n.input) > w_at else None
    zp = n.input[zp_at] if len(n.input) > zp_at else ""
    if w is None or w.data_type != TensorProto.INT8 or (zp and zp not in inits):
        return False
    if a_zp is None:
        return True
    a_type = types.get(n.input[a_zp]) if len(n.input) > a_zp and n.input[a_zp] else None
    return (a_type or types.get(n.input[0])) == TensorProto.UINT8  # unknown: left as it is


def _shifted(g: onnx.GraphProto, done: dict, inits: dict, name: str) -> str:
    """The uint8 copy (``+ 128``) of int8 constant ``name``; a zero 128 for an absent one."""
    if name in done:
        return done[name]
    codes = numpy_helper.to_array(inits[name]) if name else np.zeros((), np.int8)
    new = f"{name or 'zero_point'}_u8_{len(done)}"
    g.initializer.append(numpy_helper.from_array((codes.astype(np.int16) + 128).astype(np.uint8), new))
    done[name] = new
    return new
