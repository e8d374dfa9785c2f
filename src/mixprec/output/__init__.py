"""What the user gets: the compiled module, the error against fp32 (one implementation), the report, save/load
and ONNX export.
"""
