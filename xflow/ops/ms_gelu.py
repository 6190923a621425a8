"""Gelu (ONNX Runtime contrib, ``com.microsoft``): the erf form x/2 (1 + erf(x / sqrt 2)), the same function
as the standard Gelu's (opset 20) with ``approximate`` none; available at any opset."""

from __future__ import annotations

from xflow.ops._contrib import FLOAT_KERNELS, MS_DOMAIN, compose, contrib_decoder, contrib_encoder
from xflow.ops.base import OpDef
from xflow.ops.elementwise import same_shape
from xflow.ops.gelu import GELU


def _input(values, attrs):
    return [values[0]], {"approximate": "none"}


MS_GELU = OpDef(
    name="ms_gelu", onnx_types=("Gelu",), domain=MS_DOMAIN,
    kernel_dtypes=FLOAT_KERNELS, min_inputs=1, max_inputs=1, attrs=(),
    shape=same_shape, kernel=compose((GELU, _input)), int_kernel=compose((GELU, _input), integer=True),
    decode=contrib_decoder(lambda: MS_GELU, (1,)), encode=contrib_encoder("Gelu"),
    doc="ONNX Runtime's fused GELU (erf form)", elementwise=True, z3_symbol="ms_gelu", family="activation")

OPS = (MS_GELU,)
