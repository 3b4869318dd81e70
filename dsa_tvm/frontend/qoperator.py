"""QOperator int8 models (QLinearConv, QLinearAdd, QGemm, ConvInteger, ...) rewritten as QDQ.

onnxruntime's ``quantize_static(..., quant_format=QuantFormat.QOperator)`` and
``quantize_dynamic`` write integer operators that TVM 0.27's ONNX importer rejects.
:func:`to_qdq` replaces each by the equivalent ``DequantizeLinear -> float op ->
QuantizeLinear`` group (the table is ``qoperator_ops``), then shifts uint8 tensors to
int8 (exact), so the model imports and the DSA's patterns offload it like any QDQ model.

    from dsa_tvm.frontend.qoperator import has_qoperator, to_qdq
    qdq, notes = to_qdq(onnx.load("model_qop.onnx"))     # notes: what was rewritten
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import version_converter

from .onnx_graph import MIN_OPSET, Graph, load, with_shapes
from .qoperator_graph import Emitter, QOperatorError, shift_uint8
from .qoperator_ops import MS, PASSTHROUGH, QUANTIZED_OUTPUT, REWRITES, Rewrite
from .qoperator_softmax import qlinear_softmax

__all__ = ["QOperatorError", "has_qoperator", "to_qdq"]

#: integer ops TVM's importer reads itself (checked against onnxruntime in the tests)
NATIVE = frozenset({"MatMulInteger", "DynamicQuantizeLinear"})

#: every op the rewrite handles: (domain, op type) -> rewrite
TABLE: dict[tuple[str, str], Rewrite] = {**REWRITES, (MS, "QLinearSoftmax"): qlinear_softmax}
#: rewrites that need their input's static shape: run once the graph before them is plain
#: ONNX (shape inference cannot see through com.microsoft ops)
NEEDS_SHAPE = frozenset({(MS, "QLinearSoftmax")})


def _is_qoperator(node: onnx.NodeProto) -> bool:
    dom = "" if node.domain == "ai.onnx" else node.domain
    if (dom, node.op_type) in TABLE:
        return True
    return node.op_type.startswith("QLinear") or (dom == MS and node.op_type in ("QGemm", "QAttention"))


def has_qoperator(model: onnx.ModelProto) -> bool:
    """True if ``model`` has integer ops TVM's importer cannot read (QLinear*, QGemm, ConvInteger)."""
    return any(_is_qoperator(n) for n in model.graph.node)


def _ensure_opset(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """Per-channel DequantizeLinear needs opset 13; older models are converted first."""
    ver = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if ver >= MIN_OPSET:
        return model
    try:
        out = version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # noqa: BLE001 - reported with the cause
        raise QOperatorError(f"opset {ver}: the QDQ form needs opset >= {MIN_OPSET} (per-channel "
                             f"DequantizeLinear) and onnx.version_converter failed: {e}") from e
    notes.append(f"converted opset {ver} -> {MIN_OPSET} (per-channel DequantizeLinear)")
    return out


def _quant_params(node: onnx.NodeProto, qparams: dict[str, tuple[str, str]]) -> None:
    """Record (scale, zero point) of the quantized tensors ``node`` produces."""
    where = QUANTIZED_OUTPUT.get(node.op_type)
    if node.op_type == "DynamicQuantizeLinear":
        qparams[node.output[0]] = (node.output[1], node.output[2])
    elif where is not None:
        s, z = where
        zp = node.input[z] if z < len(node.input) else ""
        if s < len(node.input) and node.input[s]:
            qparams[node.output[0]] = (node.input[s], zp)


def _passthrough(node: onnx.NodeProto, em: Emitter, scale: str, zp: str,
                 qparams: dict[str, tuple[str, str]]) -> bool:
    """DQ -> op -> Q with the input's parameters; False (node kept as is) when not exact."""
    base = node.output[0]
    rest = list(node.input[1:])
    if node.op_type == "Pad" and _attr_str(node, "mode", "constant") == "constant":
        # the pad value is a code (0 when absent): its float value is (c - z) * s
        s_val, z_val = em.value(scale), em.value(zp) if zp else np.zeros((), np.uint8)
        c_val = em.value(rest[1]) if len(rest) > 1 and rest[1] else np.zeros((), np.int64)
        if s_val is None or z_val is None or c_val is None or s_val.size != 1:
            return False
        pad = np.float32((int(c_val) - int(z_val)) * np.float32(s_val))
        rest = [rest[0], em.const(np.array(pad, np.float32), base + "_pad_value"), *rest[2:]]
    if node.op_type == "Resize" and _attr_str(node, "mode", "nearest") != "nearest":
        return False  # interpolating codes is arithmetic: no exact DQ -> op -> Q form
    x = em.dq(node.input[0], scale, zp, base + "_in")
    outs = em.node(node.op_type, [x, *rest], base + "_" + node.op_type.lower(),
                   n_out=len(node.output), attrs=list(node.attribute))
    for o, y in zip(node.output, outs, strict=True):
        em.q(y, scale, zp, o)
        qparams[o] = (scale, zp)
    return True


def _attr_str(node: onnx.NodeProto, name: str, default: str) -> str:
    for a in node.attribute:
        if a.name == name:
            return a.s.decode()
    return default


def _key(n: onnx.NodeProto) -> tuple[str, str]:
    return ("" if n.domain == "ai.onnx" else n.domain, n.op_type)


def _expand_shaped(model: onnx.ModelProto, em: Emitter) -> None:
    """Rewrite the NEEDS_SHAPE nodes left in ``em.nodes``, in rounds: shape inference on the
    graph rewritten so far gives the inputs of those whose producers are plain ONNX now."""
    while any(_key(n) in NEEDS_SHAPE for n in em.nodes):
        tmp = onnx.ModelProto()
        tmp.CopyFrom(model)
        del tmp.graph.node[:]
        tmp.graph.node.extend(em.nodes)
        tmp.graph.initializer.extend(em.new_inits)
        em.g.shapes.update({k: v for k, v in Graph(with_shapes(tmp)).shapes.items() if v})
        pending = [n for n in em.nodes if _key(n) in NEEDS_SHAPE]
        ready = [n for n in pending if em.g.shape(n.input[0])] or pending[:1]  # else: its error
        out: list[onnx.NodeProto] = []
        for n in em.nodes:
            if any(n is r for r in ready):
                saved, em.nodes = em.nodes, []
                TABLE[_key(n)](n, em)
                out += em.nodes
                em.nodes = saved
            else:
                out.append(n)
        em.nodes = out


def _rewrite(model: onnx.ModelProto) -> tuple[Emitter, Counter, Counter]:
    """Replace every QOperator node (and data movement on codes) in graph order."""
    em = Emitter(Graph(with_shapes(model)))
    rewritten: Counter = Counter()
    passed: Counter = Counter()
    qparams: dict[str, tuple[str, str]] = {}
    for n in model.graph.node:
        key = _key(n)
        _quant_params(n, qparams)
        if key in NEEDS_SHAPE:
            em.nodes.append(n)  # expanded by _expand_shaped once shapes are known
            rewritten[n.op_type] += 1
        elif key in TABLE:
            TABLE[key](n, em)
            rewritten[n.op_type] += 1
        elif (key[0] == "" and n.op_type in PASSTHROUGH and n.input[0] in qparams
              and _passthrough(n, em, *qparams[n.input[0]], qparams)):
            passed[n.op_type] += 1
        else:
            em.nodes.append(n)
    _expand_shaped(model, em)
    return em, rewritten, passed


def _counts(c: Counter) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(c.items()))


def to_qdq(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The QDQ equivalent of a QOperator model, and notes on what was rewritten.

    Raises :class:`QOperatorError` for a node that cannot be rewritten (a missing scale,
    a quantized op without a rewrite), naming the node and the cause.
    """
    notes: list[str] = []
    model = _ensure_opset(load(model), notes)
    unknown = sorted({f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in model.graph.node
                      if _is_qoperator(n) and _key(n) not in TABLE})
    if unknown:
        raise QOperatorError(f"no QDQ rewrite for {', '.join(unknown)}: these quantized operators "
                             f"cannot be imported; quantize the FP32 model to QDQ instead "
                             f"(dsa_tvm.quant.quantize_onnx or quantize_static(quant_format=QDQ))")
    em, rewritten, passed = _rewrite(model)
    del model.graph.node[:]
    model.graph.node.extend(em.nodes)
    model.graph.initializer.extend(em.new_inits)
    del model.graph.value_info[:]  # quantized tensors change type (uint8 -> int8); TVM re-infers
    if not any(n.domain == MS for n in model.graph.node):
        keep = [o for o in model.opset_import if o.domain != MS]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    if rewritten:
        notes.append(f"rewritten to QDQ: {_counts(rewritten)}")
    if passed:
        notes.append(f"quantized data movement as DQ -> op -> Q (same parameters, exact): {_counts(passed)}")
    if rewritten.get("ConvInteger"):
        notes.append(f"ConvInteger x{rewritten['ConvInteger']}: no quantized output, so no QDQ "
                     "form: computed exactly on the CPU (float64 conv of the centered integers)")
    if rewritten.get("QLinearSoftmax"):
        notes.append(f"QLinearSoftmax x{rewritten['QLinearSoftmax']}: no exact QDQ form: computed "
                     "on the CPU as onnxruntime's kernel does (exp table, floor(1 / y_scale))")
    native = Counter(n.op_type for n in model.graph.node if n.op_type in NATIVE)
    if native:
        notes.append(f"imported by TVM as they are (CPU, runtime scales): {_counts(native)}")
    shifted = shift_uint8(model)
    if shifted:
        notes.append("uint8 -> int8 (q - 128, zero point - 128, exact): "
                     + ", ".join(f"{v} {k} tensor(s)" for k, v in sorted(shifted.items())))
    return model, notes
