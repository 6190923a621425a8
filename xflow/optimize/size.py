"""How big a model is, as a user counts it: its ONNX nodes by op type and its bytes (weights included), and
whether a rewrite made it simpler (what lets the A/B keep a model that is not slower, ``verify``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx


@dataclass(frozen=True)
class ModelSize:
    """An ONNX model's nodes, its nodes by op type (domain-qualified outside the default domain) and its bytes:
    the serialized proto plus the external data its initializers point at."""

    nodes: int
    ops: dict[str, int]
    bytes: int

    def is_simpler_than(self, other: ModelSize) -> bool:
        """Fewer nodes or fewer bytes than ``other``, and no more of the other."""
        return (self.nodes <= other.nodes and self.bytes <= other.bytes
                and (self.nodes < other.nodes or self.bytes < other.bytes))


def model_size(model: onnx.ModelProto) -> ModelSize:
    """The size of ``model`` (``ByteSize``: nothing is serialized; external weights counted from their shape)."""
    external = sum(_tensor_bytes(t) for t in model.graph.initializer
                   if t.data_location == onnx.TensorProto.EXTERNAL)
    return ModelSize(len(model.graph.node), onnx_op_counts(model), model.ByteSize() + external)


def onnx_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each ONNX op type the main graph has, sorted by name."""
    counts = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                     for n in model.graph.node)
    return dict(sorted(counts.items()))


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize
