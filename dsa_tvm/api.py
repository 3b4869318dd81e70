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


def from_pytorch(model, example_inputs=None, calibration_data=None, *, verbose: bool = True,
                 **quantize_options) -> tvm.IRModule:
    """A PyTorch model as a Relax module for ``tvm.compile(mod, target="dsa")``.

    ``model`` is a ``torch.nn.Module`` (traced by ``torch.export`` on ``example_inputs``: a
    tensor or array, a tuple of them, or a dict by ``forward()`` parameter; exported in
    eval mode), a ``torch.export.ExportedProgram`` or a ``.pt2`` file of one. TVM's
    ``from_exported_program`` imports it with the weights bound as constants; its inputs
    are named as ``forward()``'s parameters. With ``calibration_data`` (feeds as for
    :func:`dsa_tvm.quantize`) the module comes back quantized to int8 QDQ by the Relax
    quantizer (``quantize_options`` as there), ready to offload; without it, FP32.
    Failures raise :class:`dsa_tvm.IntakeError` naming the cause and a fix.
    """
    from .frontend.pytorch import import_pytorch

    notes: list[str] = []
    mod, _ = import_pytorch(model, example_inputs, notes)
    if verbose:
        for n in notes:
            print(f"dsa_tvm.from_pytorch: {n}", file=sys.stderr)
    if calibration_data is None:
        return mod
    from .quant.api import quantize

    return quantize(mod, calibration_data, verbose=verbose, **quantize_options)


def compile_report(executable):
    """What the DSA compile of ``executable`` decided (regions, ops left on the CPU and
    why): ``executable`` is what ``tvm.compile(mod, target="dsa")`` returned, a
    ``relax.VirtualMachine`` of it, or the module ``load_module`` gave back in the
    compiling process. The newest compile's report is complete; those of the
    ``pipeline.COMPILE_RECORDS`` compiles before it keep everything but their regions'
    layers (``RegionDecision.region`` is None). Raises ``UnknownCompileError`` for an
    executable this process did not compile (a file compiled elsewhere) or has forgotten."""
    from .compile_ids import UnknownCompileError, compile_id_of
    from .pipeline import COMPILE_RECORDS, compile_report_of

    cid = compile_id_of(executable)
    report = compile_report_of(cid)
    if report is None:
        raise UnknownCompileError(
            f"no compile report for this executable (compile {cid}): it was compiled in "
            f"another process (compile reports stay with the process that compiled, e.g. "
            f"a module loaded from a file) or before the last {COMPILE_RECORDS} compiles, "
            f"which are all this process keeps; compile it again here to get its report")
    return report


def run_report(executable):
    """Per-layer report of the calling thread's last run of ``executable`` (a
    ``relax.VirtualMachine``, or its executable): that run's DSA launches and the CPU
    layers of its compile, whatever ran or was compiled since. A model without DSA
    regions reports its CPU layers. Raises ``UnknownCompileError`` when there is nothing
    to report: it has DSA regions but has not run in this thread (or not since
    ``runtime.RUNS_PER_THREAD`` other executables ran), or it is unknown and never ran."""
    from dataclasses import replace

    from .compile_ids import UnknownCompileError, compile_id_of
    from .pipeline import compile_record, compile_report_of
    from .report import build_report
    from .runtime import RUNS_PER_THREAD, launches_of

    cid = compile_id_of(executable)
    launches = launches_of(cid)
    record = compile_record(cid)
    if launches:
        rep = build_report(launches)
        if record is not None:
            rep.rows += record.rows
        return rep
    compiled = compile_report_of(cid)
    if compiled is not None and not any(d.target == "dsa" for d in compiled.regions):
        return replace(record, rows=list(record.rows))  # all on the CPU: nothing launches
    raise UnknownCompileError(
        f"no run of this executable (compile {cid}) in this thread"
        + ("" if compiled is not None else " and no compile report for it in this process")
        + f": run it in this thread first (each thread keeps the last run of its "
          f"{RUNS_PER_THREAD} most recently run executables)")


def last_compile_report():
    """What the last DSA compile decided (regions, ops left on the CPU and why)."""
    return _last_compile_report()


def last_run_report():
    """Per-layer report of the calling thread's last model run since the previous call:
    its DSA launches, and the CPU layers of the compile those programs came from (not of
    whatever was compiled last). With no launch (a model without DSA regions) it shows
    the last compile's CPU layers. ``run_report(vm)`` names the executable instead."""
    launches = take_launches()
    if not launches:
        return build_report([], _last_compile_report())
    rep = build_report(launches)
    record = compile_record(launches[0].compile_id)
    if record is not None:
        rep.rows += record.rows
    return rep
