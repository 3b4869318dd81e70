"""Post-training int8 quantization (QDQ) with calibration observers and accuracy reports."""

from .api import QuantizedModel, QuantOptions, prepare, quantize, quantize_onnx
from .observers import METHODS, make_observer

__all__ = ["METHODS", "QuantOptions", "QuantizedModel", "make_observer", "prepare", "quantize",
           "quantize_onnx"]
