"""A float64 copy of a float model, for a reference that carries (almost) none of float32's rounding.

Every float16/bfloat16/float32 tensor type, initializer, tensor attribute and Cast target becomes
float64. ONNX Runtime has no float64 kernel for some ops (Conv, AveragePool, Erf, ...): those nodes
run in float32 between two Casts, so the copy's error is float32's for them alone."""

from __future__ import annotations

import re
from collections.abc import Collection

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from xflow.onnx_io.shell import elements, weights_as_inputs

NARROW_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
#: ORT's message when a node has no kernel for its types names the op: "... for Conv(11) node ..."
_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node")
#: Ops a float64 copy may run in float32 before giving up (a model needs few; a loop would need many).
MAX_NARROWED_OPS = 16
#: Ops ONNX Runtime's CPU provider has no float64 kernel for (1.32), narrowed before the first session
#: build; others are found by the build failing and narrowed then.
NO_FLOAT64_KERNEL = frozenset({"Conv", "ConvTranspose", "AveragePool", "GlobalAveragePool", "Erf", "Gelu",
                               "LpPool", "GlobalLpPool"})
#: Initializers up to this many elements keep their data for type inference (shapes, axes, scalars).
SMALL_INITIALIZER = 64
#: Attributes naming a dtype (Cast's ``to``, RandomNormal's ``dtype``, ...).
DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")


def _widen_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type == TensorProto.FLOAT and tensor.raw_data:  # the common case, without numpy_helper's copies
        tensor.raw_data = np.frombuffer(tensor.raw_data, "<f4").astype("<f8").tobytes()
        tensor.data_type = TensorProto.DOUBLE
    elif tensor.data_type in NARROW_FLOATS:
        wide = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)
        tensor.CopyFrom(wide)


def _widen_type(type_proto: onnx.TypeProto) -> None:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type" and type_proto.tensor_type.elem_type in NARROW_FLOATS:
        type_proto.tensor_type.elem_type = TensorProto.DOUBLE
    elif kind in ("sequence_type", "optional_type"):
        _widen_type(getattr(type_proto, kind).elem_type)


def _widen_graph(graph: onnx.GraphProto) -> None:
    for value in [*graph.input, *graph.output, *graph.value_info]:
        _widen_type(value.type)
    for tensor in graph.initializer:
        _widen_tensor(tensor)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                _widen_tensor(attr.t)
            elif attr.type == onnx.AttributeProto.INT and attr.name in DTYPE_ATTRIBUTES and attr.i in NARROW_FLOATS:
                attr.i = TensorProto.DOUBLE
            elif attr.type == onnx.AttributeProto.GRAPH:
                _widen_graph(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _widen_graph(sub)


def widened(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` (weights loaded) with every narrow float type made float64."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    _widen_graph(wide.graph)
    return wide


def widened_external(model: onnx.ModelProto, directory: str, stem: str, min_bytes: int = 1024) -> onnx.ModelProto:
    """``widened(model)`` with its initializers of at least ``min_bytes`` written, widened, to ``<stem>.data`` in
    ``directory`` (page-aligned) and the returned model pointing at them: the float64 weights are never all in
    memory (only one tensor at a time), and a model file saved beside the data file is read by ORT from there.
    ``model`` is left as it is. Raises OSError when the file cannot be written."""
    import os

    from xflow.onnx_io.save import _align, point_at_external
    from xflow.onnx_io.shell import copy_fields

    shell = onnx.ModelProto()
    copy_fields(model, shell, skip=("graph",))
    copy_fields(model.graph, shell.graph, skip=("initializer",))
    data_name = f"{stem}.data"
    with open(os.path.join(directory, data_name), "wb") as out:
        for tensor in model.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL or elements(tensor) * 8 < min_bytes:
                shell.graph.initializer.append(tensor)  # widened below with the rest of the graph
                continue
            if tensor.data_type == TensorProto.FLOAT and tensor.raw_data:
                data = np.frombuffer(tensor.raw_data, "<f4").astype("<f8").tobytes()
            elif tensor.data_type in NARROW_FLOATS:
                data = numpy_helper.to_array(tensor).astype("<f8").tobytes()
            else:
                data = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
            start = _align(out, 4096)
            out.write(data)
            placed = shell.graph.initializer.add()
            copy_fields(tensor, placed, skip=("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                                              "uint64_data", "string_data"))
            if tensor.data_type in NARROW_FLOATS:
                placed.data_type = TensorProto.DOUBLE
            point_at_external(placed, data_name, start, len(data))
            del data
    _widen_graph(shell.graph)
    return shell


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every value, from shape inference on a copy without the weights' data (a model's
    weights serialized for inference would cost as much as the check)."""
    large = {t.name for t in model.graph.initializer if elements(t) > SMALL_INITIALIZER}
    inferred = onnx.shape_inference.infer_shapes(weights_as_inputs(model, large))
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return types


def narrow_ops(model: onnx.ModelProto, op_types: Collection[str], in_place: bool = False) -> onnx.ModelProto | None:
    """``model`` with every top-level node of ``op_types`` run in float32: its float64 inputs cast down and
    its outputs cast back up (``in_place``: ``model`` itself changed, not a copy of its weights made). None when a
    value's type is unknown (nothing sound to cast; ``model`` unchanged)."""
    types = _value_types(model)
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(model.graph.node):
        if node.op_type not in op_types or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        narrowed = onnx.NodeProto()
        narrowed.CopyFrom(node)
        for k, name in enumerate(node.input):
            if name and types.get(name) == TensorProto.DOUBLE:
                narrowed.input[k] = f"{name}__f32_for_{index}"
                nodes.append(onnx.helper.make_node("Cast", [name], [narrowed.input[k]], to=TensorProto.FLOAT))
        casts_back = []
        for k, name in enumerate(node.output):
            if not name:
                continue
            if name not in types:
                return None
            if types[name] == TensorProto.DOUBLE:
                narrowed.output[k] = f"{name}__f32"
                casts_back.append(onnx.helper.make_node("Cast", [narrowed.output[k]], [name], to=TensorProto.DOUBLE))
        nodes += [narrowed, *casts_back]
    if in_place:  # the nodes kept are copied first: they belong to the field about to be cleared
        nodes = [_copied(node) for node in nodes]
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _copied(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def float64_session(model: onnx.ModelProto, make_session, widen: bool = True) -> tuple[object | None, str]:  # noqa: ANN001
    """An ORT session of ``model``'s float64 copy and a line saying what it is, or (None, why not).
    ``make_session`` builds a session from a ModelProto (the caller's provider and threads). ``widen`` False:
    ``model`` is the float64 copy already (``widened``), the caller's to give up: its nodes may be changed in place."""
    try:
        wide = widened(model) if widen else model
    except Exception as exc:  # noqa: BLE001 - a tensor numpy cannot read: no float64 reference
        return None, f"no float64 copy ({type(exc).__name__})"
    narrowed = sorted({n.op_type for n in wide.graph.node if n.op_type in NO_FLOAT64_KERNEL})
    if narrowed:  # known ahead: a failed session build costs a whole load of the weights
        wide = _narrowed_or_none(wide, narrowed)
        if wide is None:
            return None, f"ONNX Runtime has no float64 {', '.join(narrowed)} and their types are unknown"
    while True:
        try:
            session = make_session(wide)
        except Exception as exc:  # noqa: BLE001 - ORT's own error types
            missing = _NO_KERNEL.search(str(exc))
            if missing is None or missing.group(1) in narrowed or len(narrowed) >= MAX_NARROWED_OPS:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                return None, f"ONNX Runtime cannot run a float64 copy ({first[:200]})"
            narrowed.append(missing.group(1))
            wide = _narrowed_or_none(wide, [missing.group(1)])
            if wide is None:
                return None, f"ONNX Runtime has no float64 {missing.group(1)} and its types are unknown"
            continue
        what = "the original in float64"
        if narrowed:
            what += f" ({', '.join(sorted(narrowed))} in float32: ONNX Runtime has no float64 kernel)"
        return session, what


def _narrowed_or_none(model: onnx.ModelProto, op_types: Collection[str]) -> onnx.ModelProto | None:
    try:
        return narrow_ops(model, op_types, in_place=True)  # ``model`` is float64_session's own copy
    except Exception:  # noqa: BLE001 - shape inference refused the copy
        return None
