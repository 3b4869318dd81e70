"""The compiler-facing public API: target registration, compile, reports.

Importing :mod:`dsa_tvm` calls :func:`setup`, which registers the ``dsa``
target tags, the pipeline hook and the ``dsa.launch`` runtime function, so
``tvm.compile(mod, target="dsa")`` offloads and the result runs.
"""

from __future__ import annotations

from pathlib import Path

from .hw.config import HardwareConfig


def setup() -> None:
    from .runtime import register as register_runtime
    from .target import register as register_target

    register_target()
    register_runtime()


def compile(mod, hw: "str | Path | HardwareConfig | None" = None, **kwargs):  # noqa: A001
    """``tvm.compile(mod, target=dsa_tvm.target(hw))``: offload to the DSA, LLVM for the rest."""
    import tvm

    from .target import target

    return tvm.compile(mod, target=target(hw), **kwargs)


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
