"""Slicing with constant parameters (ONNX ``Slice``; attributes before opset 10, constant inputs after).

The parameters are resolved against the input at load: ``starts``, ``stops`` and ``steps`` per input axis as
Python's ``slice(...).indices`` gives them (a stop of -1 with a negative step means "past index 0"), so the op's
meaning needs no clamping rules. An axis the Slice leaves whole may have a dynamic dim (a decoder's batch and
sequence beside the head size it halves): its triple is ``(0, WHOLE, 1)``, the whole axis at any size; an axis it
cuts needs a static dim."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ir.dims import is_static
from xflow.ops._forms import attr_or_input, decoded
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, symbolic_shape

_INT64_MIN = int(np.iinfo(np.int64).min)
_INT64_MAX = int(np.iinfo(np.int64).max)
#: The stop of an axis kept whole whatever its size (a dynamic dim): ``(0, WHOLE, 1)``.
WHOLE = 1 << 62


def _ranges(x: Shape, attrs: Attrs) -> list[range | None]:
    """Each axis's range (None: a whole axis of a dynamic dim)."""
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    if not len(starts) == len(stops) == len(steps) == len(x):
        raise ShapeError(f"slice: parameters {starts}, {stops}, {steps} do not match rank {len(x)}")
    out: list[range | None] = []
    for dim, start, stop, step in zip(x, starts, stops, steps, strict=True):
        if (start, stop, step) == (0, WHOLE, 1):
            out.append(range(0, dim, 1) if is_static(dim) else None)
            continue
        if not is_static(dim):
            raise ShapeError(f"slice: ({start}, {stop}, {step}) cuts a dynamic dim ({dim})")
        # the values slice(...).indices(dim) gives: within [0, dim] going forward, [-1, dim - 1] backward
        low, high = (0, dim) if step > 0 else (-1, dim - 1)
        if step == 0 or not (low <= start <= high and low <= stop <= high):
            raise ShapeError(f"slice: ({start}, {stop}, {step}) is not a resolved slice of a dim of {dim}")
        out.append(range(start, stop, step))
    return out


def slice_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """One dim per axis: the length of that axis's range (a whole dynamic axis: its dim)."""
    x = tuple(shapes[0])
    return [tuple(dim if r is None else len(r) for dim, r in zip(x, _ranges(x, attrs), strict=True))]


def _slice(xp, a, attrs):
    index = tuple(slice(None) if r is None else slice(r.start, r.stop if r.stop >= 0 else None, r.step)
                  for r in _ranges(a[0].shape, attrs))
    return [a[0][index].copy()]


def decode_slice(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Slice whose starts, ends, axes and steps are all known constants."""
    shape = symbolic_shape(ctx, proto.input[0])
    if shape is None or len(proto.output) != 1:
        return None
    starts, ends = attr_or_input(proto, ctx, "starts", 1), attr_or_input(proto, ctx, "ends", 2)
    axes, steps = attr_or_input(proto, ctx, "axes", 3), attr_or_input(proto, ctx, "steps", 4)
    for position, value in ((3, axes), (4, steps)):
        if value is None and len(proto.input) > position and proto.input[position]:
            return None  # a parameter computed at run time
    if starts is None or ends is None:
        return None
    starts, ends = starts.reshape(-1).tolist(), ends.reshape(-1).tolist()
    axes_list = axes.reshape(-1).tolist() if axes is not None else list(range(len(starts)))
    steps_list = steps.reshape(-1).tolist() if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes_list) == len(steps_list) or 0 in steps_list:
        return None
    resolved = [(0, d, 1) if is_static(d) else (0, WHOLE, 1) for d in shape]
    seen = set()
    for start, end, axis, step in zip(starts, ends, axes_list, steps_list, strict=True):
        if not -len(shape) <= axis < len(shape) or axis % len(shape) in seen:
            return None
        axis %= len(shape)
        seen.add(axis)
        if not is_static(shape[axis]):
            if (int(start), int(step)) != (0, 1) or int(end) < _INT64_MAX // 2:
                return None  # a cut of a dynamic dim: its bounds depend on the size
            continue  # [0:end] of any size with an end past every size: the whole axis
        resolved[axis] = slice(int(start), int(end), int(step)).indices(int(shape[axis]))
    return decoded(proto, SLICE, proto.input[:1], {"starts": tuple(r[0] for r in resolved),
                                                   "stops": tuple(r[1] for r in resolved),
                                                   "steps": tuple(r[2] for r in resolved)})


def encode_slice(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Slice over every axis (constant inputs from opset 10, attributes before); a backward stop of -1
    ("past index 0") is written as INT64_MIN and a whole dynamic axis's stop as INT64_MAX, which ONNX clamps to the
    same places."""
    name = node.name or ctx.fresh_name("Slice")
    starts, stops, steps = node.attrs["starts"], node.attrs["stops"], node.attrs["steps"]
    ends = [_INT64_MAX if s == WHOLE else s if s >= 0 else _INT64_MIN for s in stops]
    params = {"starts": list(starts), "ends": ends,
              "axes": list(range(len(starts)))}
    if ctx.opset < 10:
        if any(s != 1 for s in steps):
            raise ShapeError(f"slice: steps {steps} need opset >= 10")
        return [onnx.helper.make_node("Slice", list(node.inputs), list(node.outputs), name=name, **params)]
    names = [ctx.add_constant(np.array(params[k], dtype=np.int64), f"{name}_{k}") for k in ("starts", "ends", "axes")]
    names.append(ctx.add_constant(np.array(steps, dtype=np.int64), f"{name}_steps"))
    return [onnx.helper.make_node("Slice", [node.inputs[0], *names], list(node.outputs), name=name)]


SLICE = OpDef(
    name="slice", onnx_types=("Slice",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("starts", z3="code"), AttrSpec("stops", z3="code"), AttrSpec("steps", z3="code")),
    shape=slice_shape, kernel=_slice, decode=decode_slice, encode=encode_slice,
    doc="constant slice of every axis (start, stop, step)", linear=True, z3_symbol="slice", family="layout")

OPS = (SLICE,)
