"""Element-wise negation (ONNX ``Neg``)."""

from __future__ import annotations

from xflow.ops._forms import unary

NEG = unary("neg", "Neg", lambda xp, a, attrs: [-a[0]], "neg: -x", family="elementwise", linear=True)

OPS = (NEG,)
