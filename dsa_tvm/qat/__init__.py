"""Quantization-aware training against the DSA's own integer arithmetic.

``prepare(module, example_inputs, ...)`` returns the module rewritten so its forward
pass computes what the compiled DSA computes (bit for bit on integer layers) with
straight-through gradients; ``export(prepared)`` writes the QDQ ONNX model the
compiler takes. torch is imported only when this package is.
"""

from .export import export
from .prepare import QatError, QatReport, calibrate, prepare, set_mode

__all__ = ["QatError", "QatReport", "calibrate", "export", "prepare", "set_mode"]
