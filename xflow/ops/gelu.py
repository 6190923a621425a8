"""GELU (ONNX ``Gelu``, opset 20): x/2 (1 + erf(x / sqrt 2)), or its tanh approximation; the two are
different functions, told apart by the ``approximate`` attribute."""

from __future__ import annotations

import math

import onnx

from xflow.ir import Node
from xflow.ops._forms import decoded, erf, stand_in
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, one_of, onnx_attrs
from xflow.ops.elementwise import same_shape


def _gelu(xp, a, attrs):
    x = a[0]
    t = x.dtype.type
    if attrs["approximate"] == "tanh":
        inner = t(math.sqrt(2 / math.pi)) * (x + t(0.044715) * x * x * x)
        return [t(0.5) * x * (t(1) + xp.tanh(inner))]
    return [t(0.5) * x * (t(1) + erf(xp, x * t(1 / math.sqrt(2))))]


def decode_gelu(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Gelu (default domain, opset >= 20)."""
    if ctx.opset < 20:
        return None
    approximate = onnx_attrs(proto).get("approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    return decoded(proto, GELU, proto.input, {"approximate": approximate})


def encode_gelu(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Gelu (opset 20)."""
    return [onnx.helper.make_node("Gelu", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("Gelu"), approximate=node.attrs["approximate"])]


GELU = OpDef(
    name="gelu", onnx_types=("Gelu",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("approximate", "none", choices=("none", "tanh"), z3="choice", sample=one_of("none", "tanh")),),
    shape=same_shape, kernel=_gelu, int_kernel=stand_in(89, 97), decode=decode_gelu, encode=encode_gelu,
    doc="Gaussian error linear unit (erf form, or tanh approximation)", elementwise=True, z3_symbol="gelu",
    family="activation")

OPS = (GELU,)
