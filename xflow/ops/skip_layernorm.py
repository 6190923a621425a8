"""SkipLayerNormalization (ONNX Runtime contrib, ``com.microsoft``): layer normalization over the last axis
of a residual sum, layernorm(x + skip, gamma, beta). Only its first output is decoded, and no bias input
(the fifth); the residual and x have the same shape, gamma (and beta) the last dim."""

from __future__ import annotations

from collections.abc import Sequence

from xflow.ir import Attrs, Shape
from xflow.ops._contrib import MS_DOMAIN, NORM_KERNELS, compose, contrib_decoder, contrib_encoder, float_attr
from xflow.ops.base import AttrSpec, OpDef, ShapeError, one_of
from xflow.ops.elementwise import ADD
from xflow.ops.layernorm import LAYERNORM

#: ONNX Runtime's default epsilon of the skip normalizations
SKIP_EPSILON = 1e-12


def skip_norm_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """x's shape; the skip has it too, gamma (and beta) are vectors of its last dim; rank 2 or 3 (what
    ONNX Runtime's kernel takes)."""
    x = tuple(shapes[0])
    if len(x) not in (2, 3):
        raise ShapeError(f"skip normalization: input rank {len(x)}, not 2 or 3")
    if tuple(shapes[1]) != x:
        raise ShapeError(f"skip normalization: skip shape {tuple(shapes[1])} differs from the input's {x}")
    for s in shapes[2:]:
        if tuple(s) != x[-1:]:
            raise ShapeError(f"skip normalization: parameter shape {tuple(s)} is not ({x[-1]},)")
    return [x]


def skip_norm_steps(norm: OpDef) -> tuple:
    """The decomposition of a skip normalization: the residual sum, then ``norm`` over its last axis with
    the fused op's parameters (gamma, and beta where the op has one)."""

    def residual(values: list, attrs: Attrs) -> tuple[list, dict]:
        return [values[0], values[1]], {}

    def normalize(values: list, attrs: Attrs) -> tuple[list, dict]:
        summed = values[-1]
        return [summed, *values[2:-1]], {"axis": summed.ndim - 1, "epsilon": attrs["epsilon"]}

    return (ADD, residual), (norm, normalize)


EPSILON = AttrSpec("epsilon", SKIP_EPSILON, z3="float", sample=one_of(1e-12, 1e-5))

SKIP_LAYERNORM = OpDef(
    name="skip_layernorm", onnx_types=("SkipLayerNormalization",), domain=MS_DOMAIN,
    kernel_dtypes=NORM_KERNELS, min_inputs=3, max_inputs=4,
    attrs=(EPSILON,), shape=skip_norm_shape, kernel=compose(*skip_norm_steps(LAYERNORM)),
    int_kernel=compose(*skip_norm_steps(LAYERNORM), integer=True),
    decode=contrib_decoder(lambda: SKIP_LAYERNORM, (3, 4), ("epsilon",),
                           lambda attrs, proto, ctx: {"epsilon": float_attr(attrs, "epsilon", SKIP_EPSILON)}),
    encode=contrib_encoder("SkipLayerNormalization"),
    doc="fused residual add + layer normalization over the last axis", z3_symbol="skip_layernorm",
    family="norm")

OPS = (SKIP_LAYERNORM,)
