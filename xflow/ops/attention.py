"""MultiHeadAttention (ONNX Runtime contrib, ``com.microsoft``): softmax(Q Kᵀ · scale) V per head, on query
(B, S, H·D), key (B, L, H·D) and value (B, L, H·Dv), the heads split from and merged back into the last dim;
and Attention, the same with Q, K and V projected from one input by packed weights (see ``ATTENTION``).

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
from xflow.ir.dims import divides, equal, exact_quotient, is_static
from xflow.ops._contrib import FLOAT_KERNELS, MS_DOMAIN, contrib_decoder, contrib_encoder, float_attr, scale_stand_in
from xflow.ops.base import AttrSpec, DecodeContext, EncodeContext, OpDef, ShapeError, one_of, pick, symbolic_shape
from xflow.ops.elementwise import ADD
from xflow.ops.linalg import MATMUL
from xflow.ops.shape_ops import SPLIT, split_attrs
from xflow.ops.softmax import SOFTMAX

#: the head axes: (B, T, H, D) -> (B, H, T, D) (and back: it is its own inverse), and for the key straight to its
#: transpose (B, H, D, T); the verifier's definition axioms and the fusion rules' patterns read them from here
TO_HEADS, TO_HEADS_T = (0, 2, 1, 3), (0, 2, 3, 1)
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

    def first(*places: tuple[int, int]) -> int:
        return _first_dim(drawn, free, heads, places)

    batch, length = first((0, 0), (1, 0), (2, 0)), first((1, 1), (2, 1))
    hidden = _multiple(first((0, 2), (1, 2)), heads)
    fitted = [(batch, first((0, 1)), hidden), (batch, length, hidden),
              (batch, length, _multiple(first((2, 2)), heads))]
    return [fitted[i] if i in free else tuple(shapes[i]) for i in range(3)]


def _first_dim(drawn: Sequence[Shape | None], free: frozenset[int], fallback: int,
               places: Sequence[tuple[int, int]]) -> int:
    """A fit's dim: the one at the first of ``places`` (input, axis) whose input is fixed, else at the first
    drawn one, else ``fallback``."""
    for fixed_only in (True, False):
        for i, axis in places:
            shape = drawn[i]
            if shape is not None and -len(shape) <= axis < len(shape) and (i not in free or not fixed_only):
                return int(shape[axis])
    return fallback


def _multiple(d: int, heads: int) -> int:
    """``d`` made a positive multiple of ``heads`` (kept where it is one)."""
    return d if d > 0 and d % heads == 0 else heads * max(1, d // heads)


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
        scores = matmul(xp, [_heads(xp, q, heads, TO_HEADS), _heads(xp, k, heads, TO_HEADS_T)], Attrs())[0]
        if scale != 1.0:
            scores = scores * (scale_stand_in(scale) if integer else scores.dtype.type(scale))
        if scores.dtype.kind == "f":  # ONNX Runtime's softmax runs in float32 for narrower types
            scores = scores.astype(xp.promote_types(scores.dtype, np.float32), copy=False)
        probs = softmax(xp, [scores], _LAST_AXIS)[0].astype(v.dtype, copy=False)
        context = matmul(xp, [probs, _heads(xp, v, heads, TO_HEADS)], Attrs())[0]
        return [xp.reshape(xp.transpose(context, TO_HEADS), (q.shape[0], q.shape[1], v.shape[-1]))]

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
    name="mha", onnx_types=("MultiHeadAttention",), domain=MS_DOMAIN,
    kernel_dtypes=FLOAT_KERNELS, min_inputs=3, max_inputs=3,
    attrs=(AttrSpec("num_heads", sample=_sample_heads),
           AttrSpec("scale", 0.0, z3="float", sample=one_of(0.0, 0.125))),
    shape=attention_shape, kernel=attention_kernel(), int_kernel=attention_kernel(integer=True),
    decode=contrib_decoder(lambda: MHA, (3,), ("num_heads", "scale", "unidirectional"), _read),
    encode=contrib_encoder("MultiHeadAttention", attrs_of=_encode_attrs),
    doc="ONNX Runtime's multi-head attention softmax(Q Kᵀ · scale) V on (batch, length, heads x size) Q, K, V",
    z3_symbol="mha", family="matrix", flops=_flops, fit=attention_fit)


# ---- Attention: the projection packed in one weight ------------------------------------------------------------
#
# ONNX Runtime's transformer optimizer writes it for BERT-style self-attention: input (B, S, E_in), weights
# (E_in, Eq + Ek + Ev), bias (Eq + Ek + Ev); qkv = input @ weights + bias, Q, K, V its column slices of widths
# Eq, Ek, Ev (thirds unless ``qkv_hidden_sizes`` gives them, Eq = Ek), then exactly mha's softmax(Q Kᵀ · scale) V.
# Decoded only in that form: exactly those three inputs (a mask_index, past, attention bias or
# past_sequence_length stays opaque), only the first output used (a used ``present`` stays opaque), no attribute
# but num_heads, scale, qkv_hidden_sizes and unidirectional 0 (1, a causal mask, stays opaque; so do do_rotary,
# rotary_embedding_dim, mask_filter_value and past_present_share_buffer, whatever their value: decoding them
# would drop them from the node written back). ``scale`` is stored as given (0: 1/sqrt(Eq / heads), as mha's),
# ``qkv_hidden_sizes`` too (() when absent: thirds), so the encoder writes back what was read.


def qkv_sizes(columns: Any, attrs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(Eq, Ek, Ev): ``qkv_hidden_sizes``, or thirds of the weights' ``columns``; ShapeError when they do not
    add up to the columns (or the columns are no multiple of 3, for every value of the symbols)."""
    sizes = tuple(attrs["qkv_hidden_sizes"])
    if not sizes:
        third = exact_quotient(columns, 3)
        if third is None:
            raise ShapeError(f"attention: weight columns {columns} are not three equal hidden sizes")
        return third, third, third
    if len(sizes) != 3 or any(type(d) is not int or d < 1 for d in sizes):
        raise ShapeError(f"attention: qkv_hidden_sizes {sizes} is not three positive sizes")
    if not equal(sum(sizes), columns):
        raise ShapeError(f"attention: qkv_hidden_sizes {sizes} do not add up to the weight columns {columns}")
    return sizes


def packed_attention_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """(B, S, Ev) for input (B, S, E_in), weights (E_in, Eq + Ek + Ev), bias (Eq + Ek + Ev): mha's rule on the
    three projections (Eq = Ek, Eq and Ev multiples of the heads)."""
    x, w, b = (tuple(s) for s in shapes)
    if len(x) != 3 or len(w) != 2 or len(b) != 1:
        raise ShapeError(f"attention: input, weights and bias must have ranks 3, 2 and 1, got {x}, {w}, {b}")
    if not equal(w[0], x[2]):
        raise ShapeError(f"attention: weights {w} do not project the input's hidden size {x[2]}")
    if not equal(b[0], w[1]):
        raise ShapeError(f"attention: bias {b} differs from the weight columns {w[1]}")
    try:
        return attention_shape([(x[0], x[1], size) for size in qkv_sizes(w[1], attrs)], attrs)
    except ShapeError as exc:  # mha's refusal, on the projections
        raise ShapeError(f"attention: {exc}") from None


def packed_attention_fit(shapes: Sequence[Shape], attrs: Attrs, free: frozenset[int]) -> list[Shape] | None:
    """The free inputs fitted to the fixed ones: the weights' rows the input's hidden size (or it theirs), the
    bias the weights' columns (or they its); columns from ``qkv_hidden_sizes``, else thirds made multiples of the
    heads. A free input keeps its own dims where nothing fixes them."""
    heads = attrs["num_heads"]
    drawn = [tuple(s) if all(is_static(d) for d in s) else None for s in shapes]
    if heads < 1 or any(drawn[i] is None for i in range(3) if i not in free):
        return None
    x = drawn[0] or ()
    batch, seq = (x[0], x[1]) if len(x) >= 3 else (1, 1, *x)[-3:-1]  # a free input of another rank made rank 3
    rows = _first_dim(drawn, free, heads, ((1, 0), (0, -1)))
    sizes = attrs["qkv_hidden_sizes"]
    columns = sum(sizes) or 3 * _multiple(_first_dim(drawn, free, 3 * heads, ((1, 1), (2, 0))) // 3, heads)
    fitted = [(batch, seq, rows), (rows, columns), (columns,)]
    return [fitted[i] if i in free else tuple(shapes[i]) for i in range(3)]


def packed_attention_kernel(integer: bool = False):  # noqa: ANN201 - a Kernel
    """The decomposition's kernel: input @ weights + bias (the table's matmul and add), split along the last
    axis into Q, K and V (the table's split), then mha's kernel. With ``integer`` the steps' integer variants."""
    matmul = MATMUL.evaluate_int if integer else MATMUL.evaluate
    add = ADD.evaluate_int if integer else ADD.evaluate
    split = SPLIT.evaluate_int if integer else SPLIT.evaluate
    attend = attention_kernel(integer)

    def kernel(xp: Any, arrays: Sequence[Any], attrs: Attrs) -> list[Any]:
        x, w, b = arrays
        qkv = add(xp, [matmul(xp, [x, w], Attrs())[0], b], Attrs())[0]
        pieces = split(xp, [qkv], split_attrs(2, qkv_sizes(w.shape[1], attrs)))
        return attend(xp, pieces, attrs)  # mha's kernel reads num_heads and scale only

    return kernel


def _read_packed(attrs: Mapping[str, Any], proto: onnx.NodeProto, ctx: DecodeContext) -> dict[str, Any] | None:
    if int(attrs.get("unidirectional", 0)):  # a causal mask this form does not compute
        return None
    shape = symbolic_shape(ctx, proto.input[0])
    if shape is not None and len(shape) != 3:  # ORT takes (B, S, E_in) only
        return None
    sizes = tuple(int(d) for d in attrs.get("qkv_hidden_sizes", ()))
    if "qkv_hidden_sizes" in attrs and len(sizes) != 3:  # an empty list would go back absent: not what was read
        return None
    heads = attrs.get("num_heads")  # required: absent, the op table refuses the node
    return {"num_heads": None if heads is None else int(heads), "scale": float_attr(attrs, "scale", 0.0),
            "qkv_hidden_sizes": sizes}


def _encode_packed_attrs(node: Node, ctx: EncodeContext) -> dict[str, Any]:
    sizes = node.attrs["qkv_hidden_sizes"]
    return {**_encode_attrs(node, ctx), **({"qkv_hidden_sizes": list(sizes)} if sizes else {})}


def _sample_packed_heads(rng: np.random.Generator, shapes: Sequence[Shape], chosen: Mapping[str, Any],
                         n_out: int) -> Any:
    # heads dividing a third of the weights' columns where they are drawn so; otherwise the fit makes them fit
    w = tuple(shapes[1]) if len(shapes) > 1 else ()
    if len(w) == 2 and is_static(w[1]) and int(w[1]) % 3 == 0 and int(w[1]):
        return pick(rng, [h for h in range(1, 5) if (int(w[1]) // 3) % h == 0])
    return pick(rng, (1, 2, 3, 4))


def _sample_sizes(rng: np.random.Generator, shapes: Sequence[Shape], chosen: Mapping[str, Any], n_out: int) -> Any:
    # thirds half the time; else Eq = Ek and another Ev, multiples of the heads
    heads = chosen.get("num_heads") or 1
    if rng.random() < 0.5:
        return ()
    size, v_size = (heads * int(d) for d in rng.integers(1, 4, size=2))
    return (size, size, v_size)


def _packed_flops(ins: Sequence[Shape], outs: Sequence[Shape], attrs: Attrs) -> int:
    # the projection's 2·B·S·E_in·(Eq + Ek + Ev), then mha's on its slices; the bias's adds are left out
    (batch, seq, hidden), (_, columns), _ = ins
    projected = [(batch, seq, size) for size in qkv_sizes(columns, attrs)]
    return 2 * batch * seq * hidden * columns + _flops(projected, outs, attrs)


ATTENTION = OpDef(
    name="attention", onnx_types=("Attention",), domain=MS_DOMAIN,
    kernel_dtypes=FLOAT_KERNELS, min_inputs=3, max_inputs=3,
    attrs=(AttrSpec("num_heads", sample=_sample_packed_heads),
           AttrSpec("scale", 0.0, z3="float", sample=one_of(0.0, 0.125)),
           AttrSpec("qkv_hidden_sizes", (), z3="code", sample=_sample_sizes)),
    shape=packed_attention_shape, kernel=packed_attention_kernel(),
    int_kernel=packed_attention_kernel(integer=True),
    decode=contrib_decoder(lambda: ATTENTION, (3,), ("num_heads", "scale", "qkv_hidden_sizes", "unidirectional"),
                           _read_packed),
    encode=contrib_encoder("Attention", attrs_of=_encode_packed_attrs),
    doc="ONNX Runtime's attention: Q, K, V = the column slices of input @ weights + bias, then mha's "
        "softmax(Q Kᵀ · scale) V",
    # the weights are contracted (a matrix); no "bias" role: the generator's lifts add biases to the one op that
    # has it (conv), as fused_conv's comment says
    roles=("matrix", "matrix"), z3_symbol="attention", family="matrix", flops=_packed_flops,
    fit=packed_attention_fit)

OPS = (MHA, ATTENTION)
