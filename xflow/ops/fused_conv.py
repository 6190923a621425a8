"""FusedConv (ONNX Runtime contrib, ``com.microsoft``): a 2-D convolution (dilation 1, optional bias) followed
by its ``activation``: Relu, Sigmoid or Tanh (the ones ONNX Runtime's CPU kernel takes without parameters).
The sum input (Z) and parameterized activations stay opaque."""

from __future__ import annotations

from typing import Any

from xflow.ir import Attrs
from xflow.ops._contrib import FLOAT_KERNELS, MS_DOMAIN, contrib_encoder
from xflow.ops._forms import accepts
from xflow.ops.base import AttrSpec, OpDef, make_node, one_of
from xflow.ops.conv import CONV, PADS, STRIDES, conv_facts, conv_form, conv_shape
from xflow.ops.elementwise import RELU, SIGMOID, TANH

#: the activation attribute's values (ONNX Runtime's spelling) and the op-table op each one applies
ACTIVATIONS: dict[str, OpDef] = {"Relu": RELU, "Sigmoid": SIGMOID, "Tanh": TANH}


def _linear(attrs: Attrs) -> Attrs:
    return CONV.normalize_attrs({"strides": attrs["strides"], "pads": attrs["pads"], "group": attrs["group"]})


def _fused_conv(xp, a, attrs):
    return ACTIVATIONS[attrs["activation"]].evaluate(xp, CONV.evaluate(xp, a, _linear(attrs)), Attrs())


def _fused_conv_int(xp, a, attrs):
    return ACTIVATIONS[attrs["activation"]].evaluate_int(xp, CONV.evaluate_int(xp, a, _linear(attrs)), Attrs())


def decode_fused_conv(proto, ctx) -> list | None:
    """FusedConv with a parameterless activation, no sum input, dilation 1 and static shapes."""
    form = conv_form(proto, ctx, frozenset({"activation"}))
    if form is None:
        return None
    inputs, attrs, geometry = form
    activation = attrs.get("activation", b"")
    activation = activation.decode() if isinstance(activation, bytes) else activation
    if activation not in ACTIVATIONS:
        return None
    node = make_node(proto, FUSED_CONV, inputs, proto.output, {**geometry, "activation": activation})
    return [node] if accepts(FUSED_CONV, node, ctx) else None


def _encode_attrs(node, ctx) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    type_of = getattr(ctx, "type_of", None)
    w = type_of(node.inputs[1]) if type_of is not None else None
    if w is not None and w.is_static:
        extra["kernel_shape"] = list(w.static_shape[2:])
    return {"strides": list(node.attrs["strides"]), "pads": list(node.attrs["pads"]), "group": node.attrs["group"],
            "activation": node.attrs["activation"], **extra}


FUSED_CONV = OpDef(
    name="fused_conv", onnx_types=("FusedConv",), domain=MS_DOMAIN,
    kernel_dtypes=FLOAT_KERNELS, min_inputs=2, max_inputs=3,
    attrs=(STRIDES, PADS, AttrSpec("group", 1, sample=one_of(1, 1, 2)),
           AttrSpec("activation", "Relu", tuple(ACTIVATIONS), z3="choice", sample=lambda rng, s, c, n: "Relu")),
    shape=conv_shape, kernel=_fused_conv, int_kernel=_fused_conv_int, decode=decode_fused_conv,
    encode=contrib_encoder("FusedConv", attrs_of=_encode_attrs),
    doc="ONNX Runtime's fused 2-D convolution + activation (Relu, Sigmoid or Tanh)", z3_symbol="fused_conv",
    # no "bias" role: the generator's lifts add biases to the one op that has it (conv); drawn near the shapes
    # a rule was found on, the third input still fits
    roles=("image", "kernel"), facts=conv_facts, family="convolution",
    flops=CONV.flops)

OPS = (FUSED_CONV,)
