"""Element-wise subtraction (ONNX ``Sub``) with broadcasting, as ewadd and ewmul have it.

The whole operator lives here; the registry finds it by discovery, and its axioms are in
``verifier/axioms.py`` beside the other ops'.
"""

from __future__ import annotations

from xflow.ops.base import Menu, OpDef
from xflow.ops.elementwise import broadcast_shape, simple_decoder, simple_encoder

SUB = OpDef(
    name="sub", onnx_types=("Sub",), min_inputs=2, max_inputs=2, attrs=(), shape=broadcast_shape,
    kernel=lambda xp, a, attrs: [a[0] - a[1]], decode=simple_decoder(lambda: SUB, 2), encode=simple_encoder("Sub"),
    doc="ewsub: element-wise subtraction with broadcasting (wrap-around over integers)", elementwise=True,
    linear=True, constant_on_equal_inputs=True, z3_symbol="ewsub",
    menu=Menu(arity=2, same_shapes=True), family="elementwise")

OPS = (SUB,)
