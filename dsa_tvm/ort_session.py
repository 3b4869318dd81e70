"""The one way this project opens an onnxruntime session (quiet, CPU provider).

``optimize=False`` disables every graph optimization: onnxruntime then runs a QDQ graph
op by op in float, the reference the DSA's outputs and the quantizer are checked
against; with optimizations on, it fuses QDQ groups into its own integer kernels.
"""

from __future__ import annotations

import onnx


def session(model: onnx.ModelProto, optimize: bool = True):
    """An onnxruntime CPU session of ``model`` (``optimize=False``: op by op)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
