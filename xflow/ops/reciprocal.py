"""Element-wise reciprocal (ONNX ``Reciprocal``): 1 / x."""

from __future__ import annotations

from xflow.ops._forms import unary
from xflow.ops.base import Menu
from xflow.ops.divide import RECIPROCAL_STAND_IN

RECIPROCAL = unary("reciprocal", "Reciprocal", lambda xp, a, attrs: [1 / a[0]], "reciprocal: 1 / x",
                   family="elementwise", int_kernel=RECIPROCAL_STAND_IN, menu=Menu())

OPS = (RECIPROCAL,)
