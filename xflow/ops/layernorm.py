"""Layer normalization (ONNX ``LayerNormalization``, opset 17): normalize over the axes from ``axis`` on,
then scale and shift. Statistics are computed in float32 at least (``stash_type`` 1, the only one decoded)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import decoded, present_inputs
from xflow.ops.base import (
    AttrSpec,
    DecodeContext,
    EncodeContext,
    OpDef,
    ShapeError,
    ShapeFacts,
    one_of,
    onnx_attrs,
    symbolic_shape,
)
from xflow.ops.norm import canonical_float


def layernorm_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """x's shape; scale (and bias) have exactly the normalized dims x[axis:]."""
    x = tuple(shapes[0])
    axis = attrs["axis"]
    if not 0 <= axis < len(x):
        raise ShapeError(f"layernorm: axis {axis} out of range for rank {len(x)}")
    for name, s in zip(("scale", "bias"), shapes[1:], strict=False):
        if tuple(s) != x[axis:]:
            raise ShapeError(f"layernorm: {name} shape {tuple(s)} is not the normalized dims {x[axis:]}")
    return [x]


def _axes(x: Any, axis: int) -> tuple[int, ...]:
    return tuple(range(axis, x.ndim))


def _layernorm(xp, a, attrs):
    x = a[0]
    wide = x.astype(xp.promote_types(x.dtype, np.float32))
    axes = _axes(x, attrs["axis"])
    mean = wide.mean(axis=axes, keepdims=True)
    centered = wide - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    y = (centered / xp.sqrt(var + attrs["epsilon"])).astype(x.dtype) * a[1]
    return [y + a[2] if len(a) > 2 else y]


def _layernorm_int(xp, a, attrs):
    # an integer stand-in: centred by the sum over the normalized axes, then scaled and shifted
    x = a[0]
    y = (x - x.sum(axis=_axes(x, attrs["axis"]), keepdims=True)) * a[1]
    return [y + a[2] if len(a) > 2 else y]


def layernorm_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """The axis is one of x's."""
    axis = attrs.get("axis")
    if axis is None:
        return []
    return [axis >= 0, axis < f.rank(args[0])] if f.symbolic(axis) else [f.rank(args[0]) > axis]


def decode_layernorm(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """LayerNormalization with only its Y output used and float32 statistics."""
    attrs = onnx_attrs(proto)
    inputs = present_inputs(proto)
    shape = symbolic_shape(ctx, proto.input[0])
    if inputs is None or shape is None or any(proto.output[1:]) or int(attrs.get("stash_type", 1)) != 1:
        return None
    axis = int(attrs.get("axis", -1))
    if not -len(shape) <= axis < len(shape):
        return None
    return decoded(proto, LAYERNORM, inputs, {"axis": axis % len(shape),
                                              "epsilon": canonical_float(attrs.get("epsilon", 1e-5))})


def encode_layernorm(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX LayerNormalization (opset 17), one output."""
    return [onnx.helper.make_node("LayerNormalization", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("LayerNormalization"), axis=node.attrs["axis"],
                                  epsilon=float(node.attrs["epsilon"]))]


def _sample_axis(rng, shapes, chosen, n_out):
    return int(rng.integers(len(shapes[0]))) if shapes and shapes[0] else None


LAYERNORM = OpDef(
    name="layernorm", onnx_types=("LayerNormalization",), min_inputs=2, max_inputs=3,
    attrs=(AttrSpec("axis", sample=_sample_axis), AttrSpec("epsilon", 1e-5, z3="float", sample=one_of(1e-5, 1e-3))),
    shape=layernorm_shape, kernel=_layernorm, int_kernel=_layernorm_int, decode=decode_layernorm,
    encode=encode_layernorm, doc="layer normalization over the axes from axis on, then scale and bias",
    z3_symbol="layernorm", facts=layernorm_facts, family="norm")

OPS = (LAYERNORM,)
