"""Comparisons of float tensors that make the boolean masks ``Where`` reads (ONNX ``Equal``, ``Less``,
``Greater``, ``LessOrEqual``, ``GreaterOrEqual``), one op each, with broadcasting."""

from __future__ import annotations

import onnx

from xflow.ir import FLOAT_DTYPES, Node
from xflow.ops._forms import stand_in
from xflow.ops.base import DecodeContext, Kernel, OpDef, make_node
from xflow.ops.elementwise import broadcast_shape, simple_encoder


def _comparison(name: str, onnx_type: str, fn: str, doc: str, int_kernel: Kernel) -> OpDef:
    holder: list[OpDef] = []

    def decode(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
        types = [ctx.type_of(i) for i in proto.input]
        if len(types) != 2 or len(proto.output) != 1 or any(t is None or t.dtype not in FLOAT_DTYPES for t in types):
            return None  # integer comparisons belong to shape computations
        return [make_node(proto, holder[0], proto.input, proto.output)]

    entry = OpDef(
        name=name, onnx_types=(onnx_type,), min_inputs=2, max_inputs=2, attrs=(), shape=broadcast_shape,
        kernel=lambda xp, a, attrs: [getattr(xp, fn)(a[0], a[1])], int_kernel=int_kernel,
        decode=decode, encode=simple_encoder(onnx_type),
        doc=doc, elementwise=True, z3_symbol=name, family="elementwise",
        out_dtype=lambda dtypes, attrs: onnx.TensorProto.BOOL)
    holder.append(entry)
    return entry


def _of_difference(a: int, b: int, swap: bool = False) -> Kernel:
    """An integer stand-in for a comparison: a polynomial in x - y (y - x when ``swap``), so x < y and
    y > x share fingerprints while different comparisons do not."""
    poly = stand_in(a, b)
    return lambda xp, arrays, attrs: poly(xp, [arrays[1] - arrays[0] if swap else arrays[0] - arrays[1]], attrs)


def _equal_int(xp, a, attrs):
    d = a[0] - a[1]
    return [d * d * (d * d + 101) + 103]  # even in x - y: equality is symmetric


EQUAL = _comparison("equal", "Equal", "equal", "x == y, elementwise, as a bool mask", _equal_int)
LESS = _comparison("less", "Less", "less", "x < y, elementwise, as a bool mask", _of_difference(107, 109))
GREATER = _comparison("greater", "Greater", "greater", "x > y, elementwise, as a bool mask",
                      _of_difference(107, 109, swap=True))
LESS_EQUAL = _comparison("less_equal", "LessOrEqual", "less_equal", "x <= y, elementwise, as a bool mask",
                         _of_difference(113, 127))
GREATER_EQUAL = _comparison("greater_equal", "GreaterOrEqual", "greater_equal", "x >= y, elementwise, as a bool mask",
                            _of_difference(113, 127, swap=True))

OPS = (EQUAL, LESS, GREATER, LESS_EQUAL, GREATER_EQUAL)
