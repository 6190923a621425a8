"""SimplifiedLayerNormalization (RMS normalization; ONNX Runtime registers it in the standard domain, opset 1,
outside the ONNX standard): x / sqrt(mean(x², axes from ``axis`` on) + epsilon) · scale, the statistics in
float32 at least (``stash_type`` 1, the only one decoded). Only its first output is decoded."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xflow.ir import Attrs, Shape
from xflow.ops._contrib import contrib_decoder, contrib_encoder, float_attr
from xflow.ops.base import AttrSpec, OpDef, ShapeError, one_of, symbolic_shape
from xflow.ops.layernorm import layernorm_facts


def rmsnorm_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """x's shape; the scale has exactly the normalized dims x[axis:]."""
    x = tuple(shapes[0])
    axis = attrs["axis"]
    if not 0 <= axis < len(x):
        raise ShapeError(f"rmsnorm: axis {axis} out of range for rank {len(x)}")
    if tuple(shapes[1]) != x[axis:]:
        raise ShapeError(f"rmsnorm: scale shape {tuple(shapes[1])} is not the normalized dims {x[axis:]}")
    return [x]


def _rmsnorm(xp, a, attrs):
    x = a[0]
    wide = x.astype(xp.promote_types(x.dtype, np.float32))
    axes = tuple(range(attrs["axis"], x.ndim))
    mean_square = (wide * wide).mean(axis=axes, keepdims=True)
    return [(wide / xp.sqrt(mean_square + attrs["epsilon"])).astype(x.dtype) * a[1]]


def _rmsnorm_int(xp, a, attrs):
    # an integer stand-in: x times one plus its sum of squares over the normalized axes, scaled
    x = a[0]
    axes = tuple(range(attrs["axis"], x.ndim))
    return [x * ((x * x).sum(axis=axes, keepdims=True) + 1) * a[1]]


def _read(attrs, proto, ctx):
    shape = symbolic_shape(ctx, proto.input[0])
    axis = int(attrs.get("axis", -1))
    if shape is None or int(attrs.get("stash_type", 1)) != 1 or not -len(shape) <= axis < len(shape):
        return None
    return {"axis": axis % len(shape), "epsilon": float_attr(attrs, "epsilon", 1e-5)}


def _sample_axis(rng, shapes, chosen, n_out):
    return int(rng.integers(len(shapes[0]))) if shapes and shapes[0] else None


RMSNORM = OpDef(
    name="rmsnorm", onnx_types=("SimplifiedLayerNormalization",), min_inputs=2, max_inputs=2,
    attrs=(AttrSpec("axis", sample=_sample_axis), AttrSpec("epsilon", 1e-5, z3="float", sample=one_of(1e-5, 1e-6))),
    shape=rmsnorm_shape, kernel=_rmsnorm, int_kernel=_rmsnorm_int,
    decode=contrib_decoder(lambda: RMSNORM, (2,), ("axis", "epsilon", "stash_type"), _read),
    encode=contrib_encoder("SimplifiedLayerNormalization", domain="",
                           attrs_of=lambda node, ctx: {"axis": node.attrs["axis"],
                                                       "epsilon": float(node.attrs["epsilon"])}),
    doc="RMS normalization over the axes from axis on, then scale (ONNX Runtime's SimplifiedLayerNormalization)",
    z3_symbol="rmsnorm", facts=layernorm_facts, family="norm")

OPS = (RMSNORM,)
