"""MultiHeadAttention (ONNX Runtime contrib, ``com.microsoft``): softmax(Q Kᵀ · scale) V per head, on query
(B, S, H·D), key (B, L, H·D) and value (B, L, H·Dv), the heads split from and merged back into the last dim.

Only the plain form is decoded: exactly those three inputs, each of rank 3 (a bias, key padding mask, attention
bias or past key/value, or the packed rank-4/5 layouts, stay opaque), only the first output used, ``unidirectional``
0 (its default: accepted, not written back). A node setting ``mask_filter_value`` stays opaque: the value means
nothing without a mask, but decoding it would drop it from the node written back. ``scale`` is stored as given,
0 (ONNX Runtime's default, also when absent) meaning 1/sqrt(D), which the kernel resolves from the query's last
dim: the encoder writes back what was read without needing shapes (an explicit 0 goes back absent, the same).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ir.dims import divides, equal, is_static
from xflow.ops._contrib import MS_DOMAIN, contrib_decoder, contrib_encoder, float_attr, scale_stand_in
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, one_of, pick, symbolic_shape
from xflow.ops.linalg import MATMUL
from xflow.ops.softmax import SOFTMAX

#: the head axes: (B, T, H, D) -> (B, H, T, D), and for the key straight to its transpose (B, H, D, T)
_TO_HEADS, _TO_HEADS_T = (0, 2, 1, 3), (0, 2, 3, 1)
_LAST_AXIS = SOFTMAX.normalize_attrs({"axis": 3})


def attention_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """(B, S, Ev) for query (B, S, E), key (B, L, E), value (B, L, Ev), E and Ev multiples of the heads."""
    q, k, v = (tuple(s) for s in shapes)
    heads = attrs["num_heads"]
    if heads < 1:
        raise ShapeError(f"mha: num_heads {heads} is not positive")
    if not len(q) == len(k) == len(v) == 3:
        raise ShapeError(f"mha: query, key and value must have rank 3, got {q}, {k}, {v}")
    if not (equal(q[0], k[0]) and equal(k[0], v[0])):
        raise ShapeError(f"mha: batch dims of {q}, {k}, {v} differ")
    if not equal(k[1], v[1]):
        raise ShapeError(f"mha: key length {k[1]} differs from value length {v[1]}")
    if not equal(q[2], k[2]):
        raise ShapeError(f"mha: query hidden size {q[2]} differs from key hidden size {k[2]}")
    if not (divides(heads, q[2]) and divides(heads, v[2])):
        raise ShapeError(f"mha: hidden sizes {q[2]} and {v[2]} are not multiples of {heads} heads")
    return [(q[0], q[1], v[2])]


def attention_fit(shapes: Sequence[Shape], attrs: Attrs, free: frozenset[int]) -> list[Shape] | None:
    """The free inputs fitted to the fixed ones: one batch, the key's length the value's, the query's hidden size
    the key's; a free input's own dims are kept where nothing fixes them (hidden sizes made multiples of the
    heads)."""
    heads = attrs["num_heads"]
    drawn = [tuple(s) if len(s) == 3 and all(is_static(d) for d in s) else None for s in shapes]
    if heads < 1 or any(drawn[i] is None for i in range(3) if i not in free):
        return None

    def first(*places: tuple[int, int]) -> int:  # the dim at the first fixed place, else at the first drawn one
        for fixed_only in (True, False):
            for i, axis in places:
                if (shape := drawn[i]) is not None and (i not in free or not fixed_only):
                    return int(shape[axis])
        return heads

    def multiple(d: int) -> int:
        return d if d % heads == 0 else heads * max(1, d // heads)

    batch, length = first((0, 0), (1, 0), (2, 0)), first((1, 1), (2, 1))
    hidden = multiple(first((0, 2), (1, 2)))
    fitted = [(batch, first((0, 1)), hidden), (batch, length, hidden), (batch, length, multiple(first((2, 2))))]
    return [fitted[i] if i in free else tuple(shapes[i]) for i in range(3)]


def resolved_scale(attrs: Mapping[str, Any], hidden: int) -> float:
    """The scale the scores are multiplied by: the attribute, or ONNX Runtime's default 1/sqrt(D) where it is 0
    (D the head size of a query of ``hidden`` = H·D)."""
    return attrs["scale"] or 1.0 / math.sqrt(hidden // attrs["num_heads"])


def _heads(xp: Any, x: Any, heads: int, perm: tuple[int, ...]) -> Any:
    batch, length, hidden = x.shape
    return xp.transpose(xp.reshape(x, (batch, length, heads, hidden // heads)), perm)


def attention_kernel(integer: bool = False):  # noqa: ANN201 - a Kernel
    """The decomposition's kernel: heads split, Q Kᵀ (the table's matmul) times the scale, softmax over the
    keys (the table's softmax, in float32 at least), times V, heads merged. With ``integer`` the fingerprint
    variant: the steps' integer variants, the scale exact where it is 1 and a distinct integer otherwise (as
    fused_matmul's alpha)."""
    matmul = MATMUL.evaluate_int if integer else MATMUL.evaluate
    softmax = SOFTMAX.evaluate_int if integer else SOFTMAX.evaluate

    def kernel(xp: Any, arrays: Sequence[Any], attrs: Attrs) -> list[Any]:
        q, k, v = arrays
        heads, scale = attrs["num_heads"], resolved_scale(attrs, q.shape[-1])
        scores = matmul(xp, [_heads(xp, q, heads, _TO_HEADS), _heads(xp, k, heads, _TO_HEADS_T)], Attrs())[0]
        if scale != 1.0:
            scores = scores * (scale_stand_in(scale) if integer else scores.dtype.type(scale))
        if scores.dtype.kind == "f":  # ONNX Runtime's softmax runs in float32 for narrower types
            scores = scores.astype(xp.promote_types(scores.dtype, np.float32), copy=False)
        probs = softmax(xp, [scores], _LAST_AXIS)[0].astype(v.dtype, copy=False)
        context = matmul(xp, [probs, _heads(xp, v, heads, _TO_HEADS)], Attrs())[0]
        return [xp.reshape(xp.transpose(context, _TO_HEADS), (q.shape[0], q.shape[1], v.shape[-1]))]

    return kernel


def _read(attrs: Mapping[str, Any], proto: onnx.NodeProto, ctx: DecodeContext) -> dict[str, Any] | None:
    if int(attrs.get("unidirectional", 0)):  # a causal mask this form does not compute
        return None
    for name in proto.input:  # the packed forms: rank-4 key and value (BNSH), rank-5 packed QKV
        shape = symbolic_shape(ctx, name)
        if shape is not None and len(shape) != 3:
            return None
    heads = attrs.get("num_heads")  # required: absent, the op table refuses the node
    return {"num_heads": None if heads is None else int(heads), "scale": float_attr(attrs, "scale", 0.0)}


def _encode_attrs(node: Node, ctx: EncodeContext) -> dict[str, Any]:
    scale = node.attrs["scale"]
    return {"num_heads": node.attrs["num_heads"], **({"scale": float(scale)} if scale else {})}


def _sample_heads(rng: np.random.Generator, shapes: Sequence[Shape], chosen: Mapping[str, Any], n_out: int) -> Any:
    hidden = shapes[0][-1] if shapes and len(shapes[0]) == 3 and is_static(shapes[0][-1]) else 0
    divisors = [h for h in range(1, 5) if hidden % h == 0] if hidden else []
    return pick(rng, divisors) if divisors else None


def _flops(ins: Sequence[Shape], outs: Sequence[Shape], attrs: Attrs) -> int:
    # Q Kᵀ and P V: 2·B·H·S·L·D + 2·B·H·S·L·Dv = 2·B·S·L·(E + Ev); the softmax's few per score are left out
    (batch, seq, hidden), (_, length, _), (_, _, v_hidden) = ins
    return 2 * batch * seq * length * (hidden + v_hidden)


MHA = OpDef(
    name="mha", onnx_types=("MultiHeadAttention",), domain=MS_DOMAIN, min_inputs=3, max_inputs=3,
    attrs=(AttrSpec("num_heads", sample=_sample_heads),
           AttrSpec("scale", 0.0, z3="float", sample=one_of(0.0, 0.125))),
    shape=attention_shape, kernel=attention_kernel(), int_kernel=attention_kernel(integer=True),
    decode=contrib_decoder(lambda: MHA, (3,), ("num_heads", "scale", "unidirectional"), _read),
    encode=contrib_encoder("MultiHeadAttention", attrs_of=_encode_attrs),
    doc="ONNX Runtime's multi-head attention softmax(Q Kᵀ · scale) V on (batch, length, heads x size) Q, K, V",
    z3_symbol="mha", family="matrix", flops=_flops, fit=attention_fit)

OPS = (MHA,)
