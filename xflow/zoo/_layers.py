"""Convolutional-network layer helpers on top of :class:`GraphBuilder` (NCHW, float32)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ._builder import GraphBuilder

IntPair = int | tuple[int, int]


def _pair(v: IntPair) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _out_size(size: int, k: int, s: int, pad: int, ceil: bool = False) -> int:
    num = size + 2 * pad - k
    if num < 0:
        raise ValueError(f"window {k} larger than padded input {size}+2*{pad}")
    return (-(-num // s) if ceil else num // s) + 1


def conv(
    gb: GraphBuilder,
    x: str,
    cout: int,
    kernel: IntPair,
    stride: IntPair = 1,
    padding: IntPair = 0,
    group: int = 1,
    bias: bool = False,
    name: str = "conv",
) -> str:
    """2-D Conv with He-normal weights (and a small random bias if ``bias``)."""
    n, cin, h, w = gb.shape(x)
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(padding)
    if cin % group or cout % group:
        raise ValueError(f"channels {cin}->{cout} not divisible by group {group}")
    with gb.scope(name):
        fan_in = (cin // group) * kh * kw
        inputs = [x, gb.normal("weight", (cout, cin // group, kh, kw), std=math.sqrt(2.0 / fan_in))]
        if bias:
            inputs.append(gb.normal("bias", (cout,), std=0.01))
        shape = (n, cout, _out_size(h, kh, sh, ph), _out_size(w, kw, sw, pw))
        return gb.node(
            "Conv",
            inputs,
            shape,
            kernel_shape=[kh, kw],
            strides=[sh, sw],
            pads=[ph, pw, ph, pw],
            dilations=[1, 1],
            group=group,
        )


def batch_norm(gb: GraphBuilder, x: str, eps: float = 1e-5, name: str = "bn") -> str:
    """Inference-mode BatchNormalization with random (but well-conditioned) statistics."""
    c = gb.shape(x)[1]
    with gb.scope(name):
        scale = gb.uniform("scale", (c,), 0.5, 1.0)
        bias = gb.normal("bias", (c,), std=0.05)
        mean = gb.normal("mean", (c,), std=0.05)
        var = gb.uniform("var", (c,), 0.8, 1.2)
        return gb.node("BatchNormalization", [x, scale, bias, mean, var], gb.shape(x), epsilon=eps, momentum=0.9)


def relu(gb: GraphBuilder, x: str) -> str:
    """Relu."""
    return gb.unary("Relu", x)


def conv_bn(
    gb: GraphBuilder,
    x: str,
    cout: int,
    kernel: IntPair,
    stride: IntPair = 1,
    padding: IntPair = 0,
    group: int = 1,
    eps: float = 1e-5,
    name: str = "conv",
) -> str:
    """Bias-free Conv followed by BatchNormalization."""
    with gb.scope(name):
        y = conv(gb, x, cout, kernel, stride, padding, group, bias=False, name="conv")
        return batch_norm(gb, y, eps=eps, name="bn")


def conv_bn_relu(
    gb: GraphBuilder,
    x: str,
    cout: int,
    kernel: IntPair,
    stride: IntPair = 1,
    padding: IntPair = 0,
    group: int = 1,
    eps: float = 1e-5,
    name: str = "conv",
) -> str:
    """Bias-free Conv, BatchNormalization, Relu."""
    return relu(gb, conv_bn(gb, x, cout, kernel, stride, padding, group, eps, name))


def add_relu(gb: GraphBuilder, a: str, b: str) -> str:
    """Residual Add followed by Relu."""
    return relu(gb, gb.add(a, b))


def _pool(gb: GraphBuilder, op: str, x: str, kernel: int, stride: int, padding: int, ceil: bool, **attrs: int) -> str:
    n, c, h, w = gb.shape(x)
    if ceil and padding:
        raise ValueError("ceil_mode with padding is not supported by these helpers")
    shape = (n, c, _out_size(h, kernel, stride, padding, ceil), _out_size(w, kernel, stride, padding, ceil))
    return gb.node(
        op,
        [x],
        shape,
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[padding] * 4,
        ceil_mode=int(ceil),
        **attrs,
    )


def max_pool(gb: GraphBuilder, x: str, kernel: int, stride: int, padding: int = 0, ceil: bool = False) -> str:
    """MaxPool (square window)."""
    return _pool(gb, "MaxPool", x, kernel, stride, padding, ceil)


def avg_pool(gb: GraphBuilder, x: str, kernel: int, stride: int, padding: int = 0) -> str:
    """AveragePool (square window, count_include_pad=0)."""
    return _pool(gb, "AveragePool", x, kernel, stride, padding, False, count_include_pad=0)


def concat(gb: GraphBuilder, xs: Sequence[str], axis: int = 1) -> str:
    """Concat along ``axis`` (channels by default)."""
    shapes = [gb.shape(x) for x in xs]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return gb.node("Concat", list(xs), out, axis=axis)


def classifier(gb: GraphBuilder, x: str, num_classes: int, name: str = "fc") -> str:
    """GlobalAveragePool, Flatten, Gemm(transB=1) head producing [N, num_classes] logits."""
    n, c = gb.shape(x)[:2]
    pooled = gb.node("GlobalAveragePool", [x], (n, c, 1, 1))
    flat = gb.node("Flatten", [pooled], (n, c), axis=1)
    with gb.scope(name):
        w = gb.normal("weight", (num_classes, c), std=1.0 / math.sqrt(c))
        b = gb.normal("bias", (num_classes,), std=0.01)
        return gb.node("Gemm", [flat, w, b], (n, num_classes), alpha=1.0, beta=1.0, transB=1)
