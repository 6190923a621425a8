"""Instance normalization (ONNX ``InstanceNormalization``): per sample and channel over the spatial axes,
then a per-channel scale and bias."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import decoded
from xflow.ops.base import AttrSpec, DecodeContext, OpDef, ShapeError, one_of, onnx_attrs
from xflow.ops.norm import canonical_float, epsilon_encoder


def instancenorm_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """x [N, C, ...] with rank >= 3; scale and bias [C]."""
    x = tuple(shapes[0])
    if len(x) < 3:
        raise ShapeError(f"instancenorm: input must have rank >= 3, got {x}")
    for name, s in zip(("scale", "bias"), shapes[1:], strict=True):
        if tuple(s) != (x[1],):
            raise ShapeError(f"instancenorm: {name} shape {tuple(s)} is not ({x[1]},)")
    return [x]


def _channel(p, ndim):
    return p.reshape((1, -1) + (1,) * (ndim - 2))


def _instancenorm(xp, a, attrs):
    x = a[0]
    wide = x.astype(xp.promote_types(x.dtype, np.float32))
    axes = tuple(range(2, x.ndim))
    centered = wide - wide.mean(axis=axes, keepdims=True)
    var = (centered * centered).mean(axis=axes, keepdims=True)
    y = (centered / xp.sqrt(var + attrs["epsilon"])).astype(x.dtype)
    return [y * _channel(a[1], x.ndim) + _channel(a[2], x.ndim)]


def _instancenorm_int(xp, a, attrs):
    x = a[0]
    centered = x - x.sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    return [centered * _channel(a[1], x.ndim) + _channel(a[2], x.ndim)]


def decode_instancenorm(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """InstanceNormalization with its epsilon (default 1e-5)."""
    if len(proto.input) != 3 or "" in proto.input:
        return None
    return decoded(proto, INSTANCENORM, proto.input,
                   {"epsilon": canonical_float(onnx_attrs(proto).get("epsilon", 1e-5))})


INSTANCENORM = OpDef(
    name="instancenorm", onnx_types=("InstanceNormalization",), min_inputs=3, max_inputs=3,
    attrs=(AttrSpec("epsilon", 1e-5, z3="float", sample=one_of(1e-5, 1e-3)),), shape=instancenorm_shape,
    kernel=_instancenorm, int_kernel=_instancenorm_int, decode=decode_instancenorm,
    encode=epsilon_encoder("InstanceNormalization"),
    doc="instance normalization over the spatial axes, then per-channel scale and bias", z3_symbol="instancenorm",
    roles=("image", "channel", "channel"), family="norm")

OPS = (INSTANCENORM,)
