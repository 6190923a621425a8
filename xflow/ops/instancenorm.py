"""Instance normalization (ONNX ``InstanceNormalization``): per sample and channel over the spatial axes,
then a per-channel scale and bias."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import decoded
from xflow.ops.base import AttrSpec, DecodeContext, OpDef, ShapeError, one_of, onnx_attrs
from xflow.ops.norm import canonical_float, epsilon_encoder


def per_channel_shape(op: str, shapes: Sequence[Shape]) -> list[Shape]:
    """x [N, C, ...] with rank >= 3; scale and bias [C] (``op`` names the refusal)."""
    x = tuple(shapes[0])
    if len(x) < 3:
        raise ShapeError(f"{op}: input must have rank >= 3, got {x}")
    for name, s in zip(("scale", "bias"), shapes[1:], strict=True):
        if tuple(s) != (x[1],):
            raise ShapeError(f"{op}: {name} shape {tuple(s)} is not ({x[1]},)")
    return [x]


def instancenorm_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """x [N, C, ...] with rank >= 3; scale and bias [C]."""
    return per_channel_shape("instancenorm", shapes)


def scaled_per_channel(y: Any, scale: Any, bias: Any) -> Any:
    """y [N, C, ...] times a per-channel scale plus a per-channel bias."""
    shape = (1, -1) + (1,) * (y.ndim - 2)
    return y * scale.reshape(shape) + bias.reshape(shape)


def normalized_from_axis_2(xp: Any, x: Any, epsilon: float) -> Any:
    """x normalized over its axes from 2 on, per leading (N, C) pair: statistics in float32 at least, the result
    in x's dtype."""
    wide = x.astype(xp.promote_types(x.dtype, np.float32))
    axes = tuple(range(2, x.ndim))
    centered = wide - wide.mean(axis=axes, keepdims=True)
    var = (centered * centered).mean(axis=axes, keepdims=True)
    return (centered / xp.sqrt(var + epsilon)).astype(x.dtype)


def centred_from_axis_2(x: Any) -> Any:
    """The integer stand-in of that normalization: x centred by its sum over the axes from 2 on."""
    return x - x.sum(axis=tuple(range(2, x.ndim)), keepdims=True)


def _instancenorm(xp, a, attrs):
    return [scaled_per_channel(normalized_from_axis_2(xp, a[0], attrs["epsilon"]), a[1], a[2])]


def _instancenorm_int(xp, a, attrs):
    return [scaled_per_channel(centred_from_axis_2(a[0]), a[1], a[2])]


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
