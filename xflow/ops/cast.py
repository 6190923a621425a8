"""Element type conversion (ONNX ``Cast``) to a float type or bool; casts to integers stay opaque."""

from __future__ import annotations

import onnx

from xflow.ir import Node
from xflow.ops._forms import decoded
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, one_of, onnx_attrs
from xflow.ops.elementwise import same_shape

TensorProto = onnx.TensorProto
#: target types with a numpy twin (bfloat16 has none)
TARGETS = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL)


def _cast(xp, a, attrs):
    return [a[0].astype(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"]))]


def _cast_int(xp, a, attrs):
    # fingerprints stay in wrap-around integers: a cast between the types they stand for is the identity
    return [a[0]]


def decode_cast(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Cast to one of ``TARGETS`` from a numeric or bool tensor (the default saturate only)."""
    attrs = onnx_attrs(proto)
    source = ctx.type_of(proto.input[0])
    if source is None or source.dtype in (TensorProto.STRING, TensorProto.BFLOAT16) or set(attrs) - {"to"}:
        return None
    return decoded(proto, CAST, proto.input, {"to": int(attrs["to"])})


def encode_cast(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Cast."""
    return [onnx.helper.make_node("Cast", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("Cast"), to=int(node.attrs["to"]))]


CAST = OpDef(
    name="cast", onnx_types=("Cast",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("to", choices=TARGETS, sample=one_of(TensorProto.FLOAT, TensorProto.DOUBLE)),),
    shape=same_shape, kernel=_cast, int_kernel=_cast_int, decode=decode_cast, encode=encode_cast,
    doc="convert the element type", elementwise=True, z3_symbol="cast", family="elementwise",
    out_dtype=lambda dtypes, attrs: attrs["to"])

OPS = (CAST,)
