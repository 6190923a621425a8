"""Constant tensors (initializers) held by reference: weights are never copied needlessly."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from xflow.ir.types import TensorType


@dataclass(frozen=True, eq=False)
class Constant:
    """An initializer: either the original ``TensorProto`` (possibly pointing at external data that
    is read only when asked for) or a new numpy array made by the optimizer."""

    type: TensorType
    proto: onnx.TensorProto | None = None
    array: np.ndarray | None = None
    base_dir: str = ""

    @staticmethod
    def from_proto(proto: onnx.TensorProto, base_dir: str = "") -> Constant:
        """Wrap an existing initializer without reading its data."""
        return Constant(TensorType(proto.data_type, tuple(int(d) for d in proto.dims)), proto=proto,
                        base_dir=base_dir)

    @staticmethod
    def from_array(array: np.ndarray) -> Constant:
        """Wrap a new array (made by folding or by a rule's constant)."""
        array = np.asarray(array)
        if not array.flags.c_contiguous:  # ascontiguousarray alone would make a scalar a (1,)
            array = np.ascontiguousarray(array)
        dtype = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        return Constant(TensorType(dtype, tuple(int(d) for d in array.shape)), array=array)

    @property
    def is_external(self) -> bool:
        """True when the data lives in an external file."""
        return self.proto is not None and self.proto.data_location == onnx.TensorProto.EXTERNAL

    @property
    def nbytes(self) -> int:
        """Size of the data in bytes."""
        return self.type.size * self.type.np_dtype.itemsize

    def value(self) -> np.ndarray:
        """The data as a numpy array (reads external data on demand)."""
        if self.array is not None:
            return self.array
        assert self.proto is not None
        return numpy_helper.to_array(self.proto, base_dir=self.base_dir)
