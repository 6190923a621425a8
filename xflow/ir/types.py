"""Value types and frozen attribute maps used by the IR."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

Dim = Any  # an int, a sympy expression over symbols (xflow.ir.dims), or None (unknown)
Shape = tuple[int, ...]

FLOAT_DTYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.BFLOAT16})


@dataclass(frozen=True)
class TensorType:
    """Element type (an ``onnx.TensorProto`` data type) and shape of a value.

    ``shape`` is None when even the rank is unknown; a dynamic dim is a symbol or an expression over symbols
    (``xflow.ir.dims``: named after its ``dim_param``, or after its value and axis when unnamed).
    """

    dtype: int
    shape: tuple[Dim, ...] | None

    @property
    def is_static(self) -> bool:
        """True when the rank and every dim are known integers."""
        return self.shape is not None and all(isinstance(d, int) and d >= 0 for d in self.shape)

    @property
    def static_shape(self) -> Shape:
        """The shape as a tuple of ints; raises ValueError when it is not static."""
        if not self.is_static:
            raise ValueError(f"shape {self.shape} is not static")
        return tuple(int(d) for d in self.shape)  # type: ignore[union-attr]

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy dtype for this element type."""
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.dtype))

    @property
    def size(self) -> int:
        """Number of elements (static shapes only)."""
        return int(np.prod(self.static_shape, dtype=np.int64))

    def same_as(self, other: TensorType | None) -> bool:
        """Equal types, dims compared for every value of their symbols (``b*(s+1)`` is ``b*s + b``)."""
        if other is None or self == other:
            return self == other
        if self.dtype != other.dtype or self.shape is None or other.shape is None or \
                len(self.shape) != len(other.shape):
            return False
        from xflow.ir.dims import equal

        return all(a is not None and b is not None and equal(a, b)
                   for a, b in zip(self.shape, other.shape, strict=True))

    def __str__(self) -> str:
        name = onnx.TensorProto.DataType.Name(self.dtype).lower()
        if self.shape is None:
            return f"{name}[?]"
        return f"{name}[{','.join('?' if d is None else str(d) for d in self.shape)}]"


def freeze_value(value: Any) -> Any:
    """Turn lists into tuples (recursively) so attribute values hash."""
    if isinstance(value, list | tuple):
        return tuple(freeze_value(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


class Attrs(Mapping[str, Any]):
    """An immutable, hashable attribute map with deterministic (sorted) iteration."""

    __slots__ = ("_items", "_dict", "_hash")

    def __init__(self, items: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        merged = dict(items or {})
        merged.update(kwargs)
        self._dict = {k: freeze_value(v) for k, v in sorted(merged.items())}
        self._items = tuple(self._dict.items())
        self._hash = hash(self._items)

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    # The Mapping mixins go through __iter__/__getitem__ one key at a time; these run in the generator's
    # inner loops, so they read the dict directly.
    def __contains__(self, key: object) -> bool:
        return key in self._dict

    def get(self, key: str, default: Any = None) -> Any:
        return self._dict.get(key, default)

    def keys(self):  # type: ignore[override]
        return self._dict.keys()

    def items(self):  # type: ignore[override]
        return self._dict.items()

    def values(self):  # type: ignore[override]
        return self._dict.values()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._dict == {k: freeze_value(v) for k, v in other.items()}
        return NotImplemented

    def __repr__(self) -> str:
        return "Attrs(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"

    def updated(self, **changes: Any) -> Attrs:
        """A copy with some keys replaced."""
        merged = dict(self._dict)
        merged.update(changes)
        return Attrs(merged)
