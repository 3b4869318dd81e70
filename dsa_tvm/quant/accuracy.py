"""FP32 vs int8, side by side: per-layer cosine/SQNR, output cosine, top-k agreement,
sensitivity ranking and automatic mixed precision.

The int8 side is the QDQ model run op by op in float by onnxruntime (no graph
optimization): the exact simulation of the QDQ arithmetic that TVM's build of the same
graph matches to within one quantization step. Both models name a quantized tensor the
same (``insert.py``), so layers are compared by name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ..frontend.onnx_graph import Graph
from .api import QuantizedModel
from .calibrate import progress, run_with_intermediates
from .checks import check_max_fp32, check_target_cosine
from .metrics import cosine, sqnr_db, topk_agreement

Feed = dict[str, np.ndarray]


@dataclass
class LayerRow:
    tensor: str
    layer: str      # the node producing the tensor in the FP32 model
    op: str
    cosine: float
    sqnr_db: float


@dataclass
class Sensitivity:
    layer: str
    op: str
    output_cosine: float   # final-output cosine with only this layer kept in FP32
    gain: float            # over the fully quantized model


@dataclass
class AccuracyReport:
    model: str
    method: str
    batches: int
    output_cosine: dict[str, float]
    output_sqnr_db: dict[str, float]
    topk: dict[str, float] = field(default_factory=dict)       # "top1" -> agreement
    layers: list[LayerRow] = field(default_factory=list)
    sensitivity: list[Sensitivity] = field(default_factory=list)
    kept_fp32: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def cosine(self) -> float:
        """The worst output cosine (the figure a target applies to)."""
        return min(self.output_cosine.values())

    def to_dict(self) -> dict:
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v
        return clean(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        out = [f"accuracy of int8 vs FP32: {self.model} ({self.method}, {self.batches} evaluation batches)"]
        for name, c in self.output_cosine.items():
            out.append(f"  output {name}: cosine {c:.5f}, SQNR {self.output_sqnr_db[name]:.1f} dB")
        for k, v in self.topk.items():
            out.append(f"  {k} agreement with FP32: {v:.1%}")
        if self.kept_fp32:
            out.append(f"  kept in FP32: {', '.join(self.kept_fp32)}")
        if self.layers:
            w = max(len(r.layer) for r in self.layers)
            out.append(f"  {'layer':<{w}}  {'op':<18} {'cosine':>8} {'SQNR dB':>8}")
            for r in self.layers:
                out.append(f"  {r.layer:<{w}}  {r.op:<18} {r.cosine:8.5f} {r.sqnr_db:8.1f}")
        if self.sensitivity:
            w = max(len(x.layer) for x in self.sensitivity)
            out.append("  sensitivity (output cosine with the layer kept in FP32, most sensitive first):")
            for s in self.sensitivity:
                out.append(f"    {s.layer:<{w}}  {s.op:<8} {s.output_cosine:.5f} ({s.gain:+.5f})")
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)


def _outputs(qm: QuantizedModel) -> list[str]:
    return [o.name for o in qm.fp32.graph.output]


def fp32_reference(qm: QuantizedModel, feeds: Sequence[Feed], tensors: Sequence[str] = ()
                   ) -> list[dict[str, np.ndarray]]:
    """FP32 values of ``tensors`` and the outputs for every feed."""
    names = list(dict.fromkeys(list(tensors) + _outputs(qm)))
    return list(run_with_intermediates(qm.fp32, feeds, names, optimize=True))


def int8_outputs(qm: QuantizedModel, feeds: Sequence[Feed], tensors: Sequence[str] = ()
                 ) -> list[dict[str, np.ndarray]]:
    """Int8 (QDQ, exact op-by-op simulation) values of ``tensors`` and the outputs."""
    names = list(dict.fromkeys(list(tensors) + _outputs(qm)))
    return list(run_with_intermediates(qm.model, feeds, names, optimize=False))


def output_cosine(qm: QuantizedModel, feeds: Sequence[Feed], ref: list[dict[str, np.ndarray]]) -> float:
    """Worst (over outputs) mean (over feeds) cosine of the int8 outputs against ``ref``."""
    got = int8_outputs(qm, feeds)
    return min(float(np.mean([cosine(r[o], g[o]) for r, g in zip(ref, got)])) for o in _outputs(qm))


def _is_classifier(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[1] >= 10


def sensitivity(qm: QuantizedModel, feeds: Sequence[Feed], ref: list[dict[str, np.ndarray]] | None = None,
                base: float | None = None, show_progress: bool = True) -> list[Sensitivity]:
    """Each weighted layer kept in FP32 alone (same calibration): the output cosine that
    buys, most sensitive first."""
    ref = ref if ref is not None else fp32_reference(qm, feeds)
    base = base if base is not None else output_cosine(qm, feeds, ref)
    rows = []
    kept = set(qm.options.keep_fp32)
    for name in progress(qm.quantized_layers, len(qm.quantized_layers), "sensitivity", show_progress):
        c = output_cosine(qm.requantize(kept | {name}), feeds, ref)
        rows.append(Sensitivity(name, qm.plan.anchors[name].node.op_type, c, c - base))
    rows.sort(key=lambda s: -s.gain)
    return rows


def mixed_precision(qm: QuantizedModel, feeds: Sequence[Feed], target: float = 0.99,
                    max_fp32: int = 8, ranking: list[Sensitivity] | None = None,
                    show_progress: bool = True) -> tuple[QuantizedModel, list[str], float]:
    """Keep the most sensitive layers in FP32, one more at a time, until the output cosine
    reaches ``target`` (or ``max_fp32`` layers are kept). Returns (model, kept, cosine)."""
    check_target_cosine(target)
    check_max_fp32(max_fp32)
    ref = fp32_reference(qm, feeds)
    cur = output_cosine(qm, feeds, ref)
    if cur >= target:
        return qm, [], cur
    ranking = ranking if ranking is not None else sensitivity(qm, feeds, ref, cur, show_progress)
    kept: list[str] = []
    best = qm
    for s in ranking[:max_fp32]:
        if s.gain <= 0:
            break
        kept.append(s.layer)
        best = qm.requantize(set(qm.options.keep_fp32) | set(kept))
        cur = output_cosine(best, feeds, ref)
        if cur >= target:
            break
    return best, kept, cur


def accuracy_report(qm: QuantizedModel, feeds: Sequence[Feed], per_layer: bool = True,
                    with_sensitivity: bool = False, name: str = "model",
                    show_progress: bool = False) -> AccuracyReport:
    """Run FP32 and int8 on ``feeds`` and compare (see the module docstring)."""
    g = Graph(qm.fp32)
    tensors = [] if qm.plan is None or not per_layer else \
        [t for n in qm.fp32.graph.node for t in n.output if t in qm.plan.tensors]
    ref = fp32_reference(qm, feeds, tensors)
    got = int8_outputs(qm, feeds, tensors)
    outs = _outputs(qm)
    rep = AccuracyReport(name, "passthrough (already QDQ)" if qm.passthrough else qm.options.method,
                         len(feeds), {}, {}, kept_fp32=sorted(qm.options.keep_fp32))
    for o in outs:
        rep.output_cosine[o] = float(np.mean([cosine(r[o], q[o]) for r, q in zip(ref, got)]))
        rep.output_sqnr_db[o] = sqnr_db(np.stack([r[o] for r in ref]), np.stack([q[o] for q in got]))
        if _is_classifier(np.shape(ref[0][o])):
            r = np.concatenate([x[o] for x in ref])
            q = np.concatenate([x[o] for x in got])
            rep.topk = {f"top{k}": topk_agreement(r, q, k) for k in (1, 5)}
    for t in tensors:
        node = g.producer.get(t)
        rep.layers.append(LayerRow(t, node.name if node else t, node.op_type if node else "input",
                                   float(np.mean([cosine(r[t], q[t]) for r, q in zip(ref, got)])),
                                   sqnr_db(np.stack([r[t] for r in ref]), np.stack([q[t] for q in got]))))
    if qm.passthrough:
        rep.notes.append("the model arrived quantized: only the outputs are compared")
    if with_sensitivity and not qm.passthrough:
        rep.sensitivity = sensitivity(qm, feeds, ref, rep.cosine, show_progress)
    return rep
