"""Hard sigmoid max(0, min(1, alpha x + beta)) and hard swish x hardsigmoid(x) with alpha 1/6, beta 1/2
(ONNX ``HardSigmoid``, ``HardSwish``)."""

from __future__ import annotations

import onnx

from xflow.ir import Node
from xflow.ops._forms import decoded, stand_in, unary
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, one_of, onnx_attrs
from xflow.ops.elementwise import same_shape
from xflow.ops.norm import canonical_float


def _hardsigmoid(xp, a, attrs):
    x = a[0]
    t = x.dtype.type
    return [xp.clip(t(attrs["alpha"]) * x + t(attrs["beta"]), t(0), t(1))]


def _hardswish(xp, a, attrs):
    x = a[0]
    return [x * _hardsigmoid(xp, a, {"alpha": 1 / 6, "beta": 0.5})[0]]


def decode_hardsigmoid(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """HardSigmoid with its alpha and beta (defaults 0.2 and 0.5)."""
    attrs = onnx_attrs(proto)
    return decoded(proto, HARDSIGMOID, proto.input, {"alpha": canonical_float(attrs.get("alpha", 0.2)),
                                                     "beta": canonical_float(attrs.get("beta", 0.5))})


def encode_hardsigmoid(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX HardSigmoid."""
    return [onnx.helper.make_node("HardSigmoid", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("HardSigmoid"), alpha=float(node.attrs["alpha"]),
                                  beta=float(node.attrs["beta"]))]


HARDSIGMOID = OpDef(
    name="hardsigmoid", onnx_types=("HardSigmoid",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("alpha", 0.2, z3="float", sample=one_of(0.2, canonical_float(1 / 6))),
           AttrSpec("beta", 0.5, z3="float", sample=one_of(0.5))),
    shape=same_shape, kernel=_hardsigmoid, int_kernel=stand_in(71, 73), decode=decode_hardsigmoid,
    encode=encode_hardsigmoid, doc="max(0, min(1, alpha x + beta))", elementwise=True, z3_symbol="hardsigmoid",
    family="activation")

HARDSWISH = unary("hardswish", "HardSwish", _hardswish, "x hardsigmoid(x) with alpha 1/6, beta 1/2",
                  int_kernel=stand_in(79, 83))

OPS = (HARDSIGMOID, HARDSWISH)
