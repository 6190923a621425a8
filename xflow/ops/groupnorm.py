"""Group normalization (ONNX ``GroupNormalization``, opset 21): per sample and group of C/G channels over those
channels and the spatial axes, then a per-channel scale and bias. Opset 18's form (scale and bias per group,
deprecated for it) is not decoded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ir.dims import divides, is_static
from xflow.ops._forms import decoded
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, one_of, onnx_attrs, pick
from xflow.ops.instancenorm import centred_from_axis_2, normalized_from_axis_2, per_channel_shape, scaled_per_channel
from xflow.ops.norm import canonical_float

#: the first opset whose GroupNormalization takes scale and bias per channel (C,), not per group (G,)
PER_CHANNEL_SINCE = 21


def groupnorm_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """x [N, C, ...] with rank >= 3 and C a multiple of num_groups; scale and bias [C]."""
    out = per_channel_shape("groupnorm", shapes)
    groups, channels = attrs["num_groups"], out[0][1]
    # a symbolic C matches only where the groups divide it for every value (the table's rule for conditions that
    # hold for some sizes only)
    if groups < 1 or not divides(groups, channels):
        raise ShapeError(f"groupnorm: {groups} groups do not divide {channels} channels")
    return out


def _grouped(x, groups):
    return x.reshape((x.shape[0], groups, -1) + x.shape[2:])


def _groupnorm(xp, a, attrs):
    # instancenorm's normalization on the (N, G, C/G, ...) view: each group's channels and positions together
    x = a[0]
    y = normalized_from_axis_2(xp, _grouped(x, attrs["num_groups"]), attrs["epsilon"]).reshape(x.shape)
    return [scaled_per_channel(y, a[1], a[2])]


def _groupnorm_int(xp, a, attrs):
    # instancenorm's stand-in per group: centred by the group's sum (no division over integers)
    x = a[0]
    return [scaled_per_channel(centred_from_axis_2(_grouped(x, attrs["num_groups"])).reshape(x.shape), a[1], a[2])]


def decode_groupnorm(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """GroupNormalization at opset >= 21 with its num_groups and epsilon (default 1e-5), float32 statistics."""
    if ctx.opset < PER_CHANNEL_SINCE or len(proto.input) != 3 or "" in proto.input:
        return None
    attrs = onnx_attrs(proto)
    if "num_groups" not in attrs or set(attrs) - {"num_groups", "epsilon", "stash_type"}:
        return None
    if attrs.get("stash_type", 1) != 1:  # statistics in another type than float32: not this kernel
        return None
    return decoded(proto, GROUPNORM, proto.input,
                   {"num_groups": int(attrs["num_groups"]), "epsilon": canonical_float(attrs.get("epsilon", 1e-5))})


def encode_groupnorm(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX GroupNormalization (opset 21: scale and bias per channel; stash_type left at its default, float32)."""
    if ctx.opset < PER_CHANNEL_SINCE:  # before 21 the same node would read scale and bias per group
        raise ShapeError(f"groupnorm: GroupNormalization takes per-channel scale and bias from opset "
                         f"{PER_CHANNEL_SINCE}, not {ctx.opset}")
    return [onnx.helper.make_node("GroupNormalization", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("GroupNormalization"),
                                  num_groups=int(node.attrs["num_groups"]), epsilon=float(node.attrs["epsilon"]))]


def _sample_groups(rng: np.random.Generator, shapes: Sequence[Shape], chosen: Mapping[str, Any], n_out: int) -> Any:
    # a divisor of the channels where they are known, so the draw fits the shape rule
    x = tuple(shapes[0]) if shapes else ()
    if len(x) > 1 and is_static(x[1]) and int(x[1]) > 0:
        return pick(rng, [g for g in range(1, int(x[1]) + 1) if int(x[1]) % g == 0])
    return 1


GROUPNORM = OpDef(
    name="groupnorm", onnx_types=("GroupNormalization",), min_inputs=3, max_inputs=3,
    attrs=(AttrSpec("num_groups", sample=_sample_groups),
           AttrSpec("epsilon", 1e-5, z3="float", sample=one_of(1e-5, 1e-3))),
    shape=groupnorm_shape, kernel=_groupnorm, int_kernel=_groupnorm_int, decode=decode_groupnorm,
    encode=encode_groupnorm,
    doc="group normalization over each group of channels and the spatial axes, then per-channel scale and bias",
    z3_symbol="groupnorm", roles=("image", "channel", "channel"), family="norm")

OPS = (GROUPNORM,)
