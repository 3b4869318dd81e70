"""Model intake: ONNX models as users have them (any opset, exporter, QOperator int8)
made ready for import (:func:`dsa_tvm.frontend.intake.load_onnx`)."""
