"""The compiler-facing public API: target registration, compile, reports.

Importing :mod:`dsa_tvm` calls :func:`setup`, which registers the ``dsa``
target tags, the pipeline hook and the ``dsa.launch`` runtime function, so
``tvm.compile(mod, target="dsa")`` offloads and the result runs.
"""

from __future__ import annotations

from pathlib import Path

from .hw.config import HardwareConfig


def setup() -> None:
    from .onnx_names import install as keep_onnx_node_names
    from .runtime import register as register_runtime
    from .target import register as register_target

    register_target()
    register_runtime()
    keep_onnx_node_names()


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
    """Per-layer report of the DSA launches since the previous call (one model run)."""
    from .pipeline import last_compile_report as last
    from .report import build_report
    from .runtime import take_launches

    return build_report(take_launches(), last())
