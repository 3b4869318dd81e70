"""The compiler-facing public API: target registration, compile, reports.

Importing :mod:`dsa_tvm` calls :func:`setup`, which registers the ``dsa``
target tags, the pipeline hook and the ``dsa.launch`` runtime function, so
``tvm.compile(mod, target="dsa")`` offloads and the result runs.
"""

from __future__ import annotations

from pathlib import Path

from .hw.config import HardwareConfig


def setup() -> None:
    from .frontend.onnx_names import install as keep_onnx_node_names
    from .runtime import register as register_runtime
    from .target import register as register_target

    register_target()
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
    import tvm

    from .target import target

    if not isinstance(mod, tvm.IRModule):
        mod = _import_onnx(mod, shapes, calibration_data, quantize_options or {}, verbose)
    return tvm.compile(mod, target=target(hw), **kwargs)


def _import_onnx(model, shapes, calibration_data, quantize_options: dict, verbose: bool):
    import sys

    from tvm.relax.frontend.onnx import from_onnx

    from .frontend.intake import load_onnx
    from .frontend.onnx_graph import is_qdq
    from .quant.api import quantize_onnx

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
    from .pipeline import last_compile_report as last

    return last()


def last_run_report():
    """Per-layer report of the calling thread's last model run since the previous call:
    its DSA launches, and the CPU layers of the compile those programs came from (not of
    whatever was compiled last). With no launch (a model without DSA regions) it shows
    the last compile's CPU layers."""
    from .pipeline import compile_record, last_compile_report
    from .report import build_report
    from .runtime import take_launches

    launches = take_launches()
    if not launches:
        return build_report([], last_compile_report())
    rep = build_report(launches)
    record = compile_record(launches[0].compile_id)
    if record is not None:
        rep.rows += record.rows
    return rep
