"""Element-wise division (ONNX ``Div``) with broadcasting."""

from __future__ import annotations

from xflow.ops._forms import stand_in
from xflow.ops.base import Menu, OpDef
from xflow.ops.elementwise import broadcast_shape, simple_decoder, simple_encoder

#: the integer stand-in for 1/y (no exact integer division): div(x, y) is x times it, as over the reals, so
#: identities that only use the field's linearity (distributing over ewadd, associating with ewmul) keep
#: equal fingerprints
RECIPROCAL_STAND_IN = stand_in(19, 23)


def _div_int(xp, a, attrs):
    return [a[0] * RECIPROCAL_STAND_IN(xp, a[1:], attrs)[0]]


DIV = OpDef(
    name="div", onnx_types=("Div",), min_inputs=2, max_inputs=2, attrs=(), shape=broadcast_shape,
    kernel=lambda xp, a, attrs: [a[0] / a[1]], int_kernel=_div_int, decode=simple_decoder(lambda: DIV, 2),
    encode=simple_encoder("Div"), doc="ewdiv: element-wise division with broadcasting", elementwise=True,
    z3_symbol="ewdiv", constant_on_equal_inputs=True, family="elementwise",
    menu=Menu(arity=2, same_shapes=True, activations_only=True))

OPS = (DIV,)
