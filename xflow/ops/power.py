"""Power with a constant scalar exponent (ONNX ``Pow`` whose exponent is a one-element constant): x ** e.

A tensor exponent stays opaque (the op's meaning is per exponent: x², x³ and sqrt are other functions)."""

from __future__ import annotations

import onnx

from xflow.ir import Node
from xflow.ops._forms import decoded, stand_in, with_constant_inputs
from xflow.ops.base import AttrSpec, DecodeContext, Menu, OpDef, one_of, symbolic_shape
from xflow.ops.elementwise import same_shape
from xflow.ops.norm import canonical_float

_OTHER_EXPONENT = stand_in(53, 59)

def _pow(xp, a, attrs):
    x = a[0]
    return [x ** x.dtype.type(attrs["exponent"])]

def _pow_int(xp, a, attrs):
    # small non-negative integer exponents are exact over integers; any other stands in as a polynomial
    e = attrs["exponent"]
    if float(e).is_integer() and 0 <= e <= 4:
        return [a[0] ** int(e)]
    return _OTHER_EXPONENT(xp, a, attrs)

def decode_pow(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Pow whose exponent is a constant with one element and no more dims than the base."""
    if len(proto.input) != 2 or len(proto.output) != 1:
        return None
    base, exponent = symbolic_shape(ctx, proto.input[0]), ctx.constant_value(proto.input[1])
    if base is None or exponent is None or exponent.size != 1 or exponent.ndim > len(base):
        return None
    if exponent.dtype.kind != "f":  # an integer exponent tensor: its type is part of the ONNX node
        return None
    return decoded(proto, POW, proto.input[:1], {"exponent": canonical_float(float(exponent.reshape(())))})

POW = OpDef(
    name="pow", onnx_types=("Pow",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("exponent", z3="float", sample=one_of(2.0, 3.0, 0.5)),), shape=same_shape,
    kernel=_pow, int_kernel=_pow_int, decode=decode_pow,
    encode=with_constant_inputs("Pow", lambda n: [(n.attrs["exponent"], n.inputs[0])]),
    doc="x to a constant power", elementwise=True, z3_symbol="pow", family="elementwise",
    # the square of RMS norms (the one exponent the axioms relate to other ops)
    menu=Menu(({"exponent": 2.0},), activations_only=True))

OPS = (POW,)
