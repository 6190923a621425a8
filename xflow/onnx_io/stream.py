"""A model file written one weight at a time: the same ONNX model ``to_model_proto(graph).SerializeToString()``
gives, without the whole ModelProto and its bytes in memory at once (twice the weights, beside a run's sessions).

A protobuf message is its fields one after another, a length-delimited field being its key, its length and its
bytes, and a parser takes fields in any order: so the model is its header (every field but the graph), the graph
field's key and length, the graph's header (every field but its initializers), then each initializer as a field of
the graph, a large one as its header (name, type, dims) followed by its ``raw_data`` field streamed from the array.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

from xflow.ir import Graph
from xflow.onnx_io.save import Deferred, _write_deferred, to_model_proto

_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9  # field numbers in onnx.proto


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(field: int) -> bytes:
    return _varint(field << 3 | 2)  # wire type 2: length-delimited


def _raw_length(source: np.ndarray | onnx.TensorProto) -> int:
    """The bytes ``_write_deferred`` writes for ``source`` (its packed, little-endian form)."""
    if isinstance(source, onnx.TensorProto):
        if source.HasField("raw_data"):
            return len(source.raw_data)
        source = numpy_helper.to_array(source)
    return int(np.asarray(source).nbytes)


def write_model_file(graph: Graph, path: str) -> None:
    """Write ``graph``'s model to ``path`` as one self-contained file (its weights inline, as
    ``to_model_proto(graph)`` holds them), streaming each large weight from memory. Raises OSError when the
    file cannot be written (the partial file is removed)."""
    deferred: Deferred = {}
    model = to_model_proto(graph, deferred=deferred)
    initializers = list(model.graph.initializer)
    del model.graph.initializer[:]
    pieces: list[tuple[bytes, onnx.TensorProto | np.ndarray | None, int]] = []  # (header, streamed source, length)
    for tensor in initializers:
        source = deferred.get(tensor.name)
        header = tensor.SerializeToString()
        if source is None:
            pieces.append((header, None, 0))
        else:
            length = _raw_length(source)
            pieces.append((header + _key(_TENSOR_RAW_DATA) + _varint(length), source, length))
    graph_header = model.graph.SerializeToString()
    graph_length = len(graph_header) + sum(len(_key(_GRAPH_INITIALIZER)) + len(_varint(len(h) + n)) + len(h) + n
                                           for h, _, n in pieces)
    model.ClearField("graph")
    try:
        with open(path, "wb") as out:
            out.write(model.SerializeToString())
            out.write(_key(_MODEL_GRAPH) + _varint(graph_length) + graph_header)
            for header, source, length in pieces:
                out.write(_key(_GRAPH_INITIALIZER) + _varint(len(header) + length) + header)
                if source is not None and _write_deferred(out, source) != length:
                    raise OSError(f"{path}: a weight's size changed while it was written")
    except BaseException:
        if os.path.exists(path):
            os.remove(path)
        raise

