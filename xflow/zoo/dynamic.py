"""Dynamic-batch twins of the zoo models, as exporters write them (``dynamic_axes`` on the batch)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

BATCH = "batch"


def dynamic_twin(model: onnx.ModelProto, batch: str = BATCH) -> onnx.ModelProto:
    """A copy of a zoo model whose inputs' and outputs' first dim is the ``dim_param`` ``batch``: the Reshape
    targets that name the batch size take it from their input (0) instead, and the intermediate types
    (static at batch 1) are dropped for the runtime to infer."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph
    for vi in (*graph.input, *graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims:
            size = dims[0].dim_value
            dims[0].Clear()
            dims[0].dim_param = batch
            if size != 1:
                raise ValueError(f"{vi.name}: zoo models are built at batch 1, not {size}")
    del graph.value_info[:]
    targets = {n.input[1] for n in graph.node if n.op_type == "Reshape" and len(n.input) > 1}
    readers = {name for n in graph.node if n.op_type != "Reshape" for name in n.input}
    for i, tensor in enumerate(graph.initializer):
        if tensor.name in targets and tensor.name not in readers:
            shape = numpy_helper.to_array(tensor).copy()
            if shape.size and shape[0] == 1:
                shape[0] = 0  # copy the input's batch dim
                graph.initializer[i].CopyFrom(numpy_helper.from_array(shape.astype(np.int64), tensor.name))
    return twin
