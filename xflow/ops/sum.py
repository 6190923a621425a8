"""Element-wise sum of two tensors as ONNX ``Sum`` (two inputs, broadcasting): the same function as
ewadd, written as another ONNX node.

It exists because ONNX Runtime's graph optimizer treats the two nodes differently: its
SkipLayerNormFusion matches an ``Add`` feeding a LayerNormalization and never a ``Sum``, so a residual
sum written as ``Sum`` keeps the unfused Add/LayerNormalization kernels. Which form runs faster is left to
the measured cost model.
A ``Sum`` of one or of three or more inputs stays opaque.
"""

from __future__ import annotations

from xflow.ops.base import OpDef
from xflow.ops.elementwise import broadcast_shape, simple_decoder, simple_encoder

SUM = OpDef(
    name="sum", onnx_types=("Sum",), min_inputs=2, max_inputs=2, attrs=(), shape=broadcast_shape,
    kernel=lambda xp, a, attrs: [a[0] + a[1]], decode=simple_decoder(lambda: SUM, 2), encode=simple_encoder("Sum"),
    doc="ewsum: element-wise addition of two tensors written as ONNX Sum", commutative=True, elementwise=True,
    linear=True, z3_symbol="ewsum", family="elementwise")

OPS = (SUM,)
