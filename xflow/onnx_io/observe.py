"""Static shapes by execution, where ONNX shape inference leaves dims symbolic.

Exporters compute shapes at run time (``Shape -> Gather -> Concat -> Reshape``, masks built with
``Expand``/``Where``); ONNX's shape inference, even with data propagation, loses dims on some of those paths
(transformers' BERT and GPT-2 exports keep a symbolic batch dim after the embeddings), and every node with
a symbolic dim stays opaque. When every graph input has a static shape and no shape in the graph can depend
on input values, one run of the model in ONNX Runtime gives every value's exact shape: that run is made
with zeros for the inputs and for the large initializers (their values cannot change any shape, see
``_shapes_depend_only_on_shapes``), with every node output made a graph output.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx

from xflow.ir import TensorType
from xflow.onnx_io.shell import INLINE_ELEMENTS, elements, weights_as_inputs
from xflow.ort.sessions import Sessions

#: Inputs (by position) whose values set an op's output shape.
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Range": (0, 1, 2),
    "ConstantOfShape": (0,), "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1, 2, 3), "OneHot": (1,),
    "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "TopK": (1,), "ReduceSum": (1,), "ReduceMean": (1,),
    "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,),
    "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,), "CenterCropPad": (1,),
    "CenterCrop": (1,), "Col2Im": (1, 2), "DFT": (1,), "STFT": (2, 3),
}
#: Ops whose output shape depends on the values of their data inputs.
VALUE_SHAPED = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit", "RegexFullMatch"})
#: Ops whose outputs depend only on their inputs' shapes.
SHAPE_ONLY = frozenset({"Shape", "Size"})
def _shapes_depend_only_on_shapes(model: onnx.ModelProto, zeroed: set[str]) -> bool:
    """True when no output shape can depend on the values of the graph inputs or of ``zeroed`` initializers:
    such values never reach a shape-setting input (and the graph has no control flow)."""
    graph = model.graph
    tainted = {vi.name for vi in graph.input} | zeroed
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or any(a.type in (onnx.AttributeProto.GRAPH,
                                                              onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return False
        inputs = [name in tainted for name in node.input]
        if node.op_type in VALUE_SHAPED and any(inputs):
            return False
        if any(inputs[i] for i in SHAPE_INPUTS.get(node.op_type, ()) if i < len(inputs)):
            return False
        if node.op_type not in SHAPE_ONLY and any(inputs):
            tainted.update(node.output)
    return True


def observed_types(model: onnx.ModelProto, input_types: dict[str, TensorType]) -> dict[str, TensorType]:
    """The type of every node output, from one ONNX Runtime run; {} when the inputs are not all static,
    a shape could depend on values, or the run fails (the caller keeps what inference found)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    real_inputs = [vi.name for vi in graph.input if vi.name not in initializers]
    if any(name not in input_types or not input_types[name].is_static for name in real_inputs):
        return {}
    large = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
             or elements(t) > INLINE_ELEMENTS]
    zeroed = {t.name for t in large}
    if not _shapes_depend_only_on_shapes(model, zeroed):
        return {}
    shell = weights_as_inputs(model, zeroed)
    declared = {vi.name for vi in shell.graph.output}
    wanted = [name for node in graph.node for name in node.output if name and name not in declared]
    shell.graph.output.extend(onnx.ValueInfoProto(name=name) for name in wanted)
    feeds = {name: np.zeros(input_types[name].static_shape,
                            onnx.helper.tensor_dtype_to_np_dtype(input_types[name].dtype)) for name in real_inputs}
    feeds.update({t.name: np.zeros(list(t.dims), onnx.helper.tensor_dtype_to_np_dtype(t.data_type)) for t in large})
    try:
        session = Sessions.inspecting(shell.SerializeToString())  # a failure here just leaves the types unknown
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, feeds)
    except Exception:  # best effort: a model ORT cannot run keeps the shapes inference found
        return {}
    return dict(_types(zip(names, values, strict=True)))


def _types(pairs: Iterable[tuple[str, object]]) -> Iterable[tuple[str, TensorType]]:
    for name, value in pairs:
        if isinstance(value, np.ndarray) and value.dtype != object:
            yield name, TensorType(onnx.helper.np_dtype_to_tensor_dtype(value.dtype), tuple(value.shape))
