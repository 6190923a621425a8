"""Constant-mode padding with constant pads (ONNX ``Pad``): pads as an attribute before opset 11, as
constant inputs from 11 on. Reflect/edge modes, negative pads and an axes input stay opaque."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import attr_or_input, decoded, typed_constant
from xflow.ops._windows import padded
from xflow.ops.base import (
    AttrSpec,
    DecodeContext,
    EncodeContext,
    Menu,
    OpDef,
    ShapeError,
    ShapeFacts,
    onnx_attrs,
    symbolic_shape,
)


def pad_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Each dim grows by its begin and end pads (ONNX order: all begins, then all ends)."""
    (x,) = shapes
    pads = attrs["pads"]
    if not x:
        raise ShapeError("pad: a scalar has no dims to pad (ONNX Runtime refuses it)")
    if len(pads) != 2 * len(x) or any(p < 0 for p in pads):
        raise ShapeError(f"pad: pads {pads} are not 2 x rank {len(x)} non-negative values")
    return [tuple(d + pads[i] + pads[i + len(x)] for i, d in enumerate(x))]


def _pad(xp, a, attrs):
    return [padded(xp, a[0], attrs["pads"], attrs["value"])]


def decode_pad(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Pad in constant mode with constant pads and value, over all axes."""
    shape = symbolic_shape(ctx, proto.input[0])
    attrs = onnx_attrs(proto)
    if shape is None or attrs.get("mode", b"constant") not in (b"constant", "constant") or len(proto.input) > 3:
        return None
    pads = attr_or_input(proto, ctx, "pads", 1)
    value = np.asarray(attrs["value"]) if "value" in attrs else attr_or_input(proto, ctx, "constant_value", 2)
    if pads is None or (value is None and len(proto.input) > 2 and proto.input[2]):
        return None
    value = 0.0 if value is None else float(np.asarray(value).reshape(-1)[0]) if np.asarray(value).size else 0.0
    return decoded(proto, PAD, proto.input[:1], {"pads": tuple(int(p) for p in pads.reshape(-1)), "value": value})


def encode_pad(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Pad (constant mode)."""
    name = node.name or ctx.fresh_name("Pad")
    pads, value = list(node.attrs["pads"]), float(node.attrs["value"])
    if ctx.opset < 11:
        return [onnx.helper.make_node("Pad", list(node.inputs), list(node.outputs), name=name, pads=pads,
                                      value=value)]
    inputs = [node.inputs[0], ctx.add_constant(np.array(pads, dtype=np.int64), f"{name}_pads")]
    if value != 0.0:  # zero is the default, of whatever type the input has
        inputs.append(typed_constant(ctx, value, node.inputs[0], f"{name}_value"))
    return [onnx.helper.make_node("Pad", inputs, list(node.outputs), name=name)]


def _menu_pad(params: dict[str, Any], shapes: Sequence[Shape]) -> dict[str, Any] | None:
    """A pad menu entry: ``spatial`` (top, left, bottom, right) zeros around an NCHW image."""
    if len(shapes[0]) != 4:
        return None
    top, left, bottom, right = params["spatial"]
    return {"pads": (0, 0, top, left, 0, 0, bottom, right), "value": 0.0}


#: The paddings exports write as Pad nodes (TF-style "SAME" made explicit): none (1x1 convs), symmetric (3x3 at
#: stride 1), one at the end (3x3 at stride 2 on even sizes), one and two (5x5 at stride 2).
MENU_PADDINGS: tuple[tuple[int, int, int, int], ...] = ((0, 0, 0, 0), (1, 1, 1, 1), (0, 0, 1, 1), (1, 1, 2, 2))

def pad_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """A pad's input has half as many dims as its pads have entries."""
    pads = attrs["pads"]
    return [] if f.symbolic(pads) else [f.rank(args[0]) == len(pads) // 2]


PAD = OpDef(
    name="pad", onnx_types=("Pad",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("pads", z3="code"), AttrSpec("value", 0.0, z3="float")),
    shape=pad_shape, kernel=_pad, decode=decode_pad, encode=encode_pad,
    doc="pad every axis with a constant", z3_symbol="pad", family="layout", facts=pad_facts,
    menu=Menu(tuple({"spatial": p} for p in MENU_PADDINGS), resolve=_menu_pad, activations_only=True))

OPS = (PAD,)
