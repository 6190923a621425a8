"""Element-wise square root (ONNX ``Sqrt``; NaN below zero, as ONNX Runtime gives)."""

from __future__ import annotations

from xflow.ops._forms import stand_in, unary
from xflow.ops.base import Menu

SQRT = unary("sqrt", "Sqrt", lambda xp, a, attrs: [xp.sqrt(a[0])], "square root", family="elementwise",
             int_kernel=stand_in(29, 31), menu=Menu(activations_only=True))

OPS = (SQRT,)
