"""Broadcast to a constant shape (ONNX ``Expand``, whose shape input is a constant)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ir.dims import NotBroadcastable, broadcast
from xflow.ops._forms import decoded, with_constant_inputs
from xflow.ops.base import AttrSpec, DecodeContext, OpDef, ShapeError, symbolic_shape


def expand_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Bidirectional broadcasting of the input's shape with ``shape`` (as ONNX Expand does)."""
    try:
        return [broadcast(tuple(shapes[0]), tuple(attrs["shape"]))]
    except NotBroadcastable as exc:  # for some value of the input's symbols, or for all
        raise ShapeError(f"expand: {tuple(shapes[0])} does not broadcast with {attrs['shape']}") from exc


def _expand(xp, a, attrs):
    out = expand_shape([a[0].shape], attrs)[0]
    return [xp.broadcast_to(a[0], out).copy()]


def decode_expand(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Expand whose target shape is a constant."""
    shape = ctx.constant_value(proto.input[1]) if len(proto.input) == 2 else None
    if symbolic_shape(ctx, proto.input[0]) is None or shape is None or shape.ndim != 1:
        return None
    return decoded(proto, EXPAND, proto.input[:1], {"shape": tuple(int(d) for d in shape)})


EXPAND = OpDef(
    name="expand", onnx_types=("Expand",), min_inputs=1, max_inputs=1, attrs=(AttrSpec("shape", z3="code"),),
    shape=expand_shape, kernel=_expand, decode=decode_expand,
    encode=with_constant_inputs("Expand", lambda n: [(n.attrs["shape"], None)]),
    doc="broadcast to a constant shape", linear=True, z3_symbol="expand", family="layout")

OPS = (EXPAND,)
