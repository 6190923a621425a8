"""Values known at load: those of ``Constant`` and ``ConstantOfShape`` nodes, and of the shape computations
that only read known dims (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``). The decoders read them (a
Reshape's target, a Pad's pads, a Slice's starts), so the ops they parameterize enter the algebra; the nodes
themselves stay in the graph, so loading and saving a model stays lossless.

Only exact values fold: constant nodes, integer and bool computations, and shapes of values whose dims
the original model fixes (never dims chosen for measuring, so the written model keeps its interface).
The values are computed by ONNX's reference evaluator, node by node."""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping, Sequence

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from xflow.ir import FLOAT_DTYPES, TensorType
from xflow.ops import DEFAULT_DOMAINS

#: ops folded when every input is known and every output is an integer or bool tensor (shape arithmetic)
SHAPE_ARITHMETIC = frozenset({
    "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Reshape", "Add", "Sub", "Mul", "Div", "Equal",
    "Where", "Range", "Expand", "Identity", "Neg", "ReduceProd", "Not", "Less", "Greater", "Min", "Max",
    "Transpose", "Tile", "Abs", "Mod", "Floor", "Ceil", "Flatten", "ConstantOfShape", "And", "Or",
})
#: the most elements a folded computation may produce (shape tensors and small masks, not activations)
MAX_FOLDED_ELEMENTS = 1 << 16


def _fixed_dims(model: onnx.ModelProto) -> bool:
    """True when every graph input's dims are fixed numbers in the model itself."""
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            return False
        if any(not d.HasField("dim_value") for d in tt.shape.dim):
            return False
    return True


def known_values(model: onnx.ModelProto, types: Mapping[str, TensorType], known: Mapping[str, np.ndarray],
                 fold_shapes: bool, readers: Collection[str], captured: Collection[str] = ()
                 ) -> dict[str, np.ndarray]:
    """The values of the node outputs that are constant at load, by name (the model is not modified).

    ``known``: small initializer values; ``types``: inferred types; ``fold_shapes``: whether ``Shape`` and
    ``Size`` of statically typed values may fold (False when dims were set for measuring only);
    ``readers``: the ONNX types that may read a folded value as an initializer (the op table's, and the
    shape arithmetic folded here): a value that another op or a subgraph (``captured``) reads keeps its node,
    since ONNX Runtime checks some inputs (Range's, a Loop's condition) more strictly as initializers."""
    # with control flow, values that fold let ONNX Runtime pick If branches at load and then check the branch
    # not taken against them (the expanded AffineGrid fails so): only constant nodes fold there
    control_flow = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for n in model.graph.node for a in n.attribute)
    # in a model with dynamic inputs a Shape does not fold, but the dims of it that are static do: a Gather or
    # Slice of a Shape reading only those (Swin's window sizes beside a dynamic batch)
    fixed = _fixed_dims(model)
    static_dims = fold_shapes and not control_flow and not fixed
    fold_shapes = fold_shapes and fixed and not control_flow
    opsets = list(model.opset_import)
    graph_outputs = {vi.name for vi in model.graph.output}
    readers = set(readers) | SHAPE_ARITHMETIC | {"Shape", "Size"}
    consumers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type if node.domain in DEFAULT_DOMAINS else "")
    values: dict[str, np.ndarray] = {}
    shapes_of: dict[str, onnx.NodeProto] = {}  # output of a Shape node that did not fold -> the node
    for node in model.graph.node:
        if node.domain not in DEFAULT_DOMAINS or any(o in graph_outputs for o in node.output):
            continue
        if static_dims and node.op_type == "Shape" and len(node.input) == 1:
            shapes_of[node.output[0]] = node
        if any(o in captured or not consumers.get(o, set()) <= readers for o in node.output):
            continue
        if control_flow and node.op_type not in ("Constant", "ConstantOfShape"):
            continue
        folded = _fold_node(node, types, known, values, fold_shapes, opsets)
        if folded is None and node.op_type in ("Gather", "Slice") and node.input[0] in shapes_of:
            folded = _fold_static_dims(node, shapes_of[node.input[0]], types, known, values, opsets)
        if folded is not None and all(_agrees(value, types.get(name)) for name, value in folded.items()):
            values.update(folded)
    return values


def _static_dims(shape_node: onnx.NodeProto, types: Mapping[str, TensorType]) -> tuple[int | None, ...] | None:
    """The dims a Shape node outputs (its ``start``/``end`` applied), each an int where it is static, or None
    where the rank of its input is unknown."""
    t = types.get(shape_node.input[0])
    if t is None or t.shape is None:
        return None
    dims = tuple(d if isinstance(d, int) and d >= 0 else None for d in t.shape)
    attrs = {a.name: a.i for a in shape_node.attribute}
    return dims[slice(attrs.get("start", 0), attrs.get("end", len(dims)))]


def _fold_static_dims(node: onnx.NodeProto, shape_node: onnx.NodeProto, types: Mapping[str, TensorType],
                      known: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray],
                      opsets: list[onnx.OperatorSetIdProto]) -> dict[str, np.ndarray] | None:
    """The value of a Gather or Slice of a Shape's output that reads only static dims: the node is run on a
    stand-in vector whose dynamic dims are -1, and folds only when no -1 is read. The stand-in's positions are
    the Shape's, so indices (negative ones too) select exactly what they select at run time."""
    dims = _static_dims(shape_node, types)
    if dims is None:
        return None
    feeds = _known_feeds(node.input[1:], known, values)
    if feeds is None:
        return None
    feeds[node.input[0]] = np.array([-1 if d is None else d for d in dims], dtype=np.int64)
    folded = _evaluate(node, feeds, opsets)
    if folded is None or any(np.any(v < 0) for v in folded.values()):
        return None
    return folded


def _agrees(value: np.ndarray, declared: TensorType | None) -> bool:
    """True when a folded value has the element type and dims shape inference gave its name (where it gave
    them): the evaluator may return a (1,) for a scalar, which a Range or a Loop condition refuses."""
    if declared is None:
        return True
    if onnx.helper.np_dtype_to_tensor_dtype(value.dtype) != declared.dtype:
        return False
    if declared.shape is None:
        return True
    return len(declared.shape) == value.ndim and all(d is None or d == v for d, v in zip(declared.shape, value.shape,
                                                                                        strict=True))


def _known_feeds(names: Sequence[str], known: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray]
                 ) -> dict[str, np.ndarray] | None:
    """The values of a node's (present) inputs, folded or known; None when one is not."""
    feeds: dict[str, np.ndarray] = {}
    for name in names:
        if not name:
            continue
        value = values.get(name, known.get(name))
        if value is None:
            return None
        feeds[name] = value
    return feeds


def _fold_node(node: onnx.NodeProto, types: Mapping[str, TensorType], known: Mapping[str, np.ndarray],
               values: dict[str, np.ndarray], fold_shapes: bool,
               opsets: list[onnx.OperatorSetIdProto]) -> dict[str, np.ndarray] | None:
    if node.op_type == "Constant" and len(node.output) == 1:
        return _evaluate(node, {}, opsets)
    if node.op_type in ("Shape", "Size") and fold_shapes and len(node.input) == 1:
        t = types.get(node.input[0])
        if t is None or not t.is_static:
            return None
        # the shape is all that is read: a zero tensor of that shape stands in for the value
        return _evaluate(node, {node.input[0]: np.zeros(t.static_shape, dtype=np.uint8)}, opsets, small=False)
    if node.op_type not in SHAPE_ARITHMETIC or any(sub.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                   for sub in node.attribute):
        return None
    feeds = _known_feeds(node.input, known, values)
    if feeds is None:
        return None
    if node.op_type != "ConstantOfShape":
        out_types = [types.get(o) for o in node.output if o]
        if any(t is None or t.dtype in FLOAT_DTYPES for t in out_types):
            return None  # float arithmetic is left to ONNX Runtime, whose rounding the model was exported for
    return _evaluate(node, feeds, opsets)


def _evaluate(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opsets: list[onnx.OperatorSetIdProto],
              small: bool = True) -> dict[str, np.ndarray] | None:
    """Run one node, at the model's opsets, in the reference evaluator; None when it cannot (or the result
    is not small)."""
    inputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for name, v in feeds.items()]
    outputs_info = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
    model = onnx.helper.make_model(onnx.helper.make_graph([node], "fold", inputs, outputs_info),
                                   opset_imports=opsets)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outputs = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # noqa: BLE001 - the evaluator raises many types; an unfoldable node just stays a node
        return None
    result = {}
    for name, value in zip([o for o in node.output if o], outputs, strict=True):
        value = np.asarray(value)
        if small and node.op_type != "Constant" and value.size > MAX_FOLDED_ELEMENTS:
            return None
        result[name] = value
    return result
