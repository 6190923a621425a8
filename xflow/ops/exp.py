"""Element-wise natural exponential (ONNX ``Exp``)."""

from __future__ import annotations

from xflow.ops._forms import stand_in, unary
from xflow.ops.base import Menu

EXP = unary("exp", "Exp", lambda xp, a, attrs: [xp.exp(a[0])], "natural exponential", family="elementwise",
            int_kernel=stand_in(37, 41), menu=Menu(activations_only=True))

OPS = (EXP,)
