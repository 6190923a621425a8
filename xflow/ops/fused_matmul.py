"""FusedMatMul (ONNX Runtime contrib, ``com.microsoft``): alpha · op(A) @ op(B), op transposing the last two
dims where ``transA`` / ``transB`` say so. The batch-transposing forms (transBatchA/B) stay opaque."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xflow.ir import Attrs, Shape
from xflow.ops._contrib import (
    FLOAT_DOUBLE_KERNELS,
    MS_DOMAIN,
    contrib_decoder,
    contrib_encoder,
    float_attr,
    scale_stand_in,
)
from xflow.ops.base import AttrSpec, OpDef, ShapeError, one_of
from xflow.ops.linalg import MATMUL, matmul_shape


def _swap_last(shape: Shape) -> Shape:
    return (*shape[:-2], shape[-1], shape[-2])


def fused_matmul_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """matmul's rule on the operands as transposed (both of rank >= 2)."""
    a, b = (tuple(s) for s in shapes)
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"fused_matmul: operands must have rank >= 2, got {a} and {b}")
    return matmul_shape([_swap_last(a) if attrs["transA"] else a, _swap_last(b) if attrs["transB"] else b], attrs)


def _operands(xp, arrays, attrs):
    a, b = arrays
    return [xp.swapaxes(a, -1, -2) if attrs["transA"] else a, xp.swapaxes(b, -1, -2) if attrs["transB"] else b]


def _fused_matmul(xp, arrays, attrs):
    product = MATMUL.evaluate(xp, _operands(xp, arrays, attrs), Attrs())[0]
    return [product if attrs["alpha"] == 1.0 else product * product.dtype.type(attrs["alpha"])]


def _fused_matmul_int(xp, arrays, attrs):
    # alpha 1 exactly the matmul of the transposed operands; another alpha scaled by a distinct integer
    product = MATMUL.evaluate_int(xp, _operands(xp, arrays, attrs), Attrs())[0]
    return [product if attrs["alpha"] == 1.0 else product * scale_stand_in(attrs["alpha"])]


def _read(attrs, proto, ctx):
    if int(attrs.get("transBatchA", 0)) or int(attrs.get("transBatchB", 0)):
        return None
    return {"alpha": float_attr(attrs, "alpha", 1.0), "transA": int(attrs.get("transA", 0)),
            "transB": int(attrs.get("transB", 0))}


def _encode_attrs(node, ctx):
    return {"alpha": float(node.attrs["alpha"]), "transA": node.attrs["transA"], "transB": node.attrs["transB"]}


FUSED_MATMUL = OpDef(
    name="fused_matmul", onnx_types=("FusedMatMul",), domain=MS_DOMAIN,
    kernel_dtypes=FLOAT_DOUBLE_KERNELS, min_inputs=2, max_inputs=2,
    attrs=(AttrSpec("alpha", 1.0, z3="float", sample=one_of(1.0, 0.125)),
           AttrSpec("transA", 0, choices=(0, 1), sample=one_of(0, 1)),
           AttrSpec("transB", 0, choices=(0, 1), sample=one_of(0, 1))),
    shape=fused_matmul_shape, kernel=_fused_matmul, int_kernel=_fused_matmul_int,
    decode=contrib_decoder(lambda: FUSED_MATMUL, (2,), ("alpha", "transA", "transB", "transBatchA", "transBatchB"),
                           _read),
    encode=contrib_encoder("FusedMatMul", attrs_of=_encode_attrs),
    doc="ONNX Runtime's fused alpha * (A or its transpose) @ (B or its transpose)", z3_symbol="fused_matmul",
    family="matrix",
    flops=lambda ins, outs, attrs: 2 * int(np.prod(outs[0], dtype=np.int64)) * int(
        ins[0][-2] if attrs["transA"] else ins[0][-1]))

OPS = (FUSED_MATMUL,)
