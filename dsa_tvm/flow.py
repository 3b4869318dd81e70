"""The whole flow on one model: import, compile for the DSA, run, compare, report.

Used by the command line (``dsa-tvm``, ``dsa-tvm run MODEL``) and the tutorials.
``MODEL`` is an ONNX file (FP32 or QDQ int8) or the name of a bundled model.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .hw.config import HardwareConfig, load_config


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

    def agreement(self, step: float | None) -> dict[str, float]:
        """How the DSA outputs compare with onnxruntime on the same QDQ graph."""
        from .quant.metrics import cosine

        got, ref = self.outputs[0].astype(np.float64), self.reference[0].astype(np.float64)
        out = {"max_abs_diff": float(np.abs(got - ref).max())}
        if step:
            steps = np.abs(got - ref) / step
            out["max_steps"] = float(steps.max())
            out["fraction_differing"] = float((steps > 0.5).mean())
        out["cosine"] = cosine(got, ref)
        return out


def load_model(model: str | Path, shapes: Mapping[str, Sequence[int]] | None = None,
               notes: list[str] | None = None):
    """(onnx.ModelProto, display name): an ONNX file through intake (:func:`dsa_tvm.load_onnx`,
    ``shapes`` for dynamic inputs; its notes appended to ``notes``), or a bundled model name
    (quantized, built by the project)."""
    from .frontend.intake import load_onnx

    p = Path(str(model))
    if p.suffix == ".onnx" or p.exists():
        taken = load_onnx(p, shapes)
        if notes is not None:
            notes.extend(taken.notes)
        return taken.model, p.name
    from .models.zoo import get_model, list_models

    if str(model) not in list_models():
        raise FileNotFoundError(f"no ONNX file '{model}' and no bundled model of that name "
                                f"(bundled: {', '.join(list_models())})")
    return get_model(str(model), quantized=True), str(model)


def run_model(model: str | Path, hw: "str | Path | HardwareConfig | None" = None,
              seed: int = 0, verbose: bool = True,
              shapes: Mapping[str, Sequence[int]] | None = None) -> FlowResult:
    """Compile ``model`` for ``hw``, run one input on the simulator, compare with ORT.

    ``shapes`` fixes dynamic input dimensions of an ONNX file (``{"x": (1, 3, 48, 320)}``)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from . import api
    from .models.quantize import calibration_data, run_onnxruntime
    from .target import target

    cfg = load_config(hw)
    notes: list[str] = []
    onnx_model, name = load_model(model, shapes, notes)
    say = print if verbose else (lambda *a, **k: None)
    for n in notes:
        say(f"intake: {n}")
    t = {}
    t0 = time.perf_counter()
    mod = from_onnx(onnx_model, keep_params_in_input=False)
    t["import_s"] = time.perf_counter() - t0
    say(f"compiling {name} for {cfg.summary()}")
    t0 = time.perf_counter()
    ex = tvm.compile(mod, target=target(cfg))
    t["compile_s"] = time.perf_counter() - t0
    crep = api.compile_report(ex)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    feed = calibration_data(onnx_model, n=1, seed=seed + 99)[0]
    (in_name, x), = feed.items()
    t0 = time.perf_counter()
    out = vm["main"](tvm.runtime.tensor(x))
    t["run_s"] = time.perf_counter() - t0
    outs = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    ref = run_onnxruntime(onnx_model, {in_name: x}, optimize=False)
    rrep = api.run_report(vm)
    return FlowResult(name, cfg, outs, ref, crep, rrep, t, notes, _output_step(onnx_model))


def output_step(model: str | Path, shapes: Mapping[str, Sequence[int]] | None = None) -> float | None:
    return _output_step(load_model(model, shapes)[0])


def _output_step(onnx_model) -> float | None:
    from .models.quantize import output_quant_steps

    steps = [v for v in output_quant_steps(onnx_model).values() if v]
    return steps[0] if steps else None
