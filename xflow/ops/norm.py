"""Normalization: inference-mode batch normalization over axis 1."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import accepts
from xflow.ops.base import (
    AttrSpec,
    DecodeContext,
    EncodeContext,
    OpDef,
    ShapeError,
    ShapeFacts,
    make_node,
    one_of,
    onnx_attrs,
)


def batchnorm_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """batchnorm(x [N,C,...], scale, bias, mean, var [C] each) -> x's shape."""
    x = shapes[0]
    if len(x) < 2:
        raise ShapeError(f"batchnorm: input must have rank >= 2, got {x}")
    for name, s in zip(("scale", "bias", "mean", "var"), shapes[1:], strict=True):
        if tuple(s) != (x[1],):
            raise ShapeError(f"batchnorm: {name} shape {s} is not ({x[1]},) for input {x}")
    return [tuple(x)]


def _per_channel(x, params):
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    return [p.reshape(shape) for p in params]


def _batchnorm(xp, a, attrs):
    x = a[0]
    scale, bias, mean, var = _per_channel(x, a[1:])
    return [(x - mean) * (scale / xp.sqrt(var + attrs["epsilon"])) + bias]


def _batchnorm_int(xp, a, attrs):
    # An affine integer stand-in for the normalization (no square roots or division over integers).
    x = a[0]
    scale, bias, mean, var = _per_channel(x, a[1:])
    return [(x - mean) * scale * var + bias]


def batchnorm_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """The input has rank >= 2 and each parameter is a vector of its channels."""
    return [f.rank(args[0]) >= 2] + [f.both(f.rank(p) == 1, f.dim(p, 0) == f.dim(args[0], 1)) for p in args[1:]]


def canonical_float(value: float) -> float:
    """A float attribute as stored in ONNX (float32), as the shortest decimal that round-trips it."""
    return float(str(np.float32(value)))


def decode_batchnorm(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """BatchNormalization in inference mode (opset >= 7, spatial, training_mode 0) with one output."""
    attrs = onnx_attrs(proto)
    if ctx.opset < 7 or set(attrs) - {"epsilon", "momentum", "spatial", "training_mode"}:
        return None
    if int(attrs.get("spatial", 1)) != 1 or int(attrs.get("training_mode", 0)) != 0:
        return None
    if len(proto.input) != 5 or "" in proto.input or not any(proto.output[:1]) or any(proto.output[1:]):
        return None
    node = make_node(proto, BATCHNORM, proto.input, proto.output[:1],
                     {"epsilon": canonical_float(attrs.get("epsilon", 1e-5))})
    return [node] if accepts(BATCHNORM, node, ctx) else None


def epsilon_encoder(onnx_type: str):
    """An encoder writing ``onnx_type`` on the node's inputs and outputs with its ``epsilon`` (the norms)."""

    def encode(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
        return [onnx.helper.make_node(onnx_type, list(node.inputs), list(node.outputs),
                                      name=node.name or ctx.fresh_name(onnx_type),
                                      epsilon=float(node.attrs["epsilon"]))]

    return encode


#: ONNX BatchNormalization (inference, one output)
encode_batchnorm = epsilon_encoder("BatchNormalization")


BATCHNORM = OpDef(
    name="batchnorm", onnx_types=("BatchNormalization",), min_inputs=5, max_inputs=5,
    attrs=(AttrSpec("epsilon", 1e-5, z3="float", sample=one_of(1e-5, 1e-3)),), shape=batchnorm_shape,
    kernel=_batchnorm, int_kernel=_batchnorm_int,
    decode=decode_batchnorm, encode=encode_batchnorm,
    doc="inference batch normalization: (x - mean) / sqrt(var + epsilon) * scale + bias on axis 1",
    z3_symbol="batchnorm", channel_params=(1, 2, 3, 4), roles=("any", "channel", "channel", "channel", "variance"),
    facts=batchnorm_facts, family="norm")

OPS = (BATCHNORM,)
