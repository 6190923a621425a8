"""Element-wise operators: ewadd, ewmul, scalar mul, relu, sigmoid, tanh, identity."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ir.dims import NotBroadcastable, broadcast
from xflow.ops.base import DecodeContext, EncodeContext, Menu, OpDef, ShapeError, make_node, symbolic_shape


def broadcast_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Numpy/ONNX multidirectional broadcasting."""
    try:
        return [broadcast(*shapes)]
    except NotBroadcastable as exc:
        raise ShapeError(f"shapes {list(shapes)} do not broadcast") from exc


def same_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Unary ops keep their input's shape."""
    return [tuple(shapes[0])]


def scalar_mul_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """smul(x, s): s must hold exactly one element and rank <= 1, and not outrank x (ONNX's Mul of a rank-0 x
    and a one-element vector is a vector: smul keeps x's shape, so that case is not an smul)."""
    s = shapes[1]
    if len(s) > 1 or int(np.prod(s, dtype=np.int64)) != 1:
        raise ShapeError(f"smul: scalar operand must have one element and rank <= 1, got {s}")
    if len(s) > len(shapes[0]):
        raise ShapeError(f"smul: scalar operand {s} outranks the tensor {tuple(shapes[0])}")
    return [tuple(shapes[0])]


def simple_encoder(onnx_type: str):
    """An encoder that writes one ONNX node of this type with the same inputs and outputs."""

    def encode(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
        return [onnx.helper.make_node(onnx_type, list(node.inputs), list(node.outputs),
                                      name=node.name or ctx.fresh_name(onnx_type))]

    return encode


def simple_decoder(op: Callable[[], OpDef], arity: int):
    """A decoder for ONNX nodes that map 1:1 with no attributes onto the op ``op()`` returns (a thunk, so a
    decoder can be written before its OpDef)."""

    def decode(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
        if len(proto.input) != arity or len(proto.output) != 1 or proto.attribute:
            return None
        return [make_node(proto, op(), proto.input, proto.output)]

    return decode


def decode_mul(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Mul by a one-element operand of rank <= 1 is a scalar mul; otherwise an element-wise mul."""
    if len(proto.input) != 2 or len(proto.output) != 1:
        return None
    shapes = [symbolic_shape(ctx, name) for name in proto.input]
    if shapes[0] is None or shapes[1] is None:
        return None
    for big, small in ((0, 1), (1, 0)):
        s = shapes[small]
        if len(s) <= 1 and int(np.prod(s, dtype=np.int64)) == 1 and len(shapes[big]) >= len(s):
            return [make_node(proto, SMUL, [proto.input[big], proto.input[small]], proto.output)]
    return [make_node(proto, MUL, proto.input, proto.output)]


def encode_smul(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """smul is ONNX Mul with the scalar second."""
    return simple_encoder("Mul")(node, ctx)


def _relu(xp, a, attrs):
    return [xp.maximum(a[0], 0)]


def _relu_int(xp, a, attrs):
    # TASO's trick: a non-linear polynomial so relu cannot create false equalities over integers.
    x = a[0]
    return [x * (x + 1) + 1]


def _sigmoid(xp, a, attrs):
    return [1.0 / (1.0 + xp.exp(-a[0]))]


def _sigmoid_int(xp, a, attrs):
    x = a[0]
    return [x * (x * x + 3) + 7]


def _tanh(xp, a, attrs):
    return [xp.tanh(a[0])]


def _tanh_int(xp, a, attrs):
    x = a[0]
    return [x * (x * x + 5) + 11]


ADD = OpDef(
    name="add", onnx_types=("Add",), min_inputs=2, max_inputs=2, attrs=(), shape=broadcast_shape,
    kernel=lambda xp, a, attrs: [a[0] + a[1]], decode=simple_decoder(lambda: ADD, 2), encode=simple_encoder("Add"),
    doc="ewadd: element-wise addition with broadcasting", commutative=True, associative=True,
    elementwise=True, linear=True, z3_symbol="ewadd", menu=Menu(arity=2, same_shapes=True), family="elementwise")

MUL = OpDef(
    name="mul", onnx_types=("Mul",), min_inputs=2, max_inputs=2, attrs=(), shape=broadcast_shape,
    kernel=lambda xp, a, attrs: [a[0] * a[1]], decode=decode_mul, encode=simple_encoder("Mul"),
    doc="ewmul: element-wise multiplication with broadcasting", commutative=True, associative=True,
    elementwise=True, z3_symbol="ewmul", menu=Menu(arity=2, same_shapes=True), family="elementwise")

SMUL = OpDef(
    name="smul", onnx_types=("Mul",), min_inputs=2, max_inputs=2, attrs=(), shape=scalar_mul_shape,
    kernel=lambda xp, a, attrs: [a[0] * a[1].reshape(())], decode=None, encode=encode_smul,
    doc="scalar mul: x times a one-element tensor", elementwise=True, linear=True, z3_symbol="smul",
    roles=("any", "scalar"),
    menu=Menu(arity=2), family="elementwise", same_dtype_inputs=False)

RELU = OpDef(
    name="relu", onnx_types=("Relu",), min_inputs=1, max_inputs=1, attrs=(), shape=same_shape,
    kernel=_relu, int_kernel=_relu_int, decode=simple_decoder(lambda: RELU, 1), encode=simple_encoder("Relu"),
    doc="relu", elementwise=True, z3_symbol="relu", menu=Menu(), family="activation")

SIGMOID = OpDef(
    name="sigmoid", onnx_types=("Sigmoid",), min_inputs=1, max_inputs=1, attrs=(), shape=same_shape,
    kernel=_sigmoid, int_kernel=_sigmoid_int, decode=simple_decoder(lambda: SIGMOID, 1),
    encode=simple_encoder("Sigmoid"), doc="logistic sigmoid", elementwise=True, z3_symbol="sigmoid",
    family="activation")

TANH = OpDef(
    name="tanh", onnx_types=("Tanh",), min_inputs=1, max_inputs=1, attrs=(), shape=same_shape,
    kernel=_tanh, int_kernel=_tanh_int, decode=simple_decoder(lambda: TANH, 1), encode=simple_encoder("Tanh"),
    doc="hyperbolic tangent", elementwise=True, z3_symbol="tanh", family="activation")

IDENTITY = OpDef(
    name="identity", onnx_types=("Identity",), min_inputs=1, max_inputs=1, attrs=(), shape=same_shape,
    kernel=lambda xp, a, attrs: [a[0]], decode=simple_decoder(lambda: IDENTITY, 1),
    encode=simple_encoder("Identity"), doc="identity", elementwise=True, linear=True, z3_symbol="identity",
    forwards_input=True)

OPS = (ADD, MUL, SMUL, RELU, SIGMOID, TANH, IDENTITY)
