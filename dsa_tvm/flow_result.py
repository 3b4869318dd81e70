"""What one model's flow (``dsa-tvm run``) measured: outputs, references, reports.

Apart from ``flow.py`` so the ONNX flow and the PyTorch flow (``flow_pytorch.py``),
which ``flow.run_model`` dispatches to, both build it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .hw.config import HardwareConfig


@dataclass
class FlowResult:
    model: str
    hardware: HardwareConfig
    outputs: list[np.ndarray]
    reference: list[np.ndarray]
    compile_report: Any
    run_report: Any
    timings: dict[str, float] = field(default_factory=dict)
    intake: list[str] = field(default_factory=list)   # what model intake changed
    output_step: float | None = None                  # the output's quantization step (QDQ)
    #: what ``reference`` is: the same quantized graph run elsewhere
    reference_name: str = "onnxruntime (same QDQ graph)"
    fp32_cosine: float | None = None                  # cosine(DSA output, FP32 model output)
    fp32_name: str = ""                               # what that FP32 output came from

    def agreement(self, step: float | None) -> dict[str, float]:
        """How the DSA outputs compare with ``reference`` (the same quantized graph run on
        the CPU), in ``step`` units of the output's quantization when given."""
        from .quant.metrics import cosine

        got, ref = self.outputs[0].astype(np.float64), self.reference[0].astype(np.float64)
        out = {"max_abs_diff": float(np.abs(got - ref).max(initial=0.0))}
        if step:
            steps = np.abs(got - ref) / step
            out["max_steps"] = float(steps.max(initial=0.0))
            out["fraction_differing"] = float((steps > 0.5).mean()) if steps.size else 0.0
        out["cosine"] = cosine(got, ref)
        return out
