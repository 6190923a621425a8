"""Element-wise negation (ONNX ``Neg``)."""

from __future__ import annotations

from xflow.ops._forms import unary
from xflow.ops.base import Menu

NEG = unary("neg", "Neg", lambda xp, a, attrs: [-a[0]], "neg: -x", family="elementwise", linear=True,
           menu=Menu(activations_only=True))

OPS = (NEG,)
