"""Valid random feeds for the zoo models (and other ONNX models with static input shapes)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper


def _gather_ranges(graph: onnx.GraphProto) -> dict[str, int]:
    """Map value name -> exclusive upper bound for values used as Gather indices into initializers."""
    inits = {t.name: t for t in graph.initializer}
    bounds: dict[str, int] = {}
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in inits:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        dims = list(inits[node.input[0]].dims)
        size = int(dims[axis])
        bounds[node.input[1]] = min(size, bounds.get(node.input[1], size))
    return bounds


def _static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for all graph inputs: Gather ids in range, other ints = 1 (masks), floats in [-1, 1]."""
    rng = np.random.default_rng(seed)
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    bounds = _gather_ranges(graph)
    feeds: dict[str, np.ndarray] = {}
    for vi in graph.input:
        if vi.name in init_names:
            continue
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        shape = _static_shape(vi)
        if dtype == np.bool_:
            feeds[vi.name] = np.ones(shape, dtype=dtype)
        elif np.issubdtype(dtype, np.integer):
            if vi.name in bounds:
                feeds[vi.name] = rng.integers(0, bounds[vi.name], size=shape).astype(dtype)
            else:
                feeds[vi.name] = np.ones(shape, dtype=dtype)
        else:
            feeds[vi.name] = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    return feeds
