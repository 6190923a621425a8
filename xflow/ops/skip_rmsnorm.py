"""SkipSimplifiedLayerNormalization (ONNX Runtime contrib, ``com.microsoft``): RMS normalization over the last
axis of a residual sum, rmsnorm(x + skip, gamma). Only its first output is decoded, and no bias input."""

from __future__ import annotations

from xflow.ops._contrib import MS_DOMAIN, NORM_KERNELS, compose, contrib_decoder, contrib_encoder, float_attr
from xflow.ops.base import OpDef
from xflow.ops.rmsnorm import RMSNORM
from xflow.ops.skip_layernorm import EPSILON, SKIP_EPSILON, skip_norm_shape, skip_norm_steps

SKIP_RMSNORM = OpDef(
    name="skip_rmsnorm", onnx_types=("SkipSimplifiedLayerNormalization",), domain=MS_DOMAIN,
    kernel_dtypes=NORM_KERNELS, min_inputs=3,
    max_inputs=3, attrs=(EPSILON,), shape=skip_norm_shape, kernel=compose(*skip_norm_steps(RMSNORM)),
    int_kernel=compose(*skip_norm_steps(RMSNORM), integer=True),
    decode=contrib_decoder(lambda: SKIP_RMSNORM, (3,), ("epsilon",),
                           lambda attrs, proto, ctx: {"epsilon": float_attr(attrs, "epsilon", SKIP_EPSILON)}),
    encode=contrib_encoder("SkipSimplifiedLayerNormalization"),
    doc="fused residual add + RMS normalization over the last axis", z3_symbol="skip_rmsnorm", family="norm")

OPS = (SKIP_RMSNORM,)
