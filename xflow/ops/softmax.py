"""Softmax along one axis (ONNX ``Softmax``; opset >= 13 semantics, and the older form where they agree)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import decoded, known_shape, stand_in
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, onnx_attrs, symbolic_shape

_EXP_STAND_IN = stand_in(61, 67)


def softmax_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """The input's shape; the axis must be one of its axes."""
    (x,) = shapes
    if not 0 <= attrs["axis"] < len(x):
        raise ShapeError(f"softmax: axis {attrs['axis']} out of range for rank {len(x)}")
    return [tuple(x)]


def _softmax(xp, a, attrs):
    x = a[0]
    e = xp.exp(x - xp.max(x, axis=attrs["axis"], keepdims=True))
    return [e / xp.sum(e, axis=attrs["axis"], keepdims=True)]


def _softmax_int(xp, a, attrs):
    # a non-linear stand-in that still mixes the whole axis (no division over integers)
    e = _EXP_STAND_IN(xp, a, attrs)[0]
    return [e * xp.sum(e, axis=attrs["axis"], keepdims=True)]


def decode_softmax(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Softmax with its axis made non-negative. Before opset 13 it normalized the input flattened to 2-D at
    ``axis`` (default 1): the same function only when that axis is the last one."""
    shape = symbolic_shape(ctx, proto.input[0])
    if shape is None or not shape:
        return None
    default = -1 if ctx.opset >= 13 else 1
    axis = int(onnx_attrs(proto).get("axis", default))
    if not -len(shape) <= axis < len(shape):
        return None
    axis %= len(shape)
    if ctx.opset < 13 and axis != len(shape) - 1:
        return None
    return decoded(proto, SOFTMAX, proto.input, {"axis": axis})


def encode_softmax(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Softmax; before opset 13 an axis other than the last is moved last and back by Transposes."""
    name = node.name or ctx.fresh_name("Softmax")
    axis = node.attrs["axis"]
    shape = known_shape(ctx, node.inputs[0])
    if ctx.opset >= 13 or (shape is not None and axis == len(shape) - 1):
        return [onnx.helper.make_node("Softmax", list(node.inputs), list(node.outputs), name=name, axis=axis)]
    if shape is None:
        raise ShapeError(f"softmax: the rank of {node.inputs[0]} is needed to write opset {ctx.opset}")
    perm = [*(i for i in range(len(shape)) if i != axis), axis]
    inverse = [perm.index(i) for i in range(len(shape))]
    moved, normalized = ctx.fresh_name(f"{name}_moved"), ctx.fresh_name(f"{name}_last")
    return [onnx.helper.make_node("Transpose", [node.inputs[0]], [moved], name=f"{name}_to_last", perm=perm),
            onnx.helper.make_node("Softmax", [moved], [normalized], name=name, axis=len(shape) - 1),
            onnx.helper.make_node("Transpose", [normalized], list(node.outputs), name=f"{name}_back", perm=inverse)]


def _sample_axis(rng, shapes, chosen, n_out):
    return int(rng.integers(len(shapes[0]))) if shapes and shapes[0] else None


SOFTMAX = OpDef(
    name="softmax", onnx_types=("Softmax",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("axis", sample=_sample_axis),), shape=softmax_shape, kernel=_softmax, int_kernel=_softmax_int,
    decode=decode_softmax, encode=encode_softmax, doc="softmax along axis", z3_symbol="softmax",
    family="activation")

OPS = (SOFTMAX,)
