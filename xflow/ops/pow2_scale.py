"""x times a power of two, ``2 ** exponent`` (ONNX ``Mul`` by a constant).

Exact in binary floating point wherever the result stays normal, so it changes no value; what it changes is the
range. The exact probabilities a softmax gives masked scores can lie below float32's smallest normal (1.2e-38:
Swin's shifted windows mask with -100, so some are near e^-100), and an x86 core takes a microcode assist for each
such denormal operand, many times slower than normal arithmetic. Scaled up before the matmul that reads them and the
product scaled back, they run at normal speed and the result is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ops.base import AttrSpec, EncodeContext, OpDef, one_of


def _pow2_scale(xp, a, attrs):
    x = a[0]
    return [x * xp.asarray(2.0 ** attrs["exponent"], dtype=x.dtype)]


def _pow2_scale_int(xp, a, attrs):
    # fingerprints are int64: a power of two of either sign as the odd multiplier 2k + 1 keeps the map injective
    return [a[0] * (2 * attrs["exponent"] + 1)]


def pow2_scale_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """The input's shape."""
    return [tuple(shapes[0])]


def encode_pow2_scale(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Mul by a constant of ``2 ** exponent`` in the input's element type.

    Scaling up must reach the kernel as a Mul of its own: ONNX Runtime folds a Mul by a scalar into the MatMul
    reading it (the product's alpha), which scales the product instead of the operand, whose denormals then stay.
    So a positive exponent is written as a vector along the last axis, which it does not fold; scaling down as a
    scalar, which it may fold, exactly."""
    exponent = node.attrs["exponent"]
    t = ctx.type_of(node.inputs[0])
    dtype = t.np_dtype if t is not None else np.dtype(np.float32)
    last = t.shape[-1] if t is not None and t.shape else None
    shape = (last,) if exponent > 0 and isinstance(last, int) else ()
    factor = ctx.add_constant(np.full(shape, 2.0 ** exponent, dtype=dtype), "pow2")
    return [onnx.helper.make_node("Mul", [node.inputs[0], factor], list(node.outputs),
                                  name=node.name or ctx.fresh_name("Mul"))]


POW2_SCALE = OpDef(
    name="pow2_scale", onnx_types=("Mul",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("exponent", sample=one_of(-64, -3, 1, 5, 64)),), shape=pow2_scale_shape,
    kernel=_pow2_scale, int_kernel=_pow2_scale_int, decode=None, encode=encode_pow2_scale,
    doc="x times 2**exponent: exact, it moves values out of the denormal range", elementwise=True, linear=True,
    z3_symbol="pow2_scale", family="elementwise", gain_in_values=True,
    value_dtypes=(onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE))  # 2**64 overflows float16

OPS = (POW2_SCALE,)
