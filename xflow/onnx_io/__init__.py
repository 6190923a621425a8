"""ONNX <-> IR: lossless load and save."""

from xflow.onnx_io.load import graph_from_model, load, parse_input_shapes, read_model
from xflow.onnx_io.save import save, to_model_proto, would_overwrite

__all__ = ["graph_from_model", "load", "parse_input_shapes", "read_model", "save", "to_model_proto",
           "would_overwrite"]
