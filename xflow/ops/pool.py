"""Pooling: 2-D max and average pooling (floor mode, dilation 1); global pools decode into them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import accepts
from xflow.ops._windows import (
    decode_geometry,
    menu_padding,
    pool_output_facts,
    sliding_windows,
    window_facts,
    window_output,
)
from xflow.ops.base import (
    AttrSpec,
    DecodeContext,
    EncodeContext,
    Generalize,
    Menu,
    OpDef,
    ShapeError,
    make_node,
    one_of,
    onnx_attrs,
    pick,
    symbolic_shape,
)
from xflow.ops.conv import PADS, STRIDES

_GEOMETRY = (AttrSpec("kernel", z3=2, sample=one_of((1, 1), (2, 2), (3, 3)),
                      wide=lambda rng, shapes, chosen, n_out: (pick(rng, [1, 2, 3, 4]), pick(rng, [1, 2, 3, 4]))),
             replace(STRIDES, generalize=Generalize("ps", ((1, 1), (2, 2)))),
             replace(PADS, generalize=Generalize("pp", ((0, 0, 0, 0), (1, 1, 1, 1)))))


def pool_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """pool(x [N,C,H,W]) -> [N,C,OH,OW]; pads must be smaller than the kernel (as in ONNX Runtime)."""
    (x,) = shapes
    if len(x) != 4:
        raise ShapeError(f"pool: input must be 4-D, got {x}")
    kernel, pads = tuple(attrs["kernel"]), tuple(attrs["pads"])
    out = window_output("pool", x[2:], kernel, attrs["strides"], pads)
    if any(p >= kernel[i % 2] for i, p in enumerate(pads)):
        raise ShapeError(f"pool: pads {pads} must be smaller than the kernel {kernel}")
    return [x[:2] + out]


def _lowest(dtype: np.dtype) -> int | float:
    return int(np.iinfo(dtype).min) if dtype.kind in "iu" else -np.inf


def _maxpool(xp, a, attrs):
    x = a[0]
    win = sliding_windows(xp, x, attrs["kernel"], attrs["strides"], attrs["pads"], _lowest(np.dtype(x.dtype)))
    return [win.max(axis=(4, 5))]


def _window_sums(xp, x, attrs):
    return sliding_windows(xp, x, attrs["kernel"], attrs["strides"], attrs["pads"]).sum(axis=(4, 5))


def _valid_counts(xp, x, attrs):
    """Per output position, how many window elements lie inside the unpadded input (shape 1,1,OH,OW)."""
    ones = xp.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype)
    return _window_sums(xp, ones, attrs)


def _avgpool(xp, a, attrs):
    x = a[0]
    sums = _window_sums(xp, x, attrs)
    if attrs["count_include_pad"] or not any(attrs["pads"]):
        kh, kw = attrs["kernel"]
        return [sums / (kh * kw)]
    return [sums / _valid_counts(xp, x, attrs)]


def _avgpool_int(xp, a, attrs):
    # TASO's trick: the window sum (a depthwise conv with a Cpool kernel of ones). Excluding the pad from
    # the count cannot divide exactly; weighting by 1 + (padded elements) stays linear and distinguishes it.
    x = a[0]
    sums = _window_sums(xp, x, attrs)
    if attrs["count_include_pad"] or not any(attrs["pads"]):
        return [sums]
    kh, kw = attrs["kernel"]
    return [sums * (1 + kh * kw - _valid_counts(xp, x, attrs))]


def _decode_pool(proto: onnx.NodeProto, ctx: DecodeContext, op: OpDef,
                 allowed: frozenset[str]) -> list[Node] | None:
    if not proto.output or not proto.output[0] or any(proto.output[1:]) or len(proto.input) != 1:
        return None
    attrs = onnx_attrs(proto)
    x = symbolic_shape(ctx, proto.input[0])
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", ()))
    if set(attrs) - allowed or x is None or len(x) != 4 or len(kernel) != 2:
        return None
    if int(attrs.get("ceil_mode", 0)) or int(attrs.get("storage_order", 0)):
        return None
    geometry = decode_geometry(attrs, x[2:], kernel)
    if geometry is None:
        return None
    params = {"kernel": kernel, "strides": geometry[0], "pads": geometry[1]}
    if "count_include_pad" in op.attr_names:
        params["count_include_pad"] = int(attrs.get("count_include_pad", 0))
        if params["count_include_pad"] not in (0, 1):
            return None
    node = make_node(proto, op, proto.input, proto.output[:1], params)
    return [node] if accepts(op, node, ctx) else None


_COMMON = frozenset({"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides"})


def decode_maxpool(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """MaxPool with one output, storage_order 0, ceil_mode 0, dilation 1, 4-D static input."""
    return _decode_pool(proto, ctx, MAXPOOL, _COMMON | {"storage_order"})


def decode_avgpool(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """AveragePool with ceil_mode 0, dilation 1, 4-D static input."""
    return _decode_pool(proto, ctx, AVGPOOL, _COMMON | {"count_include_pad"})


def _global_decoder(op: OpDef):
    """A decoder for GlobalAveragePool / GlobalMaxPool: a pool whose kernel is the whole plane."""

    def decode(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
        x = symbolic_shape(ctx, proto.input[0]) if len(proto.input) == 1 else None
        if x is None or len(x) != 4 or min(x[2:]) < 1 or len(proto.output) != 1 or proto.attribute:
            return None
        return [make_node(proto, op, proto.input, proto.output, {"kernel": x[2:]})]

    return decode


def _menu_pool(params: dict[str, Any], shapes: Sequence[Shape]) -> dict[str, Any] | None:
    """A pool menu entry: ``padding`` same/valid for its kernel."""
    attrs = dict(params)
    menu_padding(attrs, attrs["kernel"])
    return attrs


def _pool_menu(**extra: Any) -> Menu:
    return Menu(tuple({"kernel": (3, 3), "strides": (s, s), "padding": p, **extra} for s in (1, 2)
                      for p in ("same", "valid")), resolve=_menu_pool)


def _pool_encoder(onnx_type: str):
    """An encoder writing ONNX MaxPool / AveragePool with explicit geometry."""

    def encode(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
        attrs = {"kernel_shape": list(node.attrs["kernel"]), "strides": list(node.attrs["strides"]),
                 "pads": list(node.attrs["pads"])}
        if "count_include_pad" in node.attrs and (node.attrs["count_include_pad"] or ctx.opset >= 7):
            attrs["count_include_pad"] = node.attrs["count_include_pad"]
        return [onnx.helper.make_node(onnx_type, list(node.inputs), list(node.outputs),
                                      name=node.name or ctx.fresh_name(onnx_type), **attrs)]

    return encode


MAXPOOL = OpDef(
    name="maxpool", onnx_types=("MaxPool", "GlobalMaxPool"), min_inputs=1, max_inputs=1, attrs=_GEOMETRY,
    shape=pool_shape, kernel=_maxpool, decode=decode_maxpool, encode=_pool_encoder("MaxPool"),
    doc="2-D max pooling (padding never wins)", z3_symbol="maxpool", roles=("image",), facts=window_facts,
    output_facts=pool_output_facts, menu=_pool_menu(), family="pool")

AVGPOOL = OpDef(
    name="avgpool", onnx_types=("AveragePool", "GlobalAveragePool"), min_inputs=1, max_inputs=1,
    attrs=_GEOMETRY + (AttrSpec("count_include_pad", 0, (0, 1), sample=one_of(0, 1)),), shape=pool_shape,
    kernel=_avgpool,
    int_kernel=_avgpool_int, decode=decode_avgpool, encode=_pool_encoder("AveragePool"),
    doc="2-D average pooling (count_include_pad as in ONNX)", z3_symbol="avgpool", roles=("image",),
    facts=window_facts, output_facts=pool_output_facts, menu=_pool_menu(count_include_pad=1), family="pool")

OPS = (MAXPOOL, AVGPOOL)
DECODERS = {"GlobalMaxPool": _global_decoder(MAXPOOL), "GlobalAveragePool": _global_decoder(AVGPOOL)}
