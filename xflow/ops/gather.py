"""Gather along an axis (ONNX ``Gather``): embedding lookups (indices a graph input) and selections by
constant indices alike; the indices are the op's second input."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import decoded
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, onnx_attrs, symbolic_shape

INDEX_DTYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def gather_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """data[:axis] + indices' shape + data[axis + 1:]."""
    data, indices = (tuple(s) for s in shapes)
    axis = attrs["axis"]
    if not 0 <= axis < len(data):
        raise ShapeError(f"gather: axis {axis} out of range for rank {len(data)}")
    return [data[:axis] + indices + data[axis + 1:]]


def _gather(xp, a, attrs):
    return [xp.take(a[0], a[1].astype("int64"), axis=attrs["axis"])]


def decode_gather(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Gather of a static tensor by int32/int64 indices, its axis made non-negative."""
    shape, indices = symbolic_shape(ctx, proto.input[0]), ctx.type_of(proto.input[1])
    if shape is None or not shape or indices is None or indices.dtype not in INDEX_DTYPES:
        return None
    axis = int(onnx_attrs(proto).get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        return None
    return decoded(proto, GATHER, proto.input, {"axis": axis % len(shape)})


def encode_gather(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Gather."""
    return [onnx.helper.make_node("Gather", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("Gather"), axis=node.attrs["axis"])]


GATHER = OpDef(
    name="gather", onnx_types=("Gather",), min_inputs=2, max_inputs=2, attrs=(AttrSpec("axis", 0),),
    shape=gather_shape, kernel=_gather, decode=decode_gather, encode=encode_gather,
    doc="gather slices of data along axis by indices", z3_symbol="gather", family="layout",
    same_dtype_inputs=False, roles=("any", "indices"))

OPS = (GATHER,)
