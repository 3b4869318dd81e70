"""An image model on analog crossbars: its accuracy against the FP32 model at every point
of a study, beside the digital part.

The model is quantized once (int8 QDQ, per-channel weights) on the calibration inputs;
the digital baseline (``digital``, the default preset) shows what quantization alone
costs. Every point compiles the same QDQ model for its description with every region
offloaded (the study is about the part, not about the offload cost model), runs the
calibration inputs inside :func:`calibrating` when a mitigation needs them, then the
evaluation inputs; cosine and top-1 agreement are against the FP32 model in onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tir_schedules.options import options

from ..hw.config import HardwareConfig, load_config
from .grid import DIGITAL, Point, measure_points, plan, point_config
from .result import CimStudy, Measured

#: the bundled real model and its data
LITE0 = "efficientnet-lite0"


def load_image_model(model: str | Path, data: Any) -> tuple[Any, str, list, str]:
    """(FP32 ONNX model, its name, the data, the preprocessing): ``efficientnet-lite0``
    (real ImageNet weights, scikit-image photos in 5 crops each) or an FP32 ONNX file with
    ``data`` (an image folder or ``.npz``)."""
    import onnx

    if str(model) == LITE0:
        from ..models.pretrained import efficientnet_lite0_path, photo_batches

        return (onnx.load(efficientnet_lite0_path()), LITE0,
                data if data is not None else photo_batches(views=5), "efficientnet")
    path = Path(model)
    if not path.is_file():
        raise ValueError(f"model {str(model)!r} is not a file; give an FP32 ONNX model or "
                         f"'{LITE0}'")
    if data is None:
        raise ValueError(f"{path.name} came without data; pass --data DIR|FILE.npz (images "
                         f"or input arrays for calibration and evaluation)")
    return onnx.load(str(path)), path.stem, data, "imagenet"


def _top1(y: np.ndarray) -> int | None:
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[0] == 1 and y.shape[1] > 1:
        return int(np.argmax(y[0]))
    return None


class ImageBench:
    """An image model made ready once (quantized on the calibration inputs, the FP32
    model's outputs on the evaluation inputs), measured on any description.
    ``quantized``: a QDQ model of the same network to measure instead of quantizing it
    here (a fine-tuned one, ``qat.export``'s)."""

    def __init__(self, model: str | Path = LITE0, data: Any = None, calibration: int = 8,
                 limit: int = 16, say: Callable[[str], None] = lambda _m: None,
                 quantized: Any = None):
        from tvm.relax.frontend.onnx import from_onnx

        from ..models.quantize import run_onnxruntime
        from ..quant.api import input_dtypes, input_shapes, quantize_onnx
        from ..quant.data import as_feeds

        if calibration < 1 or limit < 1:
            raise ValueError("calibration or limit is below 1; give at least one input each")
        fp32, self.name, data, preprocess = load_image_model(model, data)
        feeds = as_feeds(data, input_shapes(fp32), preprocess, calibration + limit,
                         input_dtypes(fp32), what="study data", keep_order=True)
        if len(feeds) <= calibration:
            raise ValueError(f"the data holds {len(feeds)} inputs, none left after "
                             f"calibration; give more than --calibration ({calibration})")
        self.calib, self.evals = feeds[:calibration], feeds[calibration:]
        if quantized is None:
            say(f"quantizing {self.name} on {len(self.calib)} calibration inputs")
            qdq = quantize_onnx(fp32, self.calib, preprocess=preprocess,
                                show_progress=False).model
        else:   # e.g. qat.export's; through intake, as dsa_tvm.compile takes it (a Pad
            # before a Conv folds into it, shapes are fixed)
            from ..frontend.intake import load_onnx

            qdq = load_onnx(quantized).model
        self.refs = [run_onnxruntime(fp32, f, optimize=False)[0] for f in self.evals]
        self.calib_refs = [run_onnxruntime(fp32, f, optimize=False)[0] for f in self.calib]
        self.mod = from_onnx(qdq, keep_params_in_input=False)
        self._vms: dict[tuple, Any] = {}

    def measure(self, cfg: HardwareConfig, calibrate: bool = False,
                limit: int | None = None, on_calibration: bool = False) -> Measured:
        """Cosine and top-1 agreement against the FP32 model, cycles and energy of one
        inference, on ``cfg`` (every region offloaded); ``calibrate``: run the calibration
        inputs inside :func:`calibrating` first (the mitigations that need data);
        ``limit``: only the first evaluation inputs; ``on_calibration``: measured on the
        calibration inputs instead (to choose a setting without the evaluation data)."""
        from contextlib import nullcontext

        from ..runtime import cim_conditions

        feeds, refs = ((self.calib, self.calib_refs) if on_calibration
                       else (self.evals, self.refs))
        vm = self._vm(cfg)
        with cim_conditions(cfg) if cfg.is_cim else nullcontext():
            m = self._measure(vm, calibrate, feeds[:limit], refs[:limit])
        m.hw = cfg.name
        return m

    def _vm(self, cfg: HardwareConfig):
        """The model compiled for ``cfg`` (every region offloaded), once per compiled view:
        CIM points that differ only in device conditions share it (``cim_conditions``)."""
        import tvm
        from tvm import relax

        from ..runtime import compiled_view
        from ..target import target

        key = compiled_view(cfg)
        if key not in self._vms:
            with options(offload="all"):
                ex = tvm.compile(self.mod, target=target(cfg))
            self._vms[key] = relax.VirtualMachine(ex, tvm.cpu())
        return self._vms[key]

    def _measure(self, vm, calibrate: bool, evals: list, refs: list) -> Measured:
        import tvm

        from ..quant.metrics import cosine
        from ..runtime import take_launches
        from ..sim.cim_arrays import calibrating

        def run(feed: dict) -> np.ndarray:
            out = vm["main"](*[tvm.runtime.tensor(v) for v in feed.values()])
            return (out.numpy() if hasattr(out, "numpy") else out[0].numpy()).copy()

        if calibrate:
            with calibrating():
                for f in self.calib:
                    run(f)
        take_launches()
        got = [run(evals[0])]
        launches = take_launches()
        got += [run(f) for f in evals[1:]]
        self.last_launches = launches
        shared = [la.program.name for la in launches if la.result.cim is not None
                  and not la.result.cim.fits]
        note = f"time-shared: {', '.join(shared)} do not fit the crossbars" if shared else ""
        metrics = {"cosine": float(np.mean([cosine(g, r) for g, r in zip(got, refs)]))}
        tops = [(_top1(g), _top1(r)) for g, r in zip(got, refs)]
        if all(a is not None for a, _ in tops):
            metrics["top1_agreement"] = float(np.mean([a == b for a, b in tops]))
        return Measured(None, "", metrics, float(sum(la.result.cycles for la in launches)),
                        float(sum(la.result.counters.get("energy_uj", 0.0) for la in launches)),
                        note)


def study_cnn(model: str | Path = LITE0, data: Any = None, hw: "str | Path | HardwareConfig" =
              "cim-pcm", adc: list[int] = (4, 6, 8), noise: list[float] = (0.0, 0.02, 0.05),
              drift: list = ("1s", "1d", "1y"), noise_model: str = "gaussian",
              mitigate: list[str] = (), grid: str = "axes", calibration: int = 8,
              limit: int = 16, digital: str = "default",
              progress: Callable[[str], None] | None = print) -> CimStudy:
    """Accuracy, cycles and energy of ``model`` at every point (``grid.points``), and of the
    ``digital`` part."""
    grid_plan = plan(hw, adc, noise, drift, noise_model, mitigate, grid)
    base, changes = grid_plan.base, grid_plan.changes
    say = progress or (lambda _msg: None)
    bench = ImageBench(model, data, calibration, limit, say)
    if DIGITAL in changes:   # rank the layers where the grid is noisiest, keep the worst digital
        from .sensitivity import sensitivity

        worst = point_config(base, Point(max(adc), max(noise), min(grid_plan.drifts)),
                             noise_model, {})
        ranked = sensitivity(bench, worst, say=say)
        keep = [r.layer for r in ranked[:changes.pop(DIGITAL)]]
        say(f"kept digital: {', '.join(keep)}")
        changes["digital_layers"] = ",".join(keep)
    dig = load_config(digital)
    say(f"digital baseline on '{dig.name}'")
    study = CimStudy(bench.name, base.name, noise_model, list(mitigate), len(bench.evals),
                     "inference", base.mhz, bench.measure(dig))
    return measure_points(study, bench.measure, grid_plan, noise_model, say)

__all__ = ["study_cnn", "ImageBench", "Point", "LITE0"]
