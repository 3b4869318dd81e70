"""Tests of post-training int8 quantization (ONNX and Relax)."""
