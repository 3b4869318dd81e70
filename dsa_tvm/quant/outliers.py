"""Outlier channel split for dense layers (transformers).

BERT-family models have a few hidden channels whose values are ~100x the rest (one
FFN output channel of all-MiniLM-L6-v2 reaches 195 while the median channel stays
below 1). One per-tensor int8 scale for such a tensor leaves the ordinary channels a
handful of steps. The DSA needs per-tensor activations, so the outlier channels are
split off into a tiny FP32 side path (cf. LLM.int8()'s mixed decomposition):

    y = x @ W + b                                    (outlier output channels O)
 -> y = [x @ W_main + b_main] + (x @ W[:, O] + b[O]) @ P          (P: one-hot [|O|, N])

    y = x @ W                                        (outlier input features I, x made in FP32)
 -> y = (x * mask) @ W + x[..., I] @ W[I, :]

The rewritten FP32 graph computes exactly the same values; the main matmul keeps all
its MACs on the DSA with a narrow int8 range, the side paths are |O| or |I| columns
wide and stay FP32 on the CPU (their nodes are returned so the planner keeps them FP32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..frontend.onnx_graph import Graph

WEIGHTED = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


@dataclass(frozen=True)
class OutlierOptions:
    ratio: float = 8.0         # a channel is an outlier above ratio x the median channel magnitude
    max_channels: int = 8      # at most this many split channels per tensor


def outlier_channels(absmax: np.ndarray, opts: OutlierOptions) -> np.ndarray:
    """Indices of channels whose magnitude exceeds ``ratio`` x the median (largest first)."""
    med = float(np.median(absmax))
    if med <= 0:
        return np.zeros(0, np.int64)
    idx = np.nonzero(absmax > opts.ratio * med)[0]
    idx = idx[np.argsort(-absmax[idx])][:opts.max_channels]
    return np.sort(idx).astype(np.int64)


def split_candidates(g: Graph) -> list[tuple[onnx.NodeProto, onnx.NodeProto | None]]:
    """(MatMul, bias Add or None) pairs with a constant 2-D weight: where a split may apply."""
    out = []
    for n in g.model.graph.node:
        if n.op_type != "MatMul" or not g.is_const(n.input[1]) or len(g.shape(n.input[1]) or ()) != 2:
            continue
        cons = g.consumers.get(n.output[0], [])
        add = None
        if len(cons) == 1 and cons[0].op_type == "Add" and n.output[0] not in g.outputs:
            other = [i for i in cons[0].input if i != n.output[0]]
            if other and g.is_const(other[0]) and len(g.shape(other[0]) or ()) == 1:
                add = cons[0]
        out.append((n, add))
    return out


def split_outliers(model: onnx.ModelProto, absmax: dict[str, np.ndarray],
                   opts: OutlierOptions = OutlierOptions()) -> list[str]:
    """Rewrite ``model`` in place; ``absmax``: per-channel (last axis) magnitudes of the
    candidates' inputs and outputs from calibration. Returns the FP32 side-path nodes."""
    g = Graph(model)
    side: list[str] = []
    new_nodes: dict[str, list[onnx.NodeProto]] = {}   # insert after node name
    inits: list[onnx.TensorProto] = []

    def init(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    for mm, add in split_candidates(g):
        w = g.const(mm.input[1]).astype(np.float32)
        base = mm.name
        out = (add or mm).output[0]
        x = mm.input[0]
        prod = g.producer.get(x)
        o_idx = outlier_channels(absmax[out], opts) if out in absmax else np.zeros(0, np.int64)
        i_idx = np.zeros(0, np.int64)
        if x in absmax and (prod is None or prod.op_type not in WEIGHTED):
            i_idx = outlier_channels(absmax[x], opts)
        if not o_idx.size and not i_idx.size:
            continue
        after: list[onnx.NodeProto] = []
        w_main = w.copy()
        if i_idx.size:   # input features -> FP32 side path, masked out of the main input
            mask = np.ones(w.shape[0], np.float32)
            mask[i_idx] = 0
            masked = f"{base}/x_main"
            new_nodes.setdefault(f"before:{mm.name}", []).append(helper.make_node(
                "Mul", [x, init(f"{base}/x_mask", mask)], [masked], name=f"{base}/outlier_mask"))
            mm.input[0] = masked
        main_out = f"{base}/main"
        final_src = (add or mm)
        y_name = final_src.output[0]
        final_src.output[0] = main_out
        terms = [main_out]
        if o_idx.size:   # output channels: zero them in the main weights and bias
            w_main[:, o_idx] = 0
            wo = w[:, o_idx]
            xo = f"{base}/xo"
            xin = x
            place = np.zeros((o_idx.size, w.shape[1]), np.float32)
            place[np.arange(o_idx.size), o_idx] = 1
            after.append(helper.make_node("MatMul", [xin, init(f"{base}/W_out", wo)], [xo],
                                          name=f"{base}/outlier_out_matmul"))
            src = xo
            if add is not None:
                bname = [i for i in add.input if i != mm.output[0]][0]
                b = g.const(bname).astype(np.float32)
                b_main = b.copy()
                b_main[o_idx] = 0
                after.append(helper.make_node("Add", [xo, init(f"{base}/B_out", b[o_idx])],
                                              [f"{base}/xo_b"], name=f"{base}/outlier_out_bias"))
                src = f"{base}/xo_b"
                for k, i in enumerate(add.input):
                    if i == bname:
                        add.input[k] = init(f"{base}/B_main", b_main)
            after.append(helper.make_node("MatMul", [src, init(f"{base}/place", place)], [f"{base}/yo"],
                                          name=f"{base}/outlier_out_place"))
            terms.append(f"{base}/yo")
        if i_idx.size:
            after.append(helper.make_node("Gather", [x, init(f"{base}/in_idx", i_idx)], [f"{base}/xi"],
                                          name=f"{base}/outlier_in_gather", axis=-1))
            wi = w[i_idx, :].copy()
            if o_idx.size:
                wi[:, o_idx] = 0   # those columns are already complete in the output path
            after.append(helper.make_node("MatMul", [f"{base}/xi", init(f"{base}/W_in", wi)],
                                          [f"{base}/yi"], name=f"{base}/outlier_in_matmul"))
            terms.append(f"{base}/yi")
        if i_idx.size:
            w_main[i_idx, :] = 0
        mm.input[1] = init(f"{base}/W_main", w_main)
        acc = terms[0]
        for k, t in enumerate(terms[1:]):
            dst = y_name if k == len(terms) - 2 else f"{base}/sum{k}"
            after.append(helper.make_node("Add", [acc, t], [dst], name=f"{base}/outlier_sum{k}"))
            acc = dst
        new_nodes.setdefault(f"after:{final_src.name}", []).extend(after)
        side += [n.name for n in after]
        side += [n.name for n in new_nodes.get(f"before:{mm.name}", [])]
    if not side:
        return []
    order = []
    for n in model.graph.node:
        order += new_nodes.get(f"before:{n.name}", [])
        order.append(n)
        order += new_nodes.get(f"after:{n.name}", [])
    del model.graph.node[:]
    model.graph.node.extend(order)
    model.graph.initializer.extend(inits)
    return side
