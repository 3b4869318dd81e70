"""The whole flow on one model: import, compile for the DSA, run, compare, report.

Used by the command line (``dsa-tvm``, ``dsa-tvm run MODEL``) and the tutorials.
``MODEL`` is an ONNX file (FP32 or QDQ int8), the name of a bundled model, or a
PyTorch program (``.pt2`` from ``torch.export.save``: ``flow_pytorch.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .flow_result import FlowResult
from .hw.config import HardwareConfig, load_config


def load_model(model: str | Path, shapes: Mapping[str, Sequence[int]] | None = None,
               notes: list[str] | None = None):
    """(onnx.ModelProto, display name): an ONNX file through intake (:func:`dsa_tvm.load_onnx`,
    ``shapes`` for dynamic inputs; its notes appended to ``notes``), or a bundled model name
    (quantized, built by the project); ``models.zoo.model_or_file``."""
    from .models.zoo import model_or_file

    return model_or_file(model, shapes, notes)


def run_model(model: str | Path, hw: "str | Path | HardwareConfig | None" = None,
              seed: int = 0, verbose: bool = True,
              shapes: Mapping[str, Sequence[int]] | None = None,
              data: "str | Path | None" = None) -> FlowResult:
    """Compile ``model`` for ``hw``, run one input on the simulator, compare with ORT.

    ``shapes`` fixes dynamic input dimensions of an ONNX file (``{"x": (1, 3, 48, 320)}``).
    A ``.pt2`` PyTorch program goes through :func:`flow_pytorch.run_pytorch` (``data``:
    its calibration data, an image folder or ``.npz``)."""
    from .flow_pytorch import is_pytorch_program, run_pytorch

    if is_pytorch_program(model):
        return run_pytorch(model, hw, seed=seed, verbose=verbose, data=data)
    if data is not None:
        raise ValueError("calibration data is for a PyTorch program (.pt2); quantize an FP32 "
                         "ONNX model with dsa-tvm quantize MODEL --calib DATA first")
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
