"""QuickGelu (ONNX Runtime contrib, ``com.microsoft``): x · sigmoid(alpha · x); with alpha 1 it is SiLU
(Swish), x · sigmoid(x)."""

from __future__ import annotations

from xflow.ir import Attrs
from xflow.ops._contrib import FLOAT_KERNELS, MS_DOMAIN, contrib_decoder, contrib_encoder, float_attr
from xflow.ops._forms import stand_in
from xflow.ops.base import AttrSpec, OpDef, one_of
from xflow.ops.elementwise import SIGMOID, same_shape

DEFAULT_ALPHA = 1.702  # ONNX Runtime's default


def _quick_gelu(xp, a, attrs):
    x = a[0]
    return [x * SIGMOID.evaluate(xp, [x * x.dtype.type(attrs["alpha"])], Attrs())[0]]


def _quick_gelu_int(xp, a, attrs):
    # with alpha 1 exactly x · sigmoid(x) (so the two fingerprint alike); another alpha is another function
    x = a[0]
    if attrs["alpha"] == 1.0:
        return [x * SIGMOID.evaluate_int(xp, [x], Attrs())[0]]
    return stand_in(101, 103)(xp, a, attrs)


QUICK_GELU = OpDef(
    name="quick_gelu", onnx_types=("QuickGelu",), domain=MS_DOMAIN,
    kernel_dtypes=FLOAT_KERNELS, min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("alpha", DEFAULT_ALPHA, z3="float", sample=one_of(1.0, DEFAULT_ALPHA)),),
    shape=same_shape, kernel=_quick_gelu, int_kernel=_quick_gelu_int,
    decode=contrib_decoder(lambda: QUICK_GELU, (1,), ("alpha",),
                           lambda attrs, proto, ctx: {"alpha": float_attr(attrs, "alpha", DEFAULT_ALPHA)}),
    encode=contrib_encoder("QuickGelu", attrs_of=lambda node, ctx: {"alpha": float(node.attrs["alpha"])}),
    doc="ONNX Runtime's fused x * sigmoid(alpha * x)", elementwise=True, z3_symbol="quick_gelu",
    family="activation")

OPS = (QUICK_GELU,)
