"""Broadcast to a shape (ONNX ``Expand``): a constant shape input, or one computed at run time from the graph
inputs' dims where the shape has symbolic dims (the causal mask of a dynamic export: ``[seq, seq]``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ir.dims import NotBroadcastable, broadcast, equal, is_static
from xflow.ops._forms import decoded
from xflow.ops._runtime_dims import runtime_shape, writable
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, symbolic_shape


def expand_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Bidirectional broadcasting of the input's shape with ``shape`` (as ONNX Expand does); a symbolic dim of
    ``shape`` must be one the encoder can compute at run time (``_runtime_dims.writable``)."""
    if not all(writable(d) for d in attrs["shape"]):
        raise ShapeError(f"expand: shape {attrs['shape']} cannot be written (a dim not an integer polynomial)")
    try:
        return [broadcast(tuple(shapes[0]), tuple(attrs["shape"]))]
    except NotBroadcastable as exc:  # for some value of the input's symbols, or for all
        raise ShapeError(f"expand: {tuple(shapes[0])} does not broadcast with {attrs['shape']}") from exc


def _expand(xp, a, attrs):
    out = expand_shape([a[0].shape], attrs)[0]
    return [xp.broadcast_to(a[0], out).copy()]


def decode_expand(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Expand whose target shape is a constant, or computed at run time (a Shape -> Slice -> Concat chain of a
    dynamic export) where the output's dims are known over the symbols: then it is the expand to those dims
    (broadcasting the input to its own result shape gives the same values). The chain stays as it is."""
    if len(proto.input) != 2 or symbolic_shape(ctx, proto.input[0]) is None:
        return None
    shape = ctx.constant_value(proto.input[1])
    if shape is not None:
        return decoded(proto, EXPAND, proto.input[:1], {"shape": tuple(int(d) for d in shape.reshape(-1))}) \
            if shape.ndim == 1 else None
    out = symbolic_shape(ctx, proto.output[0])
    if out is None or all(is_static(d) for d in out):
        return None  # a computed shape with a static result: its value may still depend on the input's
    return decoded(proto, EXPAND, proto.input[:1], {"shape": tuple(out)})


def encode_expand(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Expand with the shape as a constant input, or, when it has symbolic dims, computed at run time:
    1 where it is the input's dim on the same (right-aligned) axis, the other dims from the graph inputs'."""
    name = node.name or ctx.fresh_name("Expand")
    shape = tuple(node.attrs["shape"])
    protos: list[onnx.NodeProto] = []
    if all(is_static(d) for d in shape):
        shape_name = ctx.add_constant(np.array([int(d) for d in shape], dtype=np.int64), f"{name}_in0")
    else:
        source = ctx.type_of(node.inputs[0])
        x = tuple(source.shape) if source is not None and source.shape is not None else ()
        pieces: list[Any] = []
        for k, d in enumerate(shape):
            axis = k - (len(shape) - len(x))  # the input's axis under this one, right-aligned
            copied = not is_static(d) and 0 <= axis < len(x) and equal(d, x[axis])
            pieces.append(1 if copied else d)
        protos, shape_name = runtime_shape(pieces, f"{name}_shape", ctx)
    return [*protos, onnx.helper.make_node("Expand", [node.inputs[0], shape_name], list(node.outputs), name=name)]


EXPAND = OpDef(
    name="expand", onnx_types=("Expand",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("shape", z3="code", symbolic=True),),
    shape=expand_shape, kernel=_expand, decode=decode_expand, encode=encode_expand,
    doc="broadcast to a shape (symbolic dims computed at run time)", linear=True, z3_symbol="expand", family="layout")

OPS = (EXPAND,)
