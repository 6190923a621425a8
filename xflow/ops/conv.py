"""Convolution: 2-D conv with TASO's fused activation, and enlarge (zero-pad a kernel to a larger size).

The sliding-window and auto_pad helpers it shares with the pooling ops live in ``_windows``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops._forms import accepts, known_shape, present_inputs
from xflow.ops._windows import (
    conv_columns,
    decode_geometry,
    menu_padding,
    pads_and_strides_facts,
    window_output,
    window_output_facts,
)
from xflow.ops.base import (
    AttrSpec,
    DecodeContext,
    EncodeContext,
    Generalize,
    Menu,
    OpDef,
    ShapeError,
    ShapeFacts,
    make_node,
    one_of,
    onnx_attrs,
    pick,
    symbolic_shape,
)
from xflow.ops.elementwise import _relu_int
from xflow.ops.squeeze import SQUEEZE, UNSQUEEZE

# ---- conv ---------------------------------------------------------------------------------------


def conv_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """conv(x [N,C,H,W], w [M,C/group,kh,kw], b [M]?) -> [N,M,OH,OW]."""
    x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4:
        raise ShapeError(f"conv: input and weight must be 4-D, got {x} and {w}")
    group = attrs["group"]
    if group < 1 or x[1] % group or w[0] % group or w[1] * group != x[1]:
        raise ShapeError(f"conv: group {group} does not fit input channels {x[1]} and weight {w}")
    if len(shapes) > 2 and tuple(shapes[2]) != (w[0],):
        raise ShapeError(f"conv: bias shape {shapes[2]} is not ({w[0]},)")
    return [(x[0], w[0]) + window_output("conv", x[2:], w[2:], attrs["strides"], attrs["pads"])]


def conv_fit(shapes: Sequence[Shape], attrs: Attrs, free: frozenset[int]) -> list[Shape] | None:
    """A free kernel's input channels (and output channels, a multiple of the group) fitted to the image, or a free
    image's channels to the kernel; a free bias to the kernel's output channels."""
    x, w = tuple(shapes[0]), tuple(shapes[1])
    group = attrs["group"]
    if len(x) != 4 or len(w) != 4 or group < 1:
        return None
    if 1 in free and x[1] % group == 0:
        w = (w[0] if w[0] % group == 0 else group * max(1, w[0] // group), x[1] // group, *w[2:])
    elif 0 in free and w[0] % group == 0:
        x = (x[0], w[1] * group, *x[2:])
    out = [x, w, *shapes[2:]]
    if len(shapes) > 2 and 2 in free:
        out[2] = (w[0],)
    return out


def _conv_linear(xp, a, attrs):
    x, w = a[0], a[1]
    group = attrs["group"]
    m, cg, kh, kw = w.shape
    n, _, h, wd = x.shape
    (sh, sw), (top, left, bottom, right) = attrs["strides"], attrs["pads"]
    oh, ow = (h + top + bottom - kh) // sh + 1, (wd + left + right - kw) // sw + 1
    cols = conv_columns(xp, x, (kh, kw), attrs["strides"], attrs["pads"], group)
    kernel = w.reshape(group, m // group, cg * kh * kw).transpose(0, 2, 1)
    out = xp.matmul(cols, kernel).transpose(0, 1, 3, 2).reshape(n, m, oh, ow)
    if len(a) > 2:
        out = out + a[2].reshape(1, m, 1, 1)
    return out


def _conv(xp, a, attrs):
    out = _conv_linear(xp, a, attrs)
    return [xp.maximum(out, 0) if attrs["act"] == "relu" else out]


def _conv_int(xp, a, attrs):
    out = _conv_linear(xp, a, attrs)
    return _relu_int(xp, [out], attrs) if attrs["act"] == "relu" else [out]


def conv_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """Input and kernel are 4-D, pads are non-negative and strides positive, the input's channels are the groups
    times the kernel's input channels (stated for a literal group only: a product of two unknowns would make the
    facts non-linear); a bias is a vector of the kernel's output channels."""
    facts = [f.rank(args[0]) == 4, f.rank(args[1]) == 4, *pads_and_strides_facts(attrs)]
    group = attrs.get("group", 1)
    if isinstance(group, int) and not isinstance(group, bool):
        facts.append(f.dim(args[0], 1) == group * f.dim(args[1], 1))
    if len(args) == 3:
        facts += [f.rank(args[2]) == 1, f.dim(args[2], 0) == f.dim(args[1], 0)]
    return facts


def conv_output_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any],
                      outs: Sequence[Any]) -> list[Any]:
    """A conv's output: the kernel's output channels, and the window's geometry (``window_output_facts``): with
    them z3 sees that equal output sizes pin a kernel's size (a stride moved across a conv needs it to be 1x1)."""
    window = (f.dim(args[1], 2), f.dim(args[1], 3))
    return [f.dim(outs[0], 1) == f.dim(args[1], 0), *window_output_facts(f, window, attrs, args[0], outs[0])]


def _menu_conv(params: dict[str, Any], shapes: Sequence[Shape]) -> dict[str, Any] | None:
    """A conv menu entry: ``padding`` same/valid for the kernel, ``group`` "1" or "depthwise" (one group per
    input channel, for a kernel of one input channel)."""
    if len(shapes[0]) != 4 or len(shapes[1]) != 4:
        return None
    attrs = dict(params)
    menu_padding(attrs, shapes[1][2:])
    attrs["group"] = 1 if attrs["group"] == "1" else shapes[0][1]
    if attrs["group"] != 1 and shapes[1][1] != 1:
        return None
    return attrs


#: the ONNX Conv attributes the decoders read (any other keeps the node opaque)
CONV_ONNX_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})


def conv_form(proto: onnx.NodeProto, ctx: DecodeContext, extra: frozenset[str] = frozenset()
              ) -> tuple[list[str], dict[str, Any], dict[str, Any]] | None:
    """A 2-D conv node's inputs (2 or 3), its ONNX attributes and its geometry as op attributes (strides,
    pads with auto_pad made explicit, group), or None outside dilation 1, static 4-D shapes and the conv
    attributes plus ``extra``."""
    inputs = present_inputs(proto)
    if inputs is None or len(inputs) not in (2, 3) or len(proto.output) != 1:
        return None
    attrs = onnx_attrs(proto)
    if set(attrs) - CONV_ONNX_ATTRS - extra:
        return None
    x, w = symbolic_shape(ctx, inputs[0]), symbolic_shape(ctx, inputs[1])
    if x is None or w is None or len(x) != 4 or len(w) != 4:
        return None
    if tuple(attrs.get("kernel_shape", w[2:])) != w[2:]:
        return None
    geometry = decode_geometry(attrs, x[2:], w[2:])
    if geometry is None:
        return None
    strides, pads = geometry
    return inputs, attrs, {"strides": strides, "pads": pads, "group": int(attrs.get("group", 1))}


def decode_conv(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """2-D Conv with dilation 1 and static shapes; auto_pad made explicit. A 1-D Conv: ``decode_conv1d``."""
    form = conv_form(proto, ctx)
    if form is None:
        return decode_conv1d(proto, ctx)
    inputs, _, geometry = form
    node = make_node(proto, CONV, inputs, proto.output, geometry)
    return [node] if accepts(CONV, node, ctx) else None


def decode_conv1d(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """A 1-D Conv (N, C, L) with a constant kernel as the 2-D conv of a unit-height image: unsqueeze at axis 2,
    conv with the kernel laid out (M, C/group, 1, k) as a new constant, squeeze at axis 2; the same function
    (the unit axis has no padding and stride 1). Untouched by a rewrite, the group is written back as the
    original node. Outside dilation 1 or a kernel the model gives as a constant, it stays opaque."""
    inputs = present_inputs(proto)
    if inputs is None or len(inputs) not in (2, 3) or len(proto.output) != 1:
        return None
    attrs = onnx_attrs(proto)
    if set(attrs) - CONV_ONNX_ATTRS:
        return None
    x, w = symbolic_shape(ctx, inputs[0]), symbolic_shape(ctx, inputs[1])
    if x is None or w is None or len(x) != 3 or len(w) != 3 or tuple(attrs.get("kernel_shape", w[2:])) != w[2:]:
        return None
    strides, pads, dilations = (list(attrs.get(k, d)) for k, d in (("strides", [1]), ("pads", [0, 0]),
                                                                      ("dilations", [1])))
    if len(strides) != 1 or len(pads) != 2 or len(dilations) != 1:
        return None
    lifted = {"strides": [1, *strides], "pads": [0, pads[0], 0, pads[1]], "dilations": [1, *dilations],
              "auto_pad": attrs.get("auto_pad", "NOTSET")}
    geometry = decode_geometry(lifted, (1, x[2]), (1, w[2]))
    kernel = ctx.constant_array(inputs[1])
    if geometry is None or kernel is None:
        return None
    image, out = ctx.fresh_name(f"{inputs[0]}_unit_h"), ctx.fresh_name(f"{proto.output[0]}_unit_h")
    kernel_2d = ctx.add_constant(np.ascontiguousarray(kernel[:, :, None, :]), f"{inputs[1]}_unit_h")
    return [make_node(proto.name, UNSQUEEZE, [inputs[0]], [image], {"axes": (2,)}),
            make_node(proto, CONV, [image, kernel_2d, *inputs[2:]], [out],
                      {"strides": geometry[0], "pads": geometry[1], "group": int(attrs.get("group", 1))}),
            make_node(proto.name, SQUEEZE, [out], proto.output, {"axes": (2,)})]


def encode_conv(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Conv with explicit geometry, followed by a Relu when the activation is fused."""
    name = node.name or ctx.fresh_name("Conv")
    relu = node.attrs["act"] == "relu"
    out = ctx.fresh_name(f"{node.outputs[0]}_preact") if relu else node.outputs[0]
    extra: dict[str, Any] = {}
    w = known_shape(ctx, node.inputs[1])
    if w is not None:
        extra["kernel_shape"] = list(w[2:])
    nodes = [onnx.helper.make_node("Conv", list(node.inputs), [out], name=name,
                                   strides=list(node.attrs["strides"]), pads=list(node.attrs["pads"]),
                                   group=node.attrs["group"], **extra)]
    if relu:
        nodes.append(onnx.helper.make_node("Relu", [out], list(node.outputs),
                                           name=ctx.fresh_name(f"{name}_relu")))
    return nodes


# ---- enlarge ------------------------------------------------------------------------------------


def enlarge_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """enlarge(w [M,C,kh,kw]) -> [M,C,size...], growing each kernel dim by an even amount."""
    (w,) = shapes
    size = tuple(attrs["size"])
    if len(w) != 4 or len(size) != 2:
        raise ShapeError(f"enlarge: needs a 4-D kernel and a 2-D size, got {w} and {size}")
    if any(s < k or (s - k) % 2 for s, k in zip(size, w[2:], strict=True)):
        raise ShapeError(f"enlarge: cannot center kernel {w[2:]} in size {size} (growth must be even, >= 0)")
    return [w[:2] + size]


def _enlarge_pads(kernel: Sequence[int], size: Sequence[int]) -> tuple[int, int]:
    return (size[0] - kernel[0]) // 2, (size[1] - kernel[1]) // 2


def _sample_size(rng: np.random.Generator, shapes: Sequence[Shape], chosen: Mapping[str, Any], n_out: int) -> Any:
    return tuple(k + 2 * pick(rng, [0, 1]) for k in shapes[0][2:])


def _enlarge(xp, a, attrs):
    dh, dw = _enlarge_pads(a[0].shape[2:], attrs["size"])
    return [xp.pad(a[0], ((0, 0), (0, 0), (dh, dh), (dw, dw)), mode="constant")]


def _enlarge_dynamic_pads(node: Node, ctx: EncodeContext, name: str) -> tuple[list[onnx.NodeProto], str]:
    """Pads [0,0,dh,dw,0,0,dh,dw] computed from the kernel's runtime shape (when no static shape is known)."""
    kh2, kw2 = node.attrs["size"]
    shape, masked, grow, half, pads = (ctx.fresh_name(f"{name}_{s}")
                                       for s in ("shape", "hw", "grow", "half", "pads"))
    mask = ctx.add_constant(np.array([0, 0, 1, 1], dtype=np.int64), f"{name}_mask")
    target = ctx.add_constant(np.array([0, 0, kh2, kw2], dtype=np.int64), f"{name}_size")
    two = ctx.add_constant(np.array(2, dtype=np.int64), f"{name}_two")
    make = onnx.helper.make_node
    nodes = [make("Shape", [node.inputs[0]], [shape], name=ctx.fresh_name(f"{name}_shape")),
             make("Mul", [shape, mask], [masked], name=ctx.fresh_name(f"{name}_mask")),
             make("Sub", [target, masked], [grow], name=ctx.fresh_name(f"{name}_sub")),
             make("Div", [grow, two], [half], name=ctx.fresh_name(f"{name}_div")),
             make("Concat", [half, half], [pads], name=ctx.fresh_name(f"{name}_concat"), axis=0)]
    return nodes, pads


def encode_enlarge(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Pad (constant mode); the pads come from the kernel's static shape when the context knows it."""
    name = node.name or ctx.fresh_name("Pad")
    w = known_shape(ctx, node.inputs[0])
    if w is None:
        if ctx.opset < 11:
            raise ShapeError(f"enlarge: encoding {name} before opset 11 needs the kernel's static shape")
        nodes, pads_name = _enlarge_dynamic_pads(node, ctx, name)
        return nodes + [onnx.helper.make_node("Pad", [node.inputs[0], pads_name], list(node.outputs),
                                              name=name, mode="constant")]
    dh, dw = _enlarge_pads(w[2:], node.attrs["size"])
    pads = [0, 0, dh, dw, 0, 0, dh, dw]
    if ctx.opset < 11:
        return [onnx.helper.make_node("Pad", list(node.inputs), list(node.outputs), name=name,
                                      mode="constant", pads=pads)]
    pads_name = ctx.add_constant(np.array(pads, dtype=np.int64), f"{name}_pads")
    return [onnx.helper.make_node("Pad", [node.inputs[0], pads_name], list(node.outputs), name=name,
                                  mode="constant")]


#: the window geometry's attributes, shared with the pools (the same z3 slots and sampling domains)
STRIDES = AttrSpec("strides", (1, 1), z3=2, sample=one_of((1, 1), (1, 1), (2, 2)),
                   wide=lambda rng, shapes, chosen, n_out: (pick(rng, [1, 2, 3]), pick(rng, [1, 2, 3])))
PADS = AttrSpec("pads", (0, 0, 0, 0), z3=4, sample=one_of((0, 0, 0, 0), (1, 1, 1, 1), (0, 0, 0, 0)),
                wide=lambda rng, shapes, chosen, n_out: tuple(pick(rng, [0, 1, 2]) for _ in range(4)))

CONV = OpDef(
    name="conv", onnx_types=("Conv",), min_inputs=2, max_inputs=3,
    attrs=(replace(STRIDES, generalize=Generalize("cs", ((1, 1), (2, 2)))),
           replace(PADS, generalize=Generalize("cp", ((0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 0, 1), (1, 0, 1, 0)))),
           AttrSpec("group", 1, sample=one_of(1, 1, 2)),
           AttrSpec("act", "none", ("none", "relu"), z3="choice", sample=one_of("none", "relu"))),
    shape=conv_shape, kernel=_conv, int_kernel=_conv_int, decode=decode_conv, encode=encode_conv,
    doc="2-D convolution (NCHW, dilation 1, optional bias, fused relu)", z3_symbol="conv",
    roles=("image", "kernel", "bias"), facts=conv_facts, output_facts=conv_output_facts, family="convolution",
    fit=conv_fit,
    menu=Menu(tuple({"strides": (s, s), "padding": p, "act": a, "group": g}
                    for s in (1, 2) for p in ("same", "valid") for a in ("none", "relu") for g in ("1", "depthwise"))
              # the paddings exports make explicit before strided convs (a Pad node to fold into the conv)
              + tuple({"strides": (2, 2), "padding": p, "act": "none", "group": g}
                      for p in ((0, 0, 1, 1), (1, 1, 2, 2)) for g in ("1", "depthwise")),
              arity=2, resolve=_menu_conv),
    flops=lambda ins, outs, attrs: 2 * int(np.prod(outs[0], dtype=np.int64)) * int(np.prod(ins[1][1:], dtype=np.int64)))

ENLARGE = OpDef(
    name="enlarge", onnx_types=("Pad",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("size", z3=2, sample=_sample_size),),
    shape=enlarge_shape, kernel=_enlarge, decode=None, encode=encode_enlarge,
    doc="zero-pad a conv kernel, centered, to a larger kernel size", weights_only=True, z3_symbol="enlarge",
    roles=("kernel",), menu=Menu(({"size": (3, 3)},)), family="convolution")

OPS = (CONV, ENLARGE)
