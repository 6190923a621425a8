"""Helpers the operator files share: ONNX forms (attribute or constant input, present inputs, known shapes,
whether a decoded node's shapes are accepted), typed constants, stand-in polynomials for integer fingerprints,
and erf on an array module. Defines no operator."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops.base import (
    DecodeContext,
    EncodeContext,
    Kernel,
    OpDef,
    ShapeError,
    make_node,
    onnx_attrs,
    symbolic_shape,
)
from xflow.ops.elementwise import same_shape, simple_decoder, simple_encoder

__all__ = ["accepts", "attr_or_input", "axes_attr", "decoded", "encoder_dtype", "erf", "known_shape", "present_inputs",
           "prod", "stand_in", "typed_constant", "unary", "with_constant_inputs"]


def accepts(op: OpDef, node: Node, ctx: DecodeContext) -> bool:
    """True when every input of a decoded node of ``op`` has a static shape that its shape rule accepts."""
    shapes = [symbolic_shape(ctx, name) for name in node.inputs]
    if any(s is None for s in shapes):
        return False
    try:
        op.infer(shapes, node.attrs)  # type: ignore[arg-type]
    except ShapeError:
        return False
    return True


def known_shape(ctx: EncodeContext, name: str) -> Shape | None:
    """The static shape of a value when the encode context can tell it (its protocol does not promise to)."""
    type_of = getattr(ctx, "type_of", None)
    t = type_of(name) if type_of is not None else None
    return t.static_shape if t is not None and t.is_static else None


def present_inputs(proto: onnx.NodeProto) -> list[str] | None:
    """The node's inputs without trailing missing ("") ones; None when one in the middle is missing."""
    inputs = list(proto.input)
    while inputs and not inputs[-1]:
        inputs.pop()
    return None if "" in inputs else inputs


def stand_in(a: int, b: int) -> Kernel:
    """An integer fingerprint variant x(x² + a) + b: non-linear, so an op with no exact integer form
    (sqrt, exp, erf, ...) cannot make false equalities; distinct (a, b) per op keep ops apart."""

    def kernel(xp: Any, arrays: Sequence[Any], attrs: Attrs) -> list[Any]:
        x = arrays[0]
        return [x * (x * x + a) + b]

    return kernel


def unary(name: str, onnx_type: str, kernel: Kernel, doc: str, family: str = "activation",
          int_kernel: Kernel | None = None, **fields: Any) -> OpDef:
    """An element-wise one-input op with no attributes that maps 1:1 onto ONNX ``onnx_type``."""
    holder: list[OpDef] = []
    entry = OpDef(name=name, onnx_types=(onnx_type,), min_inputs=1, max_inputs=1, attrs=(), shape=same_shape,
                  kernel=kernel, int_kernel=int_kernel, decode=simple_decoder(lambda: holder[0], 1),
                  encode=simple_encoder(onnx_type), doc=doc, elementwise=True, z3_symbol=name, family=family,
                  **fields)
    holder.append(entry)
    return entry


def attr_or_input(proto: onnx.NodeProto, ctx: DecodeContext, attr: str, position: int) -> np.ndarray | None:
    """A parameter that ONNX moved from an attribute to an input across opsets (axes, pads, min, ...): the
    attribute when present, else the constant value of input ``position``; None when neither is known."""
    attrs = onnx_attrs(proto)
    if attr in attrs:
        return np.asarray(attrs[attr])
    if len(proto.input) > position and proto.input[position]:
        return ctx.constant_value(proto.input[position])
    return None


def axes_attr(values: Sequence[int] | np.ndarray, rank: int) -> tuple[int, ...]:
    """Axes made non-negative and sorted; ShapeError when one is out of range or repeated."""
    axes = [int(a) for a in np.asarray(values).reshape(-1)]
    if any(not -rank <= a < rank for a in axes):
        raise ShapeError(f"axes {axes} out of range for rank {rank}")
    normalized = sorted(a % rank for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ShapeError(f"axes {axes} repeat an axis")
    return tuple(normalized)


def encoder_dtype(ctx: EncodeContext, name: str) -> np.dtype:
    """The numpy element type of a value being written, when the context can tell it (float32 otherwise)."""
    type_of = getattr(ctx, "type_of", None)
    t = type_of(name) if type_of is not None else None
    return t.np_dtype if t is not None else np.dtype(np.float32)


def typed_constant(ctx: EncodeContext, value: Any, like: str, hint: str) -> str:
    """A constant holding ``value`` in the element type of value ``like`` (ONNX ties them: Clip's min)."""
    return ctx.add_constant(np.asarray(value, dtype=encoder_dtype(ctx, like)), hint)


def with_constant_inputs(onnx_type: str, constants: Callable[[Node], Sequence[tuple[Any, str | None]]],
                         **attrs_of: Callable[[Node], Any]) -> Callable[[Node, EncodeContext], list[onnx.NodeProto]]:
    """An encoder writing ``onnx_type`` on the node's inputs followed by constants: ``constants(node)`` gives
    (value, like) pairs, ``like`` naming the value whose element type the constant takes (None: int64)."""

    def encode(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
        name = node.name or ctx.fresh_name(onnx_type)
        extra = []
        for k, (value, like) in enumerate(constants(node)):
            if like is None:
                extra.append(ctx.add_constant(np.asarray(value, dtype=np.int64), f"{name}_in{k}"))
            else:
                extra.append(typed_constant(ctx, value, like, f"{name}_in{k}"))
        attrs = {k: f(node) for k, f in attrs_of.items()}
        return [onnx.helper.make_node(onnx_type, [*node.inputs, *extra], list(node.outputs), name=name, **attrs)]

    return encode


def decoded(proto: onnx.NodeProto, op: OpDef, inputs: Sequence[str], attrs: dict[str, Any]) -> list[Node] | None:
    """The one-node decoding of ``proto`` as ``op``, or None when the attributes are outside its domain."""
    try:
        return [make_node(proto, op, inputs, proto.output[:1], attrs)]
    except ShapeError:
        return None


def erf(xp: Any, x: Any) -> Any:
    """The error function elementwise, exact to the dtype: math.erf on numpy, cupyx's kernel on cupy."""
    if xp is np:
        x = np.asarray(x)
        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype) if x.size else x.copy()
    from cupyx.scipy.special import erf as cupy_erf  # only reached with cupy as xp

    return cupy_erf(x)


def prod(dims: Sequence[Any]) -> Any:
    """The product of some dims (ints now; it only multiplies, so symbolic dims can replace them)."""
    out: Any = 1
    for d in dims:
        out = out * d
    return out
