"""Select by a boolean mask (ONNX ``Where``): condition ? x : y, with three-way broadcasting."""

from __future__ import annotations

import onnx

from xflow.ir import Node
from xflow.ops.base import DecodeContext, OpDef, make_node
from xflow.ops.elementwise import broadcast_shape, simple_encoder


def decode_where(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Where over a bool condition and two tensors of one element type."""
    if len(proto.input) != 3 or len(proto.output) != 1:
        return None
    cond, x, y = (ctx.type_of(name) for name in proto.input)
    if cond is None or x is None or y is None or cond.dtype != onnx.TensorProto.BOOL or x.dtype != y.dtype:
        return None
    return [make_node(proto, WHERE, proto.input, proto.output)]


def _where_int(xp, a, attrs):
    # the integer stand-in mixes both branches through the condition non-linearly (no bool over integers)
    c = a[0]
    return [c * a[1] + (c * c + 1) * a[2]]


WHERE = OpDef(
    name="where", onnx_types=("Where",), min_inputs=3, max_inputs=3, attrs=(), shape=broadcast_shape,
    kernel=lambda xp, a, attrs: [xp.where(a[0], a[1], a[2])], int_kernel=_where_int,
    decode=decode_where, encode=simple_encoder("Where"),
    doc="where(condition, x, y) with broadcasting", elementwise=True, z3_symbol="where", family="elementwise",
    same_dtype_inputs=False, out_dtype=lambda dtypes, attrs: dtypes[1], roles=("mask", "any", "any"))

OPS = (WHERE,)
