"""Bundled test/demo models: FP32 ONNX builders (opset 17, seeded weights), onnxruntime
QDQ int8 quantization, and a cached registry.

    from dsa_tvm.models import get_model, calibration_data
    qdq = get_model("resnet18", input_size=32, width=16)        # onnx.ModelProto, QDQ int8
    fp32 = get_model("resnet18", quantized=False, input_size=32, width=16)
"""

from .cnn import make_divisible, mobilenet_v2, resnet18, resnet50, small_cnn
from .quantize import (
    calibration_data,
    cosine,
    image_like,
    output_quant_steps,
    qdq_quantize,
    run_onnxruntime,
    token_embedding_like,
)
from .stats import activation_ranges, layer_macs, param_count, summary, total_macs
from .transformer import transformer_encoder
from .zoo import BUILDERS, cache_dir, get_model, get_model_path, list_models

__all__ = [
    "BUILDERS", "activation_ranges", "cache_dir", "calibration_data", "cosine", "get_model",
    "get_model_path", "image_like", "layer_macs", "list_models", "make_divisible", "mobilenet_v2",
    "output_quant_steps", "param_count", "qdq_quantize", "resnet18", "resnet50", "run_onnxruntime",
    "small_cnn", "summary", "token_embedding_like", "total_macs", "transformer_encoder",
]
