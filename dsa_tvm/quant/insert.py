"""Write the QDQ model: QuantizeLinear/DequantizeLinear pairs on activations, int8
per-channel weights and int32 biases behind DequantizeLinear.

This is the form onnxruntime's QDQ quantizer emits and TVM's ONNX importer turns into
``dequantize(int8 const) -> conv2d/matmul -> add(dequantize(int32 const)) -> quantize``,
which is what the DSA partitioner's patterns anchor on.

Naming: an activation ``t`` produced by an int8 op keeps its name on the *dequantized*
value (the producer now writes ``t/fp32``), so the FP32 and the int8 model can be
compared tensor by tensor under the same names. An activation produced in FP32 (a graph
input, a LayerNorm) keeps its exact value for FP32 readers; int8 readers read ``t/dq``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..frontend.onnx_graph import Graph
from ..layers.group_grid import find_grid, group_grid
from .bias_correction import conv_shift, dense_shift
from .plan import Anchor, Plan
from .qparams import (
    ActQuant,
    bias_input_scale_floor,
    bias_qparams,
    bias_weight_scale_floor,
    quantize_bias,
    quantize_weight,
    weight_qparams,
)


def _add_init(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def insert_qdq(model: onnx.ModelProto, plan: Plan, act_qparams: dict[str, ActQuant],
               per_channel: bool = True, input_means: dict[str, np.ndarray] | None = None,
               weight_bits: int = 8, weight_group: int = 0,
               wide_weights: frozenset[str] = frozenset(),
               keep_grids: bool = True) -> onnx.ModelProto:
    """A new model: ``model`` with the plan's QDQ pairs. ``act_qparams`` maps group roots
    (see :meth:`Plan.root`) to their int8 qparams. ``input_means`` (anchor input tensor ->
    per-channel mean) turns on bias correction (``bias_correction.py``). ``weight_group``:
    MatMul weights rounded per group of that many input rows instead (:func:`_grouped`;
    ``wide_weights`` names the MatMuls whose groups take 8 bits). ``keep_grids``: a MatMul
    weight already on a per-group grid (a weight-only int4 model through intake) stays as
    it is (:func:`_kept_on_grid`)."""
    q = onnx.ModelProto()
    q.CopyFrom(model)
    g = Graph(q)
    nodes = list(q.graph.node)
    new_nodes: list[onnx.NodeProto] = []
    qdq_after: dict[str, list[onnx.NodeProto]] = {}  # producer output -> its Q/DQ nodes

    def qp_of(t: str) -> ActQuant:
        root = plan.root(t)
        if root not in act_qparams:
            raise KeyError(f"no quantization parameters for tensor '{t}' (group '{root}')")
        return act_qparams[root]

    readers = plan.quantized_nodes
    renamed_for: dict[str, str] = {}  # tensors produced in FP32: only int8 readers take t/dq
    for t in sorted(plan.tensors):
        qp = qp_of(t)
        s = _add_init(q, f"{t}/scale", np.array(qp.scale, np.float32))
        z = _add_init(q, f"{t}/zero_point", np.array(qp.zero_point, qp.dtype))
        prod = g.producer.get(t)
        if t in g.inputs or prod is None or prod.name not in readers:
            # FP32 producer: FP32 readers keep the exact value, int8 readers the dequantized one
            src, out = t, f"{t}/dq"
            renamed_for[t] = out
        else:
            # int8 producer: the value only exists quantized, every reader takes it dequantized
            src, out = f"{t}/fp32", t
            for k, o in enumerate(prod.output):
                if o == t:
                    prod.output[k] = src
        pair = [helper.make_node("QuantizeLinear", [src, s, z], [f"{t}/q"], name=f"{t}/QuantizeLinear"),
                helper.make_node("DequantizeLinear", [f"{t}/q", s, z], [out],
                                 name=f"{t}/DequantizeLinear")]
        qdq_after[src] = pair
    # weights and biases
    by_name = {n.name: n for n in nodes}  # the plan names nodes of ``model``; edit the copy's
    for a in plan.anchors.values():
        n = by_name[a.node.name]
        if keep_grids and _kept_on_grid(q, g, a, n):
            continue
        if weight_group and _grouped(q, g, a, n, weight_group,
                                     8 if n.name in wide_weights else weight_bits,
                                     input_means):
            continue
        ints = anchor_ints(g, a, per_channel, input_means, qp_of(n.input[0]).scale,
                           weight_bits)
        ws, axis, base = ints.w_scales, ints.axis, n.name
        wq_name = _add_init(q, f"{base}/W_int8", ints.w_int8)
        ws_name = _add_init(q, f"{base}/W_scale", ws if axis is not None else ws.reshape(()))
        wz_name = _add_init(q, f"{base}/W_zero_point", np.zeros(ws.shape if axis is not None else (),
                                                                np.int8))
        attrs = {"axis": axis} if axis is not None else {}
        new_nodes.append(helper.make_node("DequantizeLinear", [wq_name, ws_name, wz_name],
                                          [f"{base}/W_dq"], name=f"{base}/W_DequantizeLinear", **attrs))
        n.input[1] = f"{base}/W_dq"
        if ints.bias is not None and a.bias is None:  # a bias to carry the correction
            a_bias = _add_init(q, f"{base}/B_corrected", ints.bias)
            while len(n.input) < 3:
                n.input.append("")
            n.input[2] = a_bias
            g.inits[a_bias] = q.graph.initializer[-1]
            a = _with_bias(a, a_bias)
        if ints.bias is not None:
            b = ints.bias
            bs = bias_qparams(qp_of(n.input[0]).scale, ws, b.size)
            bq = quantize_bias(b, bs)
            bq_name = _add_init(q, f"{base}/B_int32", bq)
            bs_name = _add_init(q, f"{base}/B_scale", bs)
            bz_name = _add_init(q, f"{base}/B_zero_point", np.zeros(b.size, np.int32))
            new_nodes.append(helper.make_node("DequantizeLinear", [bq_name, bs_name, bz_name],
                                              [f"{base}/B_dq"], name=f"{base}/B_DequantizeLinear",
                                              axis=0))
            if a.bias_add is not None:
                # matmul result first, bias second: the order the DSA's dense pattern matches
                add = by_name[a.bias_add.name]
                add.input[0], add.input[1] = n.output[0], f"{base}/B_dq"
            else:
                n.input[2] = f"{base}/B_dq"
    # rewire activation consumers of graph inputs, then order: weight DQs first, then each
    # node followed by the Q/DQ of its outputs
    order: list[onnx.NodeProto] = list(new_nodes)
    for src, pair in qdq_after.items():
        if src in g.inputs or src not in {o for n in nodes for o in n.output}:
            order.extend(pair)
    for n in nodes:
        if n.name in readers:
            for k, i in enumerate(n.input):
                if i in renamed_for:
                    n.input[k] = renamed_for[i]
        order.append(n)
        for o in n.output:
            order.extend(qdq_after.get(o, []))
    del q.graph.node[:]
    q.graph.node.extend(order)
    _drop_unused(q)
    _ensure_opset(q)
    return q


def _grouped(q: onnx.ModelProto, g: Graph, a: Anchor, n: onnx.NodeProto, group: int,
             bits: int, input_means: dict[str, np.ndarray] | None = None) -> bool:
    """A MatMul's 2-D weight, or a pointwise Conv's, replaced by its float32 values on a
    ``bits``-bit grid per ``group`` input rows (channels) with a minimum (GGUF Q4_1's form,
    ``layers.group_grid``): a QDQ graph's int8 codes cannot carry a scale and an offset
    per group, so the weight stays float and the DSA's grouped dense finds the grid again
    (a 1x1 conv runs as that dense over the image's pixels). False (untouched) for any
    other anchor."""
    w = _matmul_weight(g, a, n)
    if w is not None:
        grid = group_grid(np.asarray(w, np.float64).T, group, bits)
        n.input[1] = _add_init(q, f"{n.name}/W_grouped", grid.values().T.astype(np.float32))
        _bias_second(q, a, n)
        return True
    w = _pointwise_weight(g, a, n, group)
    if w is None:
        return False
    values = group_grid(w.reshape(w.shape[0], -1), group, bits).values().reshape(w.shape)
    n.input[1] = _add_init(q, f"{n.name}/W_grouped", values.astype(np.float32))
    if input_means is not None and n.input[0] in input_means:
        # the grid's rounding moves each channel's mean output; its offsets do not undo it
        bias = np.zeros(w.shape[0]) if a.bias is None else g.const(a.bias).reshape(-1)
        bias = bias + conv_shift(w - values, input_means[n.input[0]], 1)
        while len(n.input) < 3:
            n.input.append("")
        n.input[2] = _add_init(q, f"{n.name}/B_corrected", bias.astype(np.float32))
    return True


def _pointwise_weight(g: Graph, a: Anchor, n: onnx.NodeProto, group: int) -> np.ndarray | None:
    """A Conv's float64 (O, I, 1, 1) weight if the conv is a dense over its image's pixels
    (stride 1, no padding, groups 1) whose I channels split into whole groups."""
    w = g.const(a.weight)
    if n.op_type != "Conv" or w is None or w.ndim != 4 or tuple(w.shape[2:]) != (1, 1):
        return None
    pad = g.attr(n, "auto_pad", b"NOTSET")
    pad = pad.decode() if isinstance(pad, bytes) else str(pad)
    if (int(g.attr(n, "group", 1)) != 1 or any(int(v) != 1 for v in g.attr(n, "strides", [1]))
            or any(int(v) for v in g.attr(n, "pads", [0])) or pad not in ("NOTSET", "VALID")
            or w.shape[1] % group):
        return None
    return np.asarray(w, np.float64)


def _kept_on_grid(q: onnx.ModelProto, g: Graph, a: Anchor, n: onnx.NodeProto) -> bool:
    """A MatMul's 2-D float weight that already lies on a per-group grid
    (``layers.group_grid.find_grid``: 4 or 8 bits, a scale and an offset per block of input
    rows, as onnxruntime's MatMulNBits and GGUF ship them) is left as it is: re-rounding it
    to int8 per channel would move every weight off the grid the model was trained for."""
    w = _matmul_weight(g, a, n)
    if w is None or find_grid(np.ascontiguousarray(np.asarray(w, np.float32).T)) is None:
        return False
    _bias_second(q, a, n)
    return True


def _matmul_weight(g: Graph, a: Anchor, n: onnx.NodeProto) -> np.ndarray | None:
    w = g.const(a.weight)
    return w if n.op_type == "MatMul" and w is not None and w.ndim == 2 else None


def _bias_second(q: onnx.ModelProto, a: Anchor, n: onnx.NodeProto) -> None:
    """The matmul's result first, the bias second: the order the DSA's pattern matches."""
    if a.bias_add is not None:
        add = next(x for x in q.graph.node if x.name == a.bias_add.name)
        add.input[0], add.input[1] = n.output[0], a.bias


@dataclass(frozen=True)
class AnchorInts:
    """A weighted layer's int8 weights and the float bias its int32 bias will encode."""

    w_scales: np.ndarray       # float32, one per output channel (or one)
    w_int8: np.ndarray
    axis: int | None           # the per-channel axis, None for per-tensor weights
    channel_axis: int          # the weight's output-channel axis
    bias: np.ndarray | None    # float32 per channel, bias correction included


def anchor_ints(g: Graph, a: Anchor, per_channel: bool,
                input_means: dict[str, np.ndarray] | None, x_scale: float | None = None,
                weight_bits: int = 8) -> AnchorInts:
    """Weights quantized, and the bias moved by the rounding's mean shift
    (``bias_correction.py``; a Conv/Gemm without a bias gets one to carry it). Given the
    input scale, per-channel weight scales are raised where the int32 bias would not fit
    the accumulator's range (``qparams.bias_weight_scale_floor``)."""
    w = g.const(a.weight).astype(np.float32)
    axis = a.axis if per_channel else None
    ws = weight_qparams(w, axis, weight_bits)
    wq, bias = _weights_and_bias(g, a, w, ws, axis, input_means, weight_bits)
    if x_scale is not None and axis is not None and bias is not None:
        floor = bias_weight_scale_floor(bias, x_scale, w.size // w.shape[axis])
        if np.any(ws < floor):
            ws = np.maximum(ws, floor).astype(np.float32)
            wq, bias = _weights_and_bias(g, a, w, ws, axis, input_means, weight_bits)
    return AnchorInts(ws, wq, axis, a.axis, bias)


def _weights_and_bias(g: Graph, a: Anchor, w: np.ndarray, ws: np.ndarray, axis: int | None,
                      input_means: dict[str, np.ndarray] | None, weight_bits: int = 8
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    n = a.node
    wq = quantize_weight(w, ws, axis, weight_bits)
    shift = None
    if input_means is not None and n.input[0] in input_means:
        dw = w - quant_dequant(wq, ws, axis)
        if n.op_type == "ConvTranspose":
            shift = None  # no bias correction for transposed convs (their taps overlap)
        elif n.op_type == "Conv":
            shift = conv_shift(dw, input_means[n.input[0]], int(g.attr(n, "group", 1)))
        else:
            shift = dense_shift(dw, input_means[n.input[0]], a.axis == 0)
    bias = None
    if a.bias is not None:
        bias = g.const(a.bias).astype(np.float32).reshape(-1)
        if shift is not None:
            bias = (bias + shift).astype(np.float32)
    elif shift is not None and n.op_type in ("Conv", "Gemm"):
        bias = shift.astype(np.float32)
    return wq, bias


def bias_scale_floors(model: onnx.ModelProto, plan: Plan, per_channel: bool = True,
                      input_means: dict[str, np.ndarray] | None = None,
                      weight_bits: int = 8) -> dict[str, float]:
    """Anchor input tensor -> the smallest scale that keeps every int32 bias reading it
    in the accumulator's range (``qparams.bias_input_scale_floor``). Only per-tensor
    weights need it: per-channel weight scales are raised instead (:func:`anchor_ints`)."""
    out: dict[str, float] = {}
    if per_channel:  # every anchor has a channel axis: nothing to floor, nothing to quantize here
        return out
    g = Graph(model)
    for a in plan.anchors.values():
        ints = anchor_ints(g, a, per_channel, input_means, weight_bits=weight_bits)
        if ints.bias is None:
            continue
        ws = np.broadcast_to(ints.w_scales, ints.bias.shape)
        f = bias_input_scale_floor(ints.bias, ws, ints.w_int8, ints.channel_axis)
        x = a.node.input[0]
        out[x] = max(out.get(x, 0.0), f)
    return out


def quant_dequant(wq: np.ndarray, scales: np.ndarray, axis: int | None) -> np.ndarray:
    """The float weights an int8 weight tensor stands for."""
    shape = [1] * wq.ndim
    if axis is not None and scales.size > 1:
        shape[axis] = scales.size
    return wq.astype(np.float64) * scales.astype(np.float64).reshape(shape)


def _with_bias(a, bias: str):
    from dataclasses import replace

    return replace(a, bias=bias)


def _drop_unused(model: onnx.ModelProto) -> None:
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    # value_info of renamed tensors would now be stale: shape inference redoes it
    del model.graph.value_info[:]


def _ensure_opset(model: onnx.ModelProto) -> None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < 13:
            raise ValueError(f"opset {o.version}: per-channel QDQ needs opset >= 13 "
                             "(convert the model with onnx.version_converter first)")

