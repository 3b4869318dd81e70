"""Our quantizer next to onnxruntime's ``quantize_static`` on exactly the same calibration
and evaluation data: output cosine, top-1 agreement, calibration wall time.

Both int8 models are evaluated the same way (QDQ graph run op by op in float by
onnxruntime), against the same FP32 outputs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from ..ort_session import session
from ..quant.api import quantize_onnx
from ..quant.metrics import cosine, topk_agreement
from .quantize import qdq_quantize

Feed = dict[str, np.ndarray]


@dataclass
class Row:
    model: str
    quantizer: str
    method: str
    cosine_mean: float
    cosine_min: float
    top1: float | None
    calib_s: float


def _outputs(model: onnx.ModelProto, feeds: Sequence[Feed], optimize: bool) -> list[np.ndarray]:
    sess = session(model, optimize)
    return [sess.run(None, f)[0] for f in feeds]


def score(name: str, quantizer: str, method: str, qmodel: onnx.ModelProto, ref: list[np.ndarray],
          feeds: Sequence[Feed], calib_s: float, classifier: bool) -> Row:
    got = _outputs(qmodel, feeds, optimize=False)
    cos = [cosine(r, g) for r, g in zip(ref, got)]
    top1 = topk_agreement(np.concatenate(ref), np.concatenate(got), 1) if classifier else None
    return Row(name, quantizer, method, float(np.mean(cos)), float(np.min(cos)), top1, calib_s)


def ours_vs_onnxruntime(model: onnx.ModelProto, calibration: Sequence[Feed], evaluation: Sequence[Feed],
                        name: str, methods: Sequence[tuple[str, str]] = (("minmax", "MinMax"),),
                        classifier: bool = True, with_ort: bool = True, **options) -> list[Row]:
    """One row per (our method, ORT method) pair and quantizer. ``options`` go to
    :func:`quantize_onnx`."""
    ref = _outputs(model, evaluation, optimize=True)
    rows = []
    for ours, theirs in methods:
        t = time.perf_counter()
        qm = quantize_onnx(model, calibration, method=ours, show_progress=False, **options)
        rows.append(score(name, "dsa-tvm", ours, qm.model, ref, evaluation, time.perf_counter() - t,
                          classifier))
        if with_ort:
            t = time.perf_counter()
            ort = qdq_quantize(model, list(calibration), per_channel=True, calibrate_method=theirs)
            rows.append(score(name, "onnxruntime", theirs, ort, ref, evaluation, time.perf_counter() - t,
                              classifier))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    head = f"{'model':<20} {'quantizer':<12} {'method':<11} {'cos mean':>9} {'cos min':>9} " \
           f"{'top-1 agree':>11} {'calib s':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        top1 = "-" if r.top1 is None else f"{r.top1:.1%}"
        lines.append(f"{r.model:<20} {r.quantizer:<12} {r.method:<11} {r.cosine_mean:9.5f} "
                     f"{r.cosine_min:9.5f} {top1:>11} {r.calib_s:8.2f}")
    return "\n".join(lines)
