"""RotaryEmbedding (ONNX Runtime contrib, ``com.microsoft``): rotary position embedding in the rotate-half form
transformers' Llama writes, x · cos + rotate_half(x) · sin, with rotate_half(x) = concat(-x₂, x₁) over the last
axis and cos, sin the rows of half-width caches picked by the position ids, each repeated twice across the head.

Decoded in one form only: input (B, N, S, D) of rank 4 (the heads already split), position ids (B, S), caches
(M, D/2); ``interleaved`` 0, the whole head rotated (``rotary_embedding_dim`` 0), ``scale`` 1, no packed batching.
A rank-3 input, the interleaved (GPT-J) form, a partial rotation and a one-element position offset stay opaque.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from xflow.ir import Attrs, Shape
from xflow.ir.dims import equal
from xflow.ops._contrib import FLOAT_KERNELS, MS_DOMAIN, compose, contrib_decoder, contrib_encoder
from xflow.ops.base import OpDef, ShapeError
from xflow.ops.elementwise import ADD, MUL
from xflow.ops.gather import GATHER
from xflow.ops.negate import NEG
from xflow.ops.shape_ops import CONCAT
from xflow.ops.slice import SLICE
from xflow.ops.squeeze import UNSQUEEZE

#: the attributes ONNX Runtime's kernel reads and the one value of each that the decoded form has
_PLAIN_FORM = {"interleaved": 0, "rotary_embedding_dim": 0, "num_heads": 0, "scale": 1.0, "is_packed_batching": 0}


def rotary_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """x's shape (B, N, S, D), D even, for position ids (B, S) and caches (M, D/2) of one shape."""
    x, pos, cos, sin = (tuple(s) for s in shapes)
    if len(x) != 4:
        raise ShapeError(f"rotary: input of rank {len(x)}, not (batch, heads, seq, head_size)")
    if len(pos) != 2 or not (equal(pos[0], x[0]) and equal(pos[1], x[2])):
        raise ShapeError(f"rotary: position ids {pos} are not (batch, seq) of {x}")
    if len(cos) != 2 or cos != sin:
        raise ShapeError(f"rotary: caches {cos} and {sin} are not one (positions, head_size / 2) shape")
    if not isinstance(x[3], int) or x[3] % 2 or cos[1] != x[3] // 2:
        raise ShapeError(f"rotary: cache width {cos[1]} is not half the head size {x[3]}")
    return [x]


def rotate_half_steps() -> tuple:
    """The decomposition over the op table, as ``compose`` steps on (x, position ids, cos cache, sin cache): each
    cache's rows gathered by position and repeated across the head, unsqueezed over the heads, then
    x · cos + concat(-x₂, x₁) · sin (values 4.. are the steps' outputs in turn)."""
    def halves(values: list, second: bool) -> tuple:
        x = values[0]
        half = x.shape[3] // 2
        starts = (0, 0, 0, half if second else 0)
        stops = (*x.shape[:3], x.shape[3] if second else half)
        return [x], {"starts": starts, "stops": stops, "steps": (1, 1, 1, 1)}

    return ((CONCAT, lambda v, a: ([v[2], v[2]], {"axis": 1})),  # 4: cos rows, head-wide
            (CONCAT, lambda v, a: ([v[3], v[3]], {"axis": 1})),  # 5: sin rows
            (GATHER, lambda v, a: ([v[4], v[1]], {"axis": 0})),  # 6: (B, S, D)
            (GATHER, lambda v, a: ([v[5], v[1]], {"axis": 0})),  # 7
            (UNSQUEEZE, lambda v, a: ([v[6]], {"axes": (1,)})),  # 8: (B, 1, S, D)
            (UNSQUEEZE, lambda v, a: ([v[7]], {"axes": (1,)})),  # 9
            (SLICE, lambda v, a: halves(v, False)),  # 10: x₁
            (SLICE, lambda v, a: halves(v, True)),  # 11: x₂
            (NEG, lambda v, a: ([v[11]], {})),  # 12
            (CONCAT, lambda v, a: ([v[12], v[10]], {"axis": 3})),  # 13: rotate_half(x)
            (MUL, lambda v, a: ([v[0], v[8]], {})),  # 14
            (MUL, lambda v, a: ([v[13], v[9]], {})),  # 15
            (ADD, lambda v, a: ([v[14], v[15]], {})))  # 16


def _read(attrs, proto: onnx.NodeProto, ctx) -> dict | None:
    return {} if all(attrs.get(k, v) == v for k, v in _PLAIN_FORM.items()) else None


ROTARY = OpDef(
    name="rotary", onnx_types=("RotaryEmbedding",), domain=MS_DOMAIN, kernel_dtypes=FLOAT_KERNELS,
    # every step is exact over integers, so the float kernel is its own integer variant
    min_inputs=4, max_inputs=4, attrs=(), shape=rotary_shape, kernel=compose(*rotate_half_steps()),
    decode=contrib_decoder(lambda: ROTARY, (4,), tuple(_PLAIN_FORM), _read),
    encode=contrib_encoder("RotaryEmbedding"), roles=("any", "indices", "any", "any"),
    doc="rotary position embedding, rotate-half form, on (batch, heads, seq, head_size) by position ids",
    z3_symbol="rotary", family="elementwise", same_dtype_inputs=False)

OPS = (ROTARY,)
