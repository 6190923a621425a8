"""How big a model is, as a user counts it: its ONNX nodes by op type and its bytes (weights included), and
whether a rewrite made it simpler (what lets the A/B keep a model that is not slower, ``verify``). Sizes are read
from protos without serializing them, and a graph's without copying its weights (``graph_size``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx

from xflow.ir import Graph
from xflow.onnx_io.constant_nodes import node_value
from xflow.onnx_io.save import Deferred, to_model_proto


@dataclass(frozen=True)
class ModelSize:
    """An ONNX model's nodes, its nodes by op type (domain-qualified outside the default domain), its bytes (the
    serialized proto plus the external data its initializers point at) and its weights' bytes (the initializers'
    data, wherever it lives, and the values of its Constant nodes)."""

    nodes: int
    ops: dict[str, int]
    bytes: int
    weight_bytes: int

    @property
    def computing_nodes(self) -> int:
        """Nodes other than ``Constant`` ones (data, which a rewritten model writes as initializers)."""
        return self.nodes - self.ops.get("Constant", 0)

    def is_simpler_than(self, other: ModelSize) -> bool:
        """Fewer computing nodes than ``other`` and no more weights, or fewer weight bytes and no more computing
        nodes. Weights, not the whole proto: re-encoding a graph changes its proto's bytes (value_info, doc strings)
        without removing any work, and an identical copy must not count as simpler; a Constant node's value counts
        as a weight, so writing it as an initializer is neither. "No more weights" allows ``FOLDED_CONSTANT_BYTES``:
        removing nodes may leave their small results as constants (a Pad's pads, a folded shape), and 364 nodes
        fewer for 3 KB of int64 vectors is simpler by any measure a user has."""
        if self.computing_nodes < other.computing_nodes:
            return self.weight_bytes <= other.weight_bytes + FOLDED_CONSTANT_BYTES
        return self.computing_nodes == other.computing_nodes and self.weight_bytes < other.weight_bytes


#: Weight bytes a model with fewer nodes may add and still be simpler (``ModelSize.is_simpler_than``): the small
#: constants a rewrite folds where it removes the nodes that computed them.
FOLDED_CONSTANT_BYTES = 64 << 10


def model_size(model: onnx.ModelProto, data_elsewhere: int = 0) -> ModelSize:
    """The size of ``model`` (``ByteSize``: nothing is serialized; external weights counted from their shape, and
    ``data_elsewhere`` bytes of weights written as headers only)."""
    external = sum(_tensor_bytes(t) for t in model.graph.initializer
                   if t.data_location == onnx.TensorProto.EXTERNAL)
    in_nodes = (node_value(n) for n in model.graph.node)
    weights = sum(_tensor_bytes(t) for t in model.graph.initializer) + \
        sum(_tensor_bytes(t) for t in in_nodes if t is not None)
    return ModelSize(len(model.graph.node), onnx_op_counts(model), model.ByteSize() + external + data_elsewhere,
                     weights)


def graph_size(graph: Graph) -> ModelSize:
    """The size of the model ``graph`` is written as, its large weights left out of the proto built to count it
    (headers, as the writer defers them) so that none is copied."""
    deferred: Deferred = {}
    model = to_model_proto(graph, deferred=deferred, constant_nodes=False)  # as a rewritten graph is written
    elsewhere = sum(source.nbytes if isinstance(source, np.ndarray) else _tensor_bytes(source)
                    for source in deferred.values())
    return model_size(model, elsewhere)


def onnx_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each ONNX op type the main graph has, sorted by name."""
    counts = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                     for n in model.graph.node)
    return dict(sorted(counts.items()))


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize
