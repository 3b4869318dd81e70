"""One zoo model through the user's pipeline, measured: export -> quantize -> compile for
the DSA -> run on the simulator -> compare.

Shared by ``benchmarks/bench_zoo.py`` and ``tests/e2e/test_zoo.py`` so the test checks
the pipeline the benchmark reports. Every stage is caught: a model that fails says
where and why (``ZooResult.failed``) instead of ending the run.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import shape_inference

from . import ZOO, export, feeds

CALIBRATION = 8
CALIBRATION_SEED = 1234
EVAL_SEED = 7
#: ops that carry no work of their own: not listed among what stays on the CPU
GLUE = {"quantize", "dequantize", "reshape", "permute_dims", "squeeze", "expand_dims",
        "flatten", "astype", "shape_of", "shape_to_tensor"}


def cpu_ops_left(crep) -> Counter:
    """What a compile left on the CPU, by kind: Relax ops outside regions (glue excluded)
    and the layers of regions the cost model gave to the CPU."""
    out: Counter = Counter()
    for op in crep.partition.cpu_ops:
        short = op.op.replace("relax.", "").replace("nn.", "")
        if short not in GLUE:
            out[short] += 1
    for d in crep.regions:
        if d.target == "cpu" and d.region is not None:
            out.update(f"{type(ly).__name__} (cost model)" for ly in d.region.layers)
    return out


@dataclass
class ZooResult:
    name: str
    family: str
    input_shape: tuple[int, ...] = ()
    stage: str = ""                 # the stage that failed ("" when all ran)
    error: str = ""
    onnx_macs: int = 0              # independent count over the FP32 ONNX graph
    report_macs: int = 0            # MACs the run report counts (DSA rows + CPU rows)
    dsa_macs: int = 0
    dsa_layers: int = 0
    dsa_ops: Counter = field(default_factory=Counter)   # layer kinds on the DSA
    cpu_ops: Counter = field(default_factory=Counter)   # Relax ops on the CPU (glue excluded)
    launches: int = 0
    #: launches whose region holds a transformer block's layers (a norm or an attention
    #: matmul): the issue's "everything between the embedding and the head in 1 launch"
    block_launches: int = 0
    cycles: int = 0
    bound: int = 0                  # sum of the DSA layers' roofline bounds
    dw_layers: int = 0              # depthwise convs on the DSA
    #: their worst attributed cycles / roofline bound per kernel ("3x3" -> ratio)
    dw_by_kernel: dict[str, float] = field(default_factory=dict)
    ref_steps: int | None = None    # max |DSA - integer reference| over launch outputs (int8 codes)
    ort_steps: float | None = None  # max |DSA - onnxruntime QDQ (opt off)| in output steps
    cos_fp32: float | None = None   # cosine(DSA output, onnxruntime FP32)
    cos_qdq: float | None = None    # cosine(onnxruntime QDQ, onnxruntime FP32): the CPU's int8
    seconds: float = 0.0
    kept_fp32: list[str] = field(default_factory=list)  # quantizer's FP32 reasons, one line each
    trace: str = ""                 # the failure's last frames
    stage_s: dict[str, float] = field(default_factory=dict)  # wall seconds per stage

    @property
    def failed(self) -> bool:
        return bool(self.stage)

    @property
    def dw_worst(self) -> float | None:
        """The worst depthwise layer's cycles / bound (None without depthwise layers)."""
        return max(self.dw_by_kernel.values(), default=None)

    @property
    def mac_share(self) -> float:
        total = max(self.onnx_macs, self.report_macs)
        return self.dsa_macs / total if total else 0.0


MAC_NODES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
#: layer kinds only a transformer block has: its norms and its attention matmuls
BLOCK_LAYERS = frozenset({"LayerNorm", "RMSNorm", "Softmax", "BatchMatmul"})


def onnx_macs(model: onnx.ModelProto) -> int:
    """MACs of every Conv, ConvTranspose, Gemm and MatMul of an FP32 ONNX graph: the
    denominator, counted independently of the compiler. Shapes a raw export hides behind
    Shape/Gather arithmetic are found after intake's constant folding."""
    total, unknown = _count_macs(model)
    if unknown:
        from ...frontend.intake import load_onnx

        total, unknown = _count_macs(load_onnx(model).model)
    if unknown:
        raise ValueError(f"MACs of {len(unknown)} node(s) unknown (no static shapes): "
                         f"{', '.join(unknown[:5])}")
    return total


def _count_macs(model: onnx.ModelProto) -> tuple[int, list[str]]:
    inferred = shape_inference.infer_shapes(model, data_prop=True)
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        if dims and all(d > 0 for d in dims):
            shapes[vi.name] = dims
    for init in model.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    total, unknown = 0, []
    for node in inferred.graph.node:
        if node.op_type not in MAC_NODES or len(node.input) < 2:
            continue
        out, a, w = (shapes.get(node.output[0]), shapes.get(node.input[0]),
                     shapes.get(node.input[1]))
        if not (out and a and w):
            unknown.append(node.name or node.output[0])
            continue
        if node.op_type == "Conv":            # w (O, I/g, k...)
            total += int(np.prod(out)) * int(np.prod(w[1:]))
        elif node.op_type == "ConvTranspose":  # w (I, O/g, k...)
            total += int(np.prod(a)) * int(np.prod(w[1:]))
        else:
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            total += int(np.prod(out)) * int(a[-2] if trans_a else a[-1])
    return total, unknown


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    from ...quant.metrics import cosine

    return float(cosine(np.asarray(a, np.float64), np.asarray(b, np.float64)))


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = next((m for m in msg if m.strip()), "")
    return f"{type(e).__name__}: {first[:300]}"


def measure(name: str, hw: str = "default", tiny: bool = False, cpu_gmacs: float | None = None,
            seed: int = 0, overrides: dict[str, Any] | None = None) -> ZooResult:
    """Run zoo model ``name`` through the pipeline on hardware preset ``hw``; never raises
    for a model's own failure (``ZooResult.stage`` and ``error`` say what broke)."""
    import tvm
    from tvm import relax

    import dsa_tvm
    from dsa_tvm.models.quantize import output_quant_steps, run_onnxruntime
    from dsa_tvm.quant.api import quantize_onnx
    from dsa_tvm.report import build_report
    from dsa_tvm.runtime import take_launches
    from tir_schedules.kinds import run_region

    from . import input_shape

    entry = ZOO[name]
    res = ZooResult(name, entry.family, input_shape(entry, tiny))
    t0 = time.perf_counter()
    clock = [t0]

    def enter(name: str) -> str:
        now = time.perf_counter()
        res.stage_s[stage] = now - clock[0]
        clock[0] = now
        return name

    stage = "export"
    try:
        fp32 = export(name, tiny, seed, overrides)
        stage = enter("count MACs")
        res.onnx_macs = onnx_macs(fp32)
        stage = enter("quantize")
        cfg = dsa_tvm.load_config(hw)
        if cpu_gmacs is not None:
            cfg = cfg.replace(cpu_gmacs=cpu_gmacs)
        # softmax and the norms int8 in and out where the part has [norm] units to run them
        qm = quantize_onnx(fp32, feeds(name, CALIBRATION, CALIBRATION_SEED, tiny),
                           show_progress=False, quantize_norms=cfg.norm_units >= 1)
        res.kept_fp32 = [ln.strip() for ln in qm.summary().splitlines() if "FP32:" in ln]
        stage = enter("compile")
        ex = tvm.compile(qm.to_relax(), target=dsa_tvm.target(cfg))
        crep = dsa_tvm.compile_report(ex)
        stage = enter("run")
        feed = feeds(name, 1, EVAL_SEED, tiny)[0]
        take_launches()
        vm = relax.VirtualMachine(ex, tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(feed["input"]))
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        launches = take_launches()
        stage = enter("report")
        rep = build_report(launches, crep)
        dsa_rows = [r for r in rep.rows if r.target == "DSA"]
        res.dsa_macs = sum(r.macs for r in dsa_rows)
        res.report_macs = sum(r.macs for r in rep.rows)
        res.dsa_layers = len(dsa_rows)
        res.dsa_ops = Counter(r.op for r in dsa_rows)
        res.cpu_ops.update(cpu_ops_left(crep))
        res.launches, res.cycles, res.bound = len(launches), rep.total_cycles, rep.bound_cycles
        block_regions = {d.name for d in crep.regions if d.target == "dsa" and d.region is not None
                         and any(type(ly).__name__ in BLOCK_LAYERS for ly in d.region.layers)}
        res.block_launches = sum(ln.program.name in block_regions for ln in launches)
        kernel = {ly.name: "x".join(map(str, ly.weight.shape[2:]))
                  for d in crep.regions if d.target == "dsa" and d.region is not None
                  for ly in d.region.layers if getattr(ly, "depthwise", False)}
        dw = [(kernel[r.name], r.cycles / r.bound) for r in dsa_rows
              if r.name in kernel and r.bound]
        res.dw_layers = len(dw)
        for k, x in dw:
            res.dw_by_kernel[k] = max(res.dw_by_kernel.get(k, 0.0), x)
        stage = enter("reference")
        regions = {d.name: d.region for d in crep.regions if d.target == "dsa"}
        steps = 0
        for launch in launches:
            want = run_region(regions[launch.program.name], launch.inputs)
            for k, v in launch.outputs.items():
                steps = max(steps, int(np.abs(v.astype(np.int32) - want[k].astype(np.int32)).max()))
        res.ref_steps = steps if launches else None
        stage = enter("compare")
        qdq = run_onnxruntime(qm.model, feed, optimize=False)[0]
        ref = run_onnxruntime(fp32, feed, optimize=False)[0]
        (step,) = output_quant_steps(qm.model).values()
        if step:
            res.ort_steps = float(np.abs(got.astype(np.float64) - qdq).max() / step)
        res.cos_fp32, res.cos_qdq = _cosine(got, ref), _cosine(qdq, ref)
        enter("")
        res.stage = ""
    except Exception as e:  # noqa: BLE001 - a failing model is a result, not a crash
        res.stage, res.error = stage, _short(e)
        res.trace = traceback.format_exc(limit=-3)
    res.seconds = time.perf_counter() - t0
    return res
