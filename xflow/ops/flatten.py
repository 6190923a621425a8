"""Flatten to a matrix at an axis (ONNX ``Flatten``): dims before ``axis`` make the rows, the rest the columns."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import decoded, prod
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, onnx_attrs, symbolic_shape


def flatten_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """(prod(x[:axis]), prod(x[axis:])), with 0 <= axis <= rank."""
    (x,) = shapes
    axis = attrs["axis"]
    if not 0 <= axis <= len(x):
        raise ShapeError(f"flatten: axis {axis} out of range for rank {len(x)}")
    return [(prod(x[:axis]), prod(x[axis:]))]


def decode_flatten(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Flatten with its axis made non-negative."""
    shape = symbolic_shape(ctx, proto.input[0])
    if shape is None:
        return None
    axis = int(onnx_attrs(proto).get("axis", 1))
    if not -len(shape) <= axis <= len(shape):
        return None
    return decoded(proto, FLATTEN, proto.input, {"axis": axis + len(shape) if axis < 0 else axis})


def encode_flatten(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Flatten."""
    return [onnx.helper.make_node("Flatten", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("Flatten"), axis=node.attrs["axis"])]


FLATTEN = OpDef(
    name="flatten", onnx_types=("Flatten",), min_inputs=1, max_inputs=1, attrs=(AttrSpec("axis", 1),),
    shape=flatten_shape, kernel=lambda xp, a, attrs: [xp.reshape(a[0], flatten_shape([a[0].shape], attrs)[0])],
    decode=decode_flatten, encode=encode_flatten, doc="flatten to 2-D at axis", linear=True, z3_symbol="flatten",
    family="layout")

OPS = (FLATTEN,)
