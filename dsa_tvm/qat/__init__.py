"""Quantization-aware training against the DSA's own integer arithmetic.

``prepare(module, example_inputs, ...)`` returns the module rewritten so its forward
pass computes what the compiled DSA computes (bit for bit on integer layers) with
straight-through gradients; ``export(prepared)`` writes the QDQ ONNX model the
compiler takes. torch is imported only when this package is.
"""

from .adaround import RoundingReport, adaround
from .analog import AnalogReport, analog_noise, disable_analog, enable_analog
from .augment import mixup
from .errors import QatError
from .export import export
from .layers import set_mode
from .precision import choose_bits, sensitivity, set_bits
from .prepare import QatReport, calibrate, prepare
from .sparse_choice import choose_sparse_layers, sparse_sensitivity
from .sparsity import SparsityReport, prune
from .train import TrainResult, distill

__all__ = ["AnalogReport", "QatError", "QatReport", "SparsityReport", "TrainResult",
           "analog_noise", "calibrate", "choose_bits", "disable_analog",
           "distill", "enable_analog", "export", "prepare", "prune", "sensitivity", "set_bits",
           "set_mode"]
__all__ += ["RoundingReport", "adaround", "choose_sparse_layers", "mixup", "sparse_sensitivity"]
