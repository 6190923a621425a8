"""FastGelu (ONNX Runtime contrib, ``com.microsoft``): the tanh approximation of GELU of x (+ bias),
x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))). The erf form is another function: only the tanh form maps here."""

from __future__ import annotations

from xflow.ops._contrib import FLOAT_KERNELS, MS_DOMAIN, contrib_decoder, contrib_encoder
from xflow.ops.base import OpDef
from xflow.ops.bias_gelu import bias_shape, kernel_of

FAST_GELU = OpDef(
    name="fast_gelu", onnx_types=("FastGelu",), domain=MS_DOMAIN,
    kernel_dtypes=FLOAT_KERNELS, min_inputs=1, max_inputs=2, attrs=(),
    shape=bias_shape, kernel=kernel_of("tanh"), int_kernel=kernel_of("tanh", integer=True),
    decode=contrib_decoder(lambda: FAST_GELU, (1, 2)), encode=contrib_encoder("FastGelu"),
    doc="ONNX Runtime's fused GELU, tanh approximation, with an optional bias", z3_symbol="fast_gelu",
    family="activation")

OPS = (FAST_GELU,)
