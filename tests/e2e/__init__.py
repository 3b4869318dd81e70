"""End-to-end tests: bundled networks and models, ONNX conformance, tutorials, the CLI, docs, the wheel."""
