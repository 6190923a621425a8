"""Removing and inserting unit axes (ONNX ``Squeeze``, ``Unsqueeze``): axes as an attribute before opset
13, as a constant input from 13 on; both are normalized to sorted non-negative axes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import attr_or_input, axes_attr, decoded
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, symbolic_shape


def squeeze_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Drop the listed axes, each of size 1."""
    (x,) = shapes
    axes = attrs["axes"]
    if list(axes) != sorted(set(axes)) or any(not 0 <= a < len(x) or x[a] != 1 for a in axes):
        raise ShapeError(f"squeeze: axes {axes} are not distinct unit axes of {tuple(x)}")
    return [tuple(d for i, d in enumerate(x) if i not in axes)]


def unsqueeze_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Insert unit axes at the listed positions of the output."""
    (x,) = shapes
    axes, rank = attrs["axes"], len(shapes[0]) + len(attrs["axes"])
    if not axes or list(axes) != sorted(set(axes)) or axes[0] < 0 or axes[-1] >= rank:
        raise ShapeError(f"unsqueeze: axes {axes} are not distinct axes of the rank-{rank} output")
    rest = iter(x)
    return [tuple(1 if i in axes else next(rest) for i in range(rank))]


def _squeeze(xp, a, attrs):
    return [xp.reshape(a[0], squeeze_shape([a[0].shape], attrs)[0])]


def _unsqueeze(xp, a, attrs):
    return [xp.reshape(a[0], unsqueeze_shape([a[0].shape], attrs)[0])]


def decode_squeeze(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Squeeze; without axes, every unit axis of the static input."""
    shape = symbolic_shape(ctx, proto.input[0])
    if shape is None:
        return None
    values = attr_or_input(proto, ctx, "axes", 1)
    if values is None:
        if len(proto.input) > 1 and proto.input[1]:
            return None
        values = np.array([i for i, d in enumerate(shape) if d == 1], dtype=np.int64)
    try:
        axes = axes_attr(values, len(shape))
    except ShapeError:
        return None
    return decoded(proto, SQUEEZE, proto.input[:1], {"axes": axes})


def decode_unsqueeze(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Unsqueeze with constant axes (negative ones count from the output's end)."""
    shape = symbolic_shape(ctx, proto.input[0])
    values = attr_or_input(proto, ctx, "axes", 1)
    if shape is None or values is None:
        return None
    try:
        axes = axes_attr(values, len(shape) + values.size)
    except ShapeError:
        return None
    return decoded(proto, UNSQUEEZE, proto.input[:1], {"axes": axes})


def _axes_encoder(onnx_type: str):
    def encode(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
        """Axes as an attribute before opset 13, as a constant input from 13 on."""
        name = node.name or ctx.fresh_name(onnx_type)
        axes = list(node.attrs["axes"])
        if ctx.opset < 13:
            return [onnx.helper.make_node(onnx_type, list(node.inputs), list(node.outputs), name=name, axes=axes)]
        axes_name = ctx.add_constant(np.array(axes, dtype=np.int64), f"{name}_axes")
        return [onnx.helper.make_node(onnx_type, [node.inputs[0], axes_name], list(node.outputs), name=name)]

    return encode


SQUEEZE = OpDef(
    name="squeeze", onnx_types=("Squeeze",), min_inputs=1, max_inputs=1, attrs=(AttrSpec("axes", z3="code"),),
    shape=squeeze_shape, kernel=_squeeze, decode=decode_squeeze, encode=_axes_encoder("Squeeze"),
    doc="remove unit axes", linear=True, z3_symbol="squeeze", family="layout")

UNSQUEEZE = OpDef(
    name="unsqueeze", onnx_types=("Unsqueeze",), min_inputs=1, max_inputs=1, attrs=(AttrSpec("axes", z3="code"),),
    shape=unsqueeze_shape, kernel=_unsqueeze, decode=decode_unsqueeze, encode=_axes_encoder("Unsqueeze"),
    doc="insert unit axes", linear=True, z3_symbol="unsqueeze", family="layout")

OPS = (SQUEEZE, UNSQUEEZE)
