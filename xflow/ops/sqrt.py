"""Element-wise square root (ONNX ``Sqrt``; NaN below zero, as ONNX Runtime gives)."""

from __future__ import annotations

from xflow.ops._forms import stand_in, unary

SQRT = unary("sqrt", "Sqrt", lambda xp, a, attrs: [xp.sqrt(a[0])], "square root", family="elementwise",
             int_kernel=stand_in(29, 31))

OPS = (SQRT,)
