"""Element-wise error function (ONNX ``Erf``; exported GELUs compute x/2 (1 + erf(x/sqrt 2)) with it)."""

from __future__ import annotations

from xflow.ops._forms import erf, stand_in, unary
from xflow.ops.base import Menu

ERF = unary("erf", "Erf", lambda xp, a, attrs: [erf(xp, a[0])], "error function", int_kernel=stand_in(43, 47),
            menu=Menu(activations_only=True))

OPS = (ERF,)
