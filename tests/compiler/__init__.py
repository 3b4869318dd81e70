"""Tests of the compiler: ONNX intake, partition, lowering, codegen, the CPU reference, the runtime."""
