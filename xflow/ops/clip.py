"""Clamping to constant bounds (ONNX ``Clip``: ReLU6 and friends); bounds as attributes before opset 11,
as constant inputs from 11 on. A missing bound is infinite."""

from __future__ import annotations

import math

import numpy as np
import onnx

from xflow.ir import Node
from xflow.ops._forms import attr_or_input, decoded, typed_constant
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, one_of
from xflow.ops.elementwise import same_shape
from xflow.ops.norm import canonical_float


def _clip(xp, a, attrs):
    x = a[0]
    return [xp.minimum(xp.maximum(x, x.dtype.type(attrs["min"])), x.dtype.type(attrs["max"]))]


def _clip_int(xp, a, attrs):
    # a clamp makes false equalities over small integers as relu's max does: stand in the polynomial way
    x = a[0]
    return [x * (x + 3) + 5]


def decode_clip(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Clip whose bounds are absent or constant one-element tensors."""
    bounds = []
    for attr, position, missing in (("min", 1, -math.inf), ("max", 2, math.inf)):
        value = attr_or_input(proto, ctx, attr, position)
        if value is None and len(proto.input) > position and proto.input[position]:
            return None  # a bound computed at run time
        if value is not None and np.asarray(value).size != 1:
            return None
        bounds.append(missing if value is None else canonical_float(float(np.asarray(value).reshape(()))))
    return decoded(proto, CLIP, proto.input[:1], {"min": bounds[0], "max": bounds[1]})


def encode_clip(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Clip with both bounds (infinite ones written as such)."""
    name = node.name or ctx.fresh_name("Clip")
    low, high = float(node.attrs["min"]), float(node.attrs["max"])
    if ctx.opset < 11:
        return [onnx.helper.make_node("Clip", list(node.inputs), list(node.outputs), name=name, min=low, max=high)]
    names = [typed_constant(ctx, v, node.inputs[0], f"{name}_{k}") for k, v in (("min", low), ("max", high))]
    return [onnx.helper.make_node("Clip", [node.inputs[0], *names], list(node.outputs), name=name)]


CLIP = OpDef(
    name="clip", onnx_types=("Clip",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("min", -math.inf, z3="float", sample=one_of(0.0, -1.0)),
           AttrSpec("max", math.inf, z3="float", sample=one_of(6.0, 1.0))),
    shape=same_shape, kernel=_clip, int_kernel=_clip_int, decode=decode_clip, encode=encode_clip,
    doc="clamp to [min, max]", elementwise=True, z3_symbol="clip", family="activation")

OPS = (CLIP,)
