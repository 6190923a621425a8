"""TASO's constant tensors: zero-input ops that make a pooling kernel, identity kernels, or ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from xflow.ir import FLOAT_DTYPES, Attrs, Node, Shape
from xflow.ops.base import AttrSpec, EncodeContext, Kernel, Menu, OpDef, ShapeError, ShapeRule, Z3Kind

_DTYPE = AttrSpec("dtype", onnx.TensorProto.FLOAT)


def _np_dtype(op: str, dtype: int) -> np.dtype:
    try:
        result = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
    except (KeyError, TypeError, ValueError) as exc:
        raise ShapeError(f"{op}: dtype {dtype!r} is not an ONNX tensor element type") from exc
    if result.kind not in "iuf":
        raise ShapeError(f"{op}: dtype {onnx.TensorProto.DataType.Name(dtype)} is not numeric")
    return result


def _checked(op: str, attrs: Attrs) -> Shape:
    shape = tuple(attrs["shape"])
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise ShapeError(f"{op}: shape {shape} must be non-negative ints")
    _np_dtype(op, attrs["dtype"])
    return shape


def pool_kernel_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Cpool: a (C, 1, kh, kw) depthwise kernel, float only."""
    shape = _checked("const_pool", attrs)
    if len(shape) != 4 or shape[1] != 1 or min(shape) < 1:
        raise ShapeError(f"const_pool: shape {shape} is not (C, 1, kh, kw) with positive dims")
    if attrs["dtype"] not in FLOAT_DTYPES:
        raise ShapeError(f"const_pool: dtype {attrs['dtype']} is not a float type")
    return [shape]


def iconv_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Identity conv kernel: (C, C, kh, kw) with positive kernel dims."""
    shape = _checked("const_iconv", attrs)
    if len(shape) != 4 or shape[0] != shape[1] or min(shape[2:]) < 1:
        raise ShapeError(f"const_iconv: shape {shape} is not (C, C, kh, kw) with kh, kw >= 1")
    return [shape]


def imatmul_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Identity matrix: (n, n)."""
    shape = _checked("const_imatmul", attrs)
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ShapeError(f"const_imatmul: shape {shape} is not square (n, n)")
    return [shape]


def ones_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Ones of any shape."""
    return [_checked("const_ones", attrs)]


def _pool_kernel(xp: Any, shape: Shape, dtype: np.dtype) -> Any:
    return xp.full(shape, 1.0 / (shape[2] * shape[3]), dtype=dtype)


def _iconv(xp: Any, shape: Shape, dtype: np.dtype) -> Any:
    out = xp.zeros(shape, dtype=dtype)
    c = xp.arange(shape[0])
    out[c, c, shape[2] // 2, shape[3] // 2] = 1
    return out


def _imatmul(xp: Any, shape: Shape, dtype: np.dtype) -> Any:
    return xp.eye(shape[0], dtype=dtype)


def _ones(xp: Any, shape: Shape, dtype: np.dtype) -> Any:
    return xp.ones(shape, dtype=dtype)


Maker = Callable[[Any, Shape, np.dtype], Any]


def _kernels(op: str, make: Maker, int_make: Maker):
    """The float kernel (in the ``dtype`` attribute) and the int64 fingerprint kernel of a constant op."""

    def kernel(xp, a, attrs):
        return [make(xp, tuple(attrs["shape"]), _np_dtype(op, attrs["dtype"]))]

    def int_kernel(xp, a, attrs):
        return [int_make(xp, tuple(attrs["shape"]), np.dtype(np.int64))]

    return kernel, int_kernel


def constant_encoder(kernel: Kernel):
    """An encoder writing an ONNX Constant node that holds the value ``kernel`` makes."""

    def encode(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
        (value,) = kernel(np, [], node.attrs)
        name = node.name or ctx.fresh_name("Constant")
        return [onnx.helper.make_node("Constant", [], list(node.outputs), name=name,
                                      value=numpy_helper.from_array(np.asarray(value), f"{name}_value"))]

    return encode


def _constant_op(name: str, shape: ShapeRule, rank: Z3Kind, make: Maker, int_make: Maker, doc: str,
                 menu: tuple[dict[str, Any], ...]) -> OpDef:
    """A constant op; ``rank`` is its shape's z3 encoding (a fixed rank, or "code" for any rank)."""
    kernel, int_kernel = _kernels(name, make, int_make)
    return OpDef(name=name, onnx_types=("Constant",), min_inputs=0, max_inputs=0,
                 attrs=(AttrSpec("shape", z3=rank), _DTYPE), shape=shape, kernel=kernel, int_kernel=int_kernel,
                 decode=None, encode=constant_encoder(kernel), doc=doc, weights_only=True, z3_symbol=name,
                 menu=Menu(menu, arity=0))


CONST_POOL = _constant_op("const_pool", pool_kernel_shape, 4, _pool_kernel, _ones,
                          "Cpool: depthwise averaging kernel (C, 1, kh, kw) of 1/(kh*kw); ones over integers",
                          ({"shape": (4, 1, 3, 3)},))
CONST_ICONV = _constant_op("const_iconv", iconv_shape, 4, _iconv, _iconv,
                           "identity conv kernel (C, C, kh, kw): 1 at [c, c, kh//2, kw//2]",
                           ({"shape": (4, 4, 3, 3)}, {"shape": (4, 4, 1, 1)}))
CONST_IMATMUL = _constant_op("const_imatmul", imatmul_shape, 2, _imatmul, _imatmul, "identity matrix (n, n)",
                             ({"shape": (4, 4)},))
CONST_ONES = _constant_op("const_ones", ones_shape, "code", _ones, _ones, "a tensor of ones", ({"shape": (4, 4)},))

OPS = (CONST_POOL, CONST_ICONV, CONST_IMATMUL, CONST_ONES)
