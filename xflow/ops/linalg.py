"""Linear algebra: batched matmul, transpose, and Gemm decoded into the algebra."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Origin, Shape
from xflow.ir.dims import NotBroadcastable, broadcast
from xflow.ops.base import (
    AttrSpec,
    DecodeContext,
    EncodeContext,
    Menu,
    OpDef,
    ShapeError,
    ShapeFacts,
    make_node,
    onnx_attrs,
    symbolic_shape,
)
from xflow.ops.elementwise import ADD, SMUL, simple_decoder, simple_encoder


def matmul_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """numpy.matmul over rank >= 2 operands with broadcast batch dims."""
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul: operands must have rank >= 2, got {a} and {b}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul: inner dims differ: {a} @ {b}")
    try:
        batch = broadcast(a[:-2], b[:-2])
    except NotBroadcastable as exc:
        raise ShapeError(f"matmul: batch dims of {a} and {b} do not broadcast") from exc
    return [batch + (a[-2], b[-1])]


def matmul_fit(shapes: Sequence[Shape], attrs: Attrs, free: frozenset[int]) -> list[Shape] | None:
    """A free operand's inner dim fitted to the other's."""
    a, b = tuple(shapes[0]), tuple(shapes[1])
    if len(a) < 2 or len(b) < 2:
        return None
    if 1 in free:
        return [a, b[:-2] + (a[-1], b[-1])]
    if 0 in free:
        return [a[:-1] + (b[-2],), b]
    return None


def _matmul(xp, a, attrs):
    return [xp.matmul(a[0], a[1])]


def decode_matmul(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """MatMul with rank >= 2 operands (1-D MatMul stays opaque)."""
    shapes = [symbolic_shape(ctx, n) for n in proto.input]
    if len(shapes) != 2 or any(s is None or len(s) < 2 for s in shapes):
        return None
    return simple_decoder(lambda: MATMUL, 2)(proto, ctx)


def matmul_weight_axis(out_rank: int, weight_rank: int, axis: int) -> int | None:
    """The axis of matmul's second operand whose blocks give the output's blocks along ``axis``: the
    output's last axis is the weight's columns, so ``split(a @ W)`` there is ``a @ split(W)`` piece by
    piece (and a permutation of those pieces is ``a`` times W with its column blocks permuted); None
    for the other axes."""
    return weight_rank - 1 if axis == out_rank - 1 else None


def matmul_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """Both operands have rank >= 2, and the first's columns are the second's rows."""
    return [f.rank(args[0]) >= 2, f.rank(args[1]) >= 2, f.dim(args[0], -1) == f.dim(args[1], -2)]


def transpose_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """A transpose's input has as many dims as its permutation has entries."""
    perm = attrs["perm"]
    return [] if f.symbolic(perm) else [f.rank(args[0]) == len(perm)]


def transpose_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Permute dims by ``perm``."""
    (x,) = shapes
    perm = attrs["perm"]
    if sorted(perm) != list(range(len(x))):
        raise ShapeError(f"transpose: perm {perm} is not a permutation of rank {len(x)}")
    return [tuple(x[p] for p in perm)]


def _sample_perm(rng: np.random.Generator, shapes: Sequence[Shape], chosen: Mapping[str, Any], n_out: int) -> Any:
    return tuple(int(p) for p in rng.permutation(len(shapes[0]) if shapes else 0))


def decode_transpose(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Transpose, with the default (reversed) perm made explicit."""
    shape = symbolic_shape(ctx, proto.input[0])
    if shape is None:
        return None
    perm = onnx_attrs(proto).get("perm", list(reversed(range(len(shape)))))
    return [make_node(proto, TRANSPOSE, proto.input, proto.output, {"perm": tuple(perm)})]


def encode_transpose(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Transpose with an explicit perm (none for a scalar: an attribute cannot be an empty list, and the
    default, reversed, perm of no dims is the empty one)."""
    perm = list(node.attrs["perm"])
    return [onnx.helper.make_node("Transpose", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("Transpose"), **({"perm": perm} if perm else {}))]


def decode_gemm(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Gemm(A, B, C) = alpha * op(A) @ op(B) + beta * C, as transpose / matmul / smul / add nodes."""
    attrs = onnx_attrs(proto)
    shapes = [symbolic_shape(ctx, n) if n else None for n in proto.input]
    if len(proto.input) < 2 or shapes[0] is None or shapes[1] is None:
        return None
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    dtype = ctx.type_of(proto.input[0]).np_dtype  # type: ignore[union-attr]
    nodes: list[Node] = []

    def operand(index: int, transposed: bool) -> str:
        name = proto.input[index]
        if not transposed:
            return name
        out = ctx.fresh_name(f"{name}_T")
        nodes.append(make_node(proto.name, TRANSPOSE, [name], [out], {"perm": (1, 0)}))
        return out

    a = operand(0, bool(attrs.get("transA", 0)))
    b = operand(1, bool(attrs.get("transB", 0)))
    has_c = len(proto.input) > 2 and proto.input[2] != "" and beta != 0.0
    out = proto.output[0]
    product = ctx.fresh_name(f"{out}_mm") if (alpha != 1.0 or has_c) else out
    nodes.append(make_node(proto.name, MATMUL, [a, b], [product]))
    if alpha != 1.0:
        scaled = ctx.fresh_name(f"{out}_alpha") if has_c else out
        alpha_name = ctx.add_constant(np.array(alpha, dtype=dtype), "alpha")
        nodes.append(make_node(proto.name, SMUL, [product, alpha_name], [scaled]))
        product = scaled
    if has_c:
        c = proto.input[2]
        if beta != 1.0:
            c_scaled = ctx.fresh_name(f"{c}_beta")
            beta_name = ctx.add_constant(np.array(beta, dtype=dtype), "beta")
            nodes.append(make_node(proto.name, SMUL, [c, beta_name], [c_scaled]))
            c = c_scaled
        nodes.append(make_node(proto.name, ADD, [product, c], [out]))
    origin = Origin(proto, len(nodes))
    return [Node(n.op, n.inputs, n.outputs, n.attrs, n.name, origin) for n in nodes]


def _matmul_terms(args: Sequence[np.ndarray], attrs: Attrs, shapes: Sequence[Shape], tag: Any) -> list[np.ndarray]:
    """A matmul's element is one term of its row of the left operand and its column of the right (``TermRule``):
    (..., m, k) @ (k, n) with a static k only."""
    x, w = args
    if x.ndim < 2 or w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError("a matmul of other ranks than (..., m, k) @ (k, n)")
    if shapes[1] is None or not isinstance(shapes[1][0], int):
        raise ValueError("a matmul's contracted axis is a symbolic dim")
    rows = np.empty(x.shape[:-1], dtype=object)
    for index in np.ndindex(*x.shape[:-1]):
        rows[index] = tuple(x[index])
    cols = np.empty(w.shape[1], dtype=object)
    for j in range(w.shape[1]):
        cols[j] = tuple(w[:, j])
    return [np.frompyfunc(lambda r, c: (tag, r, c), 2, 1)(rows[..., None], cols)]


MATMUL = OpDef(
    name="matmul", onnx_types=("MatMul", "Gemm"), min_inputs=2, max_inputs=2, attrs=(), shape=matmul_shape,
    kernel=_matmul, decode=decode_matmul, encode=simple_encoder("MatMul"),
    flops=lambda ins, outs, attrs: 2 * int(np.prod(outs[0], dtype=np.int64)) * ins[0][-1],
    doc="batched matrix multiply (numpy.matmul semantics, rank >= 2)", z3_symbol="matmul",
    roles=("matrix", "matrix"),
    facts=matmul_facts, menu=Menu(arity=2), family="matrix", fit=matmul_fit, terms=_matmul_terms)

TRANSPOSE = OpDef(
    name="transpose", onnx_types=("Transpose",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("perm", z3="code", sample=_sample_perm),),
    shape=transpose_shape, kernel=lambda xp, a, attrs: [xp.transpose(a[0], attrs["perm"])],
    decode=decode_transpose, encode=encode_transpose, doc="permute dimensions", z3_symbol="transpose",
    roles=("matrix",), facts=transpose_facts, menu=Menu(({"perm": (1, 0)},)), family="layout")

OPS = (MATMUL, TRANSPOSE)
DECODERS = {"Gemm": decode_gemm}
