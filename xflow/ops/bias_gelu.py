"""BiasGelu (ONNX Runtime contrib, ``com.microsoft``): gelu(x + bias), the erf form, bias a vector of x's
last dim."""

from __future__ import annotations

from collections.abc import Sequence

from xflow.ir import Attrs, Shape
from xflow.ops._contrib import FLOAT_KERNELS, MS_DOMAIN, compose, contrib_decoder, contrib_encoder
from xflow.ops.base import OpDef, ShapeError
from xflow.ops.elementwise import ADD
from xflow.ops.gelu import GELU


def bias_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """x's shape; a bias (when given) is a vector of its last dim."""
    x = tuple(shapes[0])
    if not x:
        raise ShapeError("bias activation: the input is a scalar")
    if len(shapes) > 1 and tuple(shapes[1]) != x[-1:]:
        raise ShapeError(f"bias activation: bias shape {tuple(shapes[1])} is not ({x[-1]},)")
    return [x]


def kernel_of(approximate: str, integer: bool = False):
    """The kernel of the decomposition gelu(x + bias), or gelu(x) without a bias (by the number of inputs);
    with ``integer`` the fingerprint variant."""

    def residual(values, attrs):
        return [values[0], values[1]], {}

    def activation(values, attrs):  # of the last value: the sum, or x itself
        return [values[-1]], {"approximate": approximate}

    two = compose((ADD, residual), (GELU, activation), integer=integer)
    one = compose((GELU, activation), integer=integer)
    return lambda xp, arrays, attrs: (two if len(arrays) > 1 else one)(xp, arrays, attrs)


BIAS_GELU = OpDef(
    name="bias_gelu", onnx_types=("BiasGelu",), domain=MS_DOMAIN,
    kernel_dtypes=FLOAT_KERNELS, min_inputs=2, max_inputs=2, attrs=(),
    shape=bias_shape, kernel=kernel_of("none"), int_kernel=kernel_of("none", integer=True),
    decode=contrib_decoder(lambda: BIAS_GELU, (2,)), encode=contrib_encoder("BiasGelu"),
    doc="ONNX Runtime's fused bias add + GELU (erf form)", z3_symbol="bias_gelu", family="activation")

OPS = (BIAS_GELU,)
