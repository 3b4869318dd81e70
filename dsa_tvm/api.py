"""The compiler-facing public API: target registration, compile, reports.

Importing :mod:`dsa_tvm` calls :func:`setup`, which registers the ``dsa``
target tags, the pipeline hook and the ``dsa.launch`` runtime function, so
``tvm.compile(mod, target="dsa")`` offloads and the result runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tvm
from tvm.relax.frontend.onnx import from_onnx

from .frontend.intake import load_onnx
from .frontend.onnx_graph import is_qdq
from .frontend.onnx_names import install as keep_onnx_node_names
from .hw.config import HardwareConfig
from .pipeline import compile_record, dsa_aware_default_pipeline, use_tuning
from .pipeline import last_compile_report as _last_compile_report
from .quant.api import quantize_onnx
from .report import build_report
from .runtime import register as register_runtime
from .runtime import take_launches
from .target import register as register_target
from .target import target
from .tuning.apply import current_chooser


def setup() -> None:
    """Register the ``dsa`` target with the pipeline hook, the tuner's schedule choice, the
    ``dsa.launch`` runtime function and the ONNX node names (idempotent)."""
    register_target(dsa_aware_default_pipeline)
    use_tuning(current_chooser)
    register_runtime()
    keep_onnx_node_names()


def compile(mod, hw: "str | Path | HardwareConfig | None" = None, *,  # noqa: A001
            shapes=None, calibration_data=None, quantize_options: dict | None = None,
            verbose: bool = True, **kwargs):
    """``tvm.compile(mod, target=dsa_tvm.target(hw))``: offload to the DSA, LLVM for the rest.

    ``mod`` may also be an ONNX model (path or ModelProto) as exported: it goes through
    :func:`dsa_tvm.load_onnx` (``shapes`` fixes dynamic inputs), is quantized to int8 when
    it is FP32 and ``calibration_data`` is given (``quantize_options`` as for
    :func:`dsa_tvm.quant.quantize_onnx`), and is imported into Relax. ``verbose`` prints
    what intake and the quantizer changed (stderr).
    """
    if not isinstance(mod, tvm.IRModule):
        mod = _import_onnx(mod, shapes, calibration_data, quantize_options or {}, verbose)
    return tvm.compile(mod, target=target(hw), **kwargs)


def _import_onnx(model, shapes, calibration_data, quantize_options: dict, verbose: bool):
    taken = load_onnx(model, shapes)
    if calibration_data is not None and not is_qdq(taken.model):
        qm = quantize_onnx(taken, calibration_data, **{"show_progress": False, **quantize_options})
        if verbose:
            print(qm.summary(), file=sys.stderr)
        return qm.to_relax()
    if verbose and taken.notes:
        print(taken, file=sys.stderr)
    return from_onnx(taken.model, keep_params_in_input=False)


def last_compile_report():
    """What the last DSA compile decided (regions, ops left on the CPU and why)."""
    return _last_compile_report()


def last_run_report():
    """Per-layer report of the calling thread's last model run since the previous call:
    its DSA launches, and the CPU layers of the compile those programs came from (not of
    whatever was compiled last). With no launch (a model without DSA regions) it shows
    the last compile's CPU layers."""
    launches = take_launches()
    if not launches:
        return build_report([], _last_compile_report())
    rep = build_report(launches)
    record = compile_record(launches[0].compile_id)
    if record is not None:
        rep.rows += record.rows
    return rep
