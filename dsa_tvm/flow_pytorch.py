"""``dsa-tvm run model.pt2``: a PyTorch program through the whole flow.

Import (``torch.export`` program -> Relax, :mod:`dsa_tvm.frontend.pytorch`), calibrate
on ``--data`` or on seeded random inputs shaped like the program's, quantize with the
Relax quantizer, compile for the DSA, run one input on the simulator, and compare with
TVM's LLVM build of the same quantized module (in output quantization steps: the
DSA's pass criterion, as onnxruntime is for ONNX) and with the FP32 torch program.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .flow_result import FlowResult
from .hw.config import HardwareConfig, load_config

PT2_SUFFIX = ".pt2"
CALIBRATION_BATCHES = 8
#: ops between the last dequantize and the output that change no value
_MOVEMENT = ("relax.reshape", "relax.permute_dims", "relax.flatten", "relax.squeeze",
             "relax.expand_dims")


def is_pytorch_program(model: Any) -> bool:
    """Whether ``model`` names a ``torch.export`` program file (by its ``.pt2`` suffix)."""
    return isinstance(model, (str, Path)) and Path(str(model)).suffix.lower() == PT2_SUFFIX


def int_bound(mod, name: str) -> int | None:
    """The number of rows of the smallest constant table the integer input ``name`` indexes
    (``take`` through casts and reshapes): random ids must stay below it (TVM's ``take``
    in fast mode does not check bounds). None when it indexes none."""
    from tvm import relax
    from tvm.ir.expr import GenericConst

    func = mod["main"]
    derived = {p for p in func.params if p.name == name}
    bounds = []
    for blk in func.body.blocks:
        for b in blk.bindings:
            call = b.value
            if not isinstance(call, relax.Call) or not hasattr(call.op, "name"):
                continue
            if call.op.name in (*_MOVEMENT, "relax.astype") and call.args[0] in derived:
                derived.add(b.var)
            elif call.op.name == "relax.take" and call.args[1] in derived and isinstance(
                    call.args[0], GenericConst):
                bounds.append(int(call.args[0].value.shape[int(call.attrs.axis)]))
    return min(bounds, default=None)


def random_feeds(mod, program, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``n`` seeded inputs shaped like ``main``'s: photo-like images for 4-D inputs of 1 or 3
    channels, normal values at the example inputs' mean and spread for other float inputs,
    ids below the table they index (else in the example's range) for integer inputs."""
    from .models.quantize import image_like
    from .quant.api import relax_input_dtypes, relax_input_shapes

    shapes, dtypes = relax_input_shapes(mod), relax_input_dtypes(mod)
    examples = _examples(program)
    highs = {k: int_bound(mod, k) for k, dt in dtypes.items() if dt.kind in "iu"}
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        feed = {}
        for k, shape in shapes.items():
            ex = examples.get(k)
            if dtypes[k].kind in "iu":
                lo = int(ex.min()) if ex is not None and ex.size else 0
                hi = highs[k] or (int(ex.max()) + 1 if ex is not None and ex.size else 2)
                feed[k] = rng.integers(min(lo, hi - 1), hi, shape).astype(dtypes[k])
            elif dtypes[k].kind == "b":
                feed[k] = rng.integers(0, 2, shape).astype(bool)
            elif len(shape) == 4 and shape[1] in (1, 3):
                feed[k] = image_like(shape, rng).astype(dtypes[k])
            else:
                mean, std = (float(ex.mean()), float(ex.std())) if ex is not None and ex.size \
                    else (0.0, 1.0)
                feed[k] = rng.normal(mean, std or 1.0, shape).astype(dtypes[k])
        feeds.append(feed)
    return feeds


def _examples(program) -> dict[str, np.ndarray]:
    """The example inputs ``program`` was exported with, by user input name (a ``.pt2``
    keeps them); empty when it has none."""
    import torch

    try:
        args, kwargs = program.example_inputs or ((), {})
    except (AttributeError, TypeError, ValueError):
        return {}
    flat = [*args, *kwargs.values()]
    names = program.graph_signature.user_inputs
    return {n: t.detach().numpy() for n, t in zip(names, flat) if isinstance(t, torch.Tensor)}


def output_step(mod) -> float | None:
    """The quantization step of ``main``'s (first) output: the scale of the dequantize it
    comes from through data movement; None when FP32 ops follow the last dequantize."""
    from tvm import relax
    from tvm.ir.expr import GenericConst

    func = mod["main"]
    var2val = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
    e = func.body.body
    while True:
        while isinstance(e, relax.Var) and e in var2val:
            e = var2val[e]
        if isinstance(e, relax.Tuple):
            e = e.fields[0]
        elif isinstance(e, relax.Call) and getattr(e.op, "name", "") in _MOVEMENT:
            e = e.args[0]
        else:
            break
    if not (isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.dequantize"):
        return None
    scale = e.args[1]
    if not isinstance(scale, GenericConst) or scale.value.numpy().size != 1:
        return None
    return float(scale.value.numpy().reshape(()))


def _flat(out) -> list[np.ndarray]:
    """Every array of a VM or torch output (a tensor, or nested tuples of them)."""
    if hasattr(out, "numpy"):
        return [np.asarray(out.numpy())]
    if hasattr(out, "detach"):
        return [out.detach().numpy()]
    return [a for o in out for a in _flat(o)]


def _calibration(data, mod, program, seed: int, say) -> list[dict[str, np.ndarray]]:
    from .quant.api import relax_input_dtypes, relax_input_shapes
    from .quant.data import as_feeds

    if data is not None:
        return as_feeds(str(data) if isinstance(data, Path) else data, relax_input_shapes(mod),
                        dtypes=relax_input_dtypes(mod))
    say(f"calibrating on {CALIBRATION_BATCHES} seeded random inputs shaped like the program's "
        f"inputs (no --data); ranges from real data (--data DIR|file.npz) are better")
    return random_feeds(mod, program, CALIBRATION_BATCHES, seed)


def run_pytorch(model: str | Path, hw: "str | Path | HardwareConfig | None" = None,
                seed: int = 0, verbose: bool = True, data: Any = None) -> FlowResult:
    """Quantize, compile for ``hw`` and run a ``.pt2`` program on the simulator; its
    ``reference`` is TVM's LLVM build of the same quantized module."""
    import torch
    import tvm
    from tvm import relax

    from . import api
    from .frontend.pytorch import import_pytorch
    from .quant.api import quantize
    from .quant.metrics import cosine
    from .target import target

    cfg = load_config(hw)
    say = print if verbose else (lambda *a, **k: None)
    notes: list[str] = []
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    mod, program = import_pytorch(model, None, notes)
    t["import_s"] = time.perf_counter() - t0
    calib = _calibration(data, mod, program, seed, say)
    t0 = time.perf_counter()
    qmod = quantize(mod, calib, verbose=verbose, show_progress=False)
    t["quantize_s"] = time.perf_counter() - t0
    name = Path(str(model)).name
    say(f"compiling {name} for {cfg.summary()}")
    t0 = time.perf_counter()
    ex = tvm.compile(qmod, target=target(cfg))
    t["compile_s"] = time.perf_counter() - t0
    crep = api.compile_report(ex)
    feed = calib[0] if data is not None else random_feeds(mod, program, 1, seed + 99)[0]
    params = [p.name for p in qmod["main"].params]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    t0 = time.perf_counter()
    outs = _flat(vm["main"](*[tvm.runtime.tensor(feed[p]) for p in params]))
    t["run_s"] = time.perf_counter() - t0
    rrep = api.run_report(vm)
    llvm = relax.VirtualMachine(tvm.compile(qmod, target="llvm"), tvm.cpu())
    ref = _flat(llvm["main"](*[tvm.runtime.tensor(feed[p]) for p in params]))
    with torch.no_grad():
        fp32 = _flat(program.module()(*[torch.from_numpy(feed[p]) for p in params]))
    return FlowResult(name, cfg, outs, ref, crep, rrep, t, notes, output_step(qmod),
                      reference_name="TVM's LLVM build (same quantized module)",
                      fp32_cosine=cosine(outs[0], fp32[0]), fp32_name="the FP32 torch program")

