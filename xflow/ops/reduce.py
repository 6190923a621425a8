"""Reductions over constant axes (ONNX ``ReduceMean``, ``ReduceSum``, ``ReduceMax``), one op each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import attr_or_input, axes_attr, decoded
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, Kernel, OpDef, ShapeError, onnx_attrs, symbolic_shape

#: the first opset where the axes are an input rather than an attribute
AXES_INPUT_SINCE = {"ReduceMean": 18, "ReduceSum": 13, "ReduceMax": 18}


def reduce_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """The input's shape with the reduced axes kept as 1 (keepdims) or dropped."""
    (x,) = shapes
    axes = attrs["axes"]
    if not axes or list(axes) != sorted(set(axes)) or axes[0] < 0 or axes[-1] >= len(x):
        raise ShapeError(f"reduce: axes {axes} are not sorted distinct axes of rank {len(x)}")
    if any(x[a] == 0 for a in axes):
        raise ShapeError(f"reduce: an empty axis of {tuple(x)} among {axes}")
    if attrs["keepdims"]:
        return [tuple(1 if i in axes else d for i, d in enumerate(x))]
    return [tuple(d for i, d in enumerate(x) if i not in axes)]


def _decoder(op: list[OpDef]):
    def decode(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
        """Axes from the attribute or the constant input; no axes means all of them (unless that is a no-op)."""
        shape = symbolic_shape(ctx, proto.input[0])
        attrs = onnx_attrs(proto)
        if shape is None or not shape or len(proto.output) != 1:
            return None
        values = attr_or_input(proto, ctx, "axes", 1)
        if values is None and len(proto.input) > 1 and proto.input[1]:
            return None  # axes computed at run time
        if values is None or values.size == 0:
            if int(attrs.get("noop_with_empty_axes", 0)):
                return None
            values = range(len(shape))
        try:
            axes = axes_attr(values, len(shape))
        except ShapeError:
            return None
        return decoded(proto, op[0], proto.input[:1], {"axes": axes, "keepdims": int(attrs.get("keepdims", 1))})

    return decode


def _encoder(onnx_type: str):
    def encode(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
        """The axes as an attribute before the opset that made them an input, as a constant input from then."""
        name = node.name or ctx.fresh_name(onnx_type)
        axes, keepdims = list(node.attrs["axes"]), int(node.attrs["keepdims"])
        if ctx.opset < AXES_INPUT_SINCE[onnx_type]:
            return [onnx.helper.make_node(onnx_type, list(node.inputs), list(node.outputs), name=name, axes=axes,
                                          keepdims=keepdims)]
        axes_name = ctx.add_constant(np.array(axes, dtype=np.int64), f"{name}_axes")
        return [onnx.helper.make_node(onnx_type, [node.inputs[0], axes_name], list(node.outputs), name=name,
                                      keepdims=keepdims)]

    return encode


def _sample_axes(rng, shapes, chosen, n_out):
    rank = len(shapes[0]) if shapes else 0
    if not rank:
        return None
    picked = sorted({int(a) for a in rng.integers(rank, size=int(rng.integers(1, rank + 1)))})
    return tuple(picked)


def _reduction(name: str, onnx_type: str, kernel: Kernel, int_kernel: Kernel | None, doc: str) -> OpDef:
    holder: list[OpDef] = []
    entry = OpDef(
        name=name, onnx_types=(onnx_type,), min_inputs=1, max_inputs=1,
        attrs=(AttrSpec("axes", z3="code", sample=_sample_axes),
               AttrSpec("keepdims", 1, choices=(0, 1), sample=lambda rng, s, c, n: int(rng.integers(2)))),
        shape=reduce_shape, kernel=kernel, int_kernel=int_kernel, decode=_decoder(holder),
        encode=_encoder(onnx_type), doc=doc, z3_symbol=name, family="pool")
    holder.append(entry)
    return entry


def _reducer(fn: str) -> Kernel:
    return lambda xp, a, attrs: [getattr(xp, fn)(a[0], axis=tuple(attrs["axes"]), keepdims=bool(attrs["keepdims"]))]


# the mean's integer variant sums without dividing (as avgpool's does), so mean and sum share fingerprints
REDUCEMEAN = _reduction("reducemean", "ReduceMean", _reducer("mean"), _reducer("sum"), "mean over constant axes")
REDUCESUM = _reduction("reducesum", "ReduceSum", _reducer("sum"), None, "sum over constant axes")
REDUCEMAX = _reduction("reducemax", "ReduceMax", _reducer("max"), None, "maximum over constant axes")

OPS = (REDUCEMEAN, REDUCESUM, REDUCEMAX)
