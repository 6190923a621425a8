"""The integer kernels behind rule fingerprints compute what they claim, value by value: the float
kernel exactly (small integers are exact in float64) where the op has no integer variant, and the
stated stand-in (TASO's non-linear polynomials, window sums, an affine batchnorm) where it has one."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from tests.test_ops import CASES, Shape, make_node_for, random_inputs
from xflow.ops import OPS


def _poly(coefficients: tuple[int, ...]):  # noqa: ANN202
    """x -> x * (x * x + a) + b (or x * (x + 1) + 1 for relu's two coefficients), as documented in the op table."""
    if len(coefficients) == 2:
        return lambda x: x * (x + coefficients[0]) + coefficients[1]
    return lambda x: x * (x * x + coefficients[1]) + coefficients[2]


STAND_INS = {"relu": _poly((1, 1)), "sigmoid": _poly((0, 3, 7)), "tanh": _poly((0, 5, 11)),
             # ops with no exact integer form: x(x² + a) + b, distinct (a, b) per op (xflow/ops/_forms.stand_in)
             "sqrt": _poly((0, 29, 31)), "exp": _poly((0, 37, 41)), "erf": _poly((0, 43, 47)),
             "hardsigmoid": _poly((0, 71, 73)), "hardswish": _poly((0, 79, 83)), "gelu": _poly((0, 89, 97)),
             "reciprocal": _poly((0, 19, 23)), "clip": _poly((3, 5))}
#: comparisons: a stand-in polynomial of x - y (y - x for the mirrored one), so x < y and y > x agree
COMPARISONS = {"less": ((0, 107, 109), False), "greater": ((0, 107, 109), True),
               "less_equal": ((0, 113, 127), False), "greater_equal": ((0, 113, 127), True)}


def expected_int(op: str, arrays: list[np.ndarray], attrs: Any) -> list[np.ndarray]:
    """What the integer variant must give, computed from the float kernels in float64."""
    wide = [a.astype(np.float64) for a in arrays]
    if op in STAND_INS:
        return [STAND_INS[op](arrays[0])]
    if op == "const_pool":  # avgpool's integer variant sums the window, so its kernel is ones, not 1/(kh*kw)
        (pool,) = OPS[op].evaluate(np, [], attrs)
        return [np.ones_like(pool)]
    if op == "conv":
        (linear,) = OPS["conv"].evaluate(np, wide, attrs.updated(act="none"))
        return [STAND_INS["relu"](linear) if attrs["act"] == "relu" else linear]
    if op == "avgpool":
        kh, kw = attrs["kernel"]
        (mean,) = OPS["avgpool"].evaluate(np, wide, attrs.updated(count_include_pad=1))
        sums = mean * kh * kw
        if attrs["count_include_pad"] or not any(attrs["pads"]):
            return [sums]
        ones = np.ones_like(wide[0])
        (counted,) = OPS["avgpool"].evaluate(np, [ones], attrs.updated(count_include_pad=1))
        (share,) = OPS["avgpool"].evaluate(np, [ones], attrs.updated(count_include_pad=0))
        valid = np.rint(counted * kh * kw / share)  # elements inside the image per window
        return [sums * (1 + kh * kw - valid)]
    if op in COMPARISONS:
        coefficients, mirrored = COMPARISONS[op]
        x, y = arrays
        return [_poly(coefficients)(y - x if mirrored else x - y)]
    if op == "equal":  # even in x - y: equality is symmetric
        d = arrays[0] - arrays[1]
        return [d * d * (d * d + 101) + 103]
    if op == "div":  # x times the reciprocal's stand-in: linear in x, as over the reals
        return [arrays[0] * STAND_INS["reciprocal"](arrays[1])]
    if op == "pow2_scale":  # 2**k has no int64 form for k < 0 or k >= 63: an odd multiplier per k stands in
        return [arrays[0] * (2 * attrs["exponent"] + 1)]
    if op == "pow":  # exact for exponents 0..4, a stand-in otherwise
        e = attrs["exponent"]
        return [arrays[0] ** int(e)] if float(e).is_integer() and 0 <= e <= 4 else [_poly((0, 53, 59))(arrays[0])]
    if op == "cast":  # fingerprints stay integers: a cast between the types they stand for is the identity
        return [arrays[0]]
    if op == "where":  # both branches mixed through the condition, non-linearly
        c, x, y = arrays
        return [c * x + (c * c + 1) * y]
    if op == "softmax":  # exp's stand-in times its sum over the axis (no division over integers)
        e = _poly((0, 61, 67))(arrays[0])
        return [e * e.sum(axis=attrs["axis"], keepdims=True)]
    if op == "reducemean":  # sums without dividing, as avgpool's variant
        return OPS["reducesum"].evaluate(np, wide, attrs)
    if op in ("layernorm", "instancenorm"):  # centred by the sum (not the mean), then scale and bias
        x = arrays[0]
        if op == "layernorm":
            axis = attrs["axis"] % x.ndim
            axes, scale, bias = tuple(range(axis, x.ndim)), arrays[1], arrays[2] if len(arrays) > 2 else 0
        else:
            per_channel = (1, -1) + (1,) * (x.ndim - 2)
            axes, scale, bias = tuple(range(2, x.ndim)), arrays[1].reshape(per_channel), arrays[2].reshape(per_channel)
        return [(x - x.sum(axis=axes, keepdims=True)) * scale + bias]
    if op == "groupnorm":  # instancenorm's stand-in per group of channels
        x, per_channel = arrays[0], (1, -1) + (1,) * (arrays[0].ndim - 2)
        grouped = x.reshape((x.shape[0], attrs["num_groups"], -1) + x.shape[2:])
        centred = (grouped - grouped.sum(axis=tuple(range(2, grouped.ndim)), keepdims=True)).reshape(x.shape)
        return [centred * arrays[1].reshape(per_channel) + arrays[2].reshape(per_channel)]
    if op == "batchnorm":
        x, scale, bias, mean, var = arrays
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        scale, bias, mean, var = (p.reshape(per_channel) for p in (scale, bias, mean, var))
        return [(x - mean) * scale * var + bias]
    if op in FUSED:
        return FUSED[op](arrays, attrs)
    return OPS[op].evaluate(np, wide, attrs)


def _skip_norm(norm: str):  # noqa: ANN202
    def expected(arrays: list[np.ndarray], attrs: Any) -> list[np.ndarray]:
        summed = arrays[0] + arrays[1]
        norm_attrs = OPS[norm].normalize_attrs({"axis": summed.ndim - 1, "epsilon": attrs["epsilon"]})
        return expected_int(norm, [summed, *arrays[2:]], norm_attrs)
    return expected


def _rmsnorm(arrays: list[np.ndarray], attrs: Any) -> list[np.ndarray]:
    x, scale = arrays
    axes = tuple(range(attrs["axis"], x.ndim))
    return [x * ((x * x).sum(axis=axes, keepdims=True) + 1) * scale]


def _swap(a: np.ndarray, flag: int) -> np.ndarray:
    return np.swapaxes(a, -1, -2) if flag else a


def _fused_matmul(arrays: list[np.ndarray], attrs: Any) -> list[np.ndarray]:
    product = np.matmul(_swap(arrays[0], attrs["transA"]), _swap(arrays[1], attrs["transB"]))
    return [product if attrs["alpha"] == 1.0 else product * (round(attrs["alpha"] * 1000) + 7919)]


def _fused_conv(arrays: list[np.ndarray], attrs: Any) -> list[np.ndarray]:
    conv_attrs = OPS["conv"].normalize_attrs({k: attrs[k] for k in ("strides", "pads", "group")})
    (linear,) = OPS["conv"].evaluate(np, [a.astype(np.float64) for a in arrays], conv_attrs)
    return [STAND_INS[attrs["activation"].lower()](linear)]


def _mha(arrays: list[np.ndarray], attrs: Any) -> list[np.ndarray]:
    """Attention's decomposition in int64 (wrapping as the variant does): heads split, Q Kᵀ times the scale's
    stand-in where the scale (1/sqrt(head size) when 0) is not 1, softmax's stand-in over the keys, times V."""
    q, k, v = arrays
    heads, (batch, seq, hidden) = attrs["num_heads"], q.shape
    scale = attrs["scale"] or 1 / math.sqrt(hidden // heads)
    q4, k4, v4 = (a.reshape(batch, a.shape[1], heads, -1).transpose(0, 2, 1, 3) for a in (q, k, v))
    scores = q4 @ k4.transpose(0, 1, 3, 2)
    if scale != 1.0:
        scores = scores * (round(scale * 1000) + 7919)
    (probs,) = expected_int("softmax", [scores], OPS["softmax"].normalize_attrs({"axis": 3}))
    return [(probs @ v4).transpose(0, 2, 1, 3).reshape(batch, seq, -1)]


def _attention(arrays: list[np.ndarray], attrs: Any) -> list[np.ndarray]:
    """The packed projection in int64 (x @ w + b), its column slices (thirds unless qkv_hidden_sizes), then
    mha's reference on them."""
    x, w, b = arrays
    qkv = x @ w + b
    eq, ek, _ = attrs["qkv_hidden_sizes"] or (w.shape[1] // 3,) * 3
    q, k, v = qkv[..., :eq], qkv[..., eq:eq + ek], qkv[..., eq + ek:]
    return _mha([q, k, v], {"num_heads": attrs["num_heads"], "scale": attrs["scale"]})


#: ONNX Runtime's fused kernels: the integer variants of their decompositions, composed
FUSED = {
    "skip_layernorm": _skip_norm("layernorm"), "skip_rmsnorm": _skip_norm("rmsnorm"), "rmsnorm": _rmsnorm,
    # gelu's stand-in (both of its forms), of x plus the bias where there is one
    **{op: lambda arrays, attrs: [STAND_INS["gelu"](sum(arrays))] for op in ("ms_gelu", "bias_gelu", "fast_gelu")},
    "quick_gelu": lambda arrays, attrs: [arrays[0] * STAND_INS["sigmoid"](arrays[0]) if attrs["alpha"] == 1.0
                                         else _poly((0, 101, 103))(arrays[0])],
    "fused_matmul": _fused_matmul, "fused_conv": _fused_conv, "mha": _mha,
    "attention": _attention,
}


@pytest.mark.parametrize(("op", "shapes", "attrs"), CASES)
def test_int_kernel_values(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    node = make_node_for(op, shapes, attrs)
    arrays = random_inputs(op, shapes, np.int64)
    got = OPS[op].evaluate_int(np, arrays, node.attrs)
    want = expected_int(op, arrays, node.attrs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        # an expectation computed in int64 is compared as it is: through float64 it would lose the low bits of
        # values beyond 2**53 (attention's stand-ins reach them, and wrap, as the variant does)
        w = np.asarray(w)
        np.testing.assert_array_equal(np.asarray(g), w if w.dtype.kind == "i" else np.rint(w).astype(np.int64))


def test_every_integer_variant_is_described_here() -> None:
    """An op given a new integer variant must get its stand-in above, or this file checks it against the
    float kernel and fails."""
    with_variant = {name for name, op in OPS.items() if op.int_kernel is not None and not op.weights_only}
    described = set(STAND_INS) | set(COMPARISONS) | set(FUSED) | {
        "conv", "avgpool", "batchnorm", "equal", "div", "pow", "pow2_scale", "cast", "where", "softmax", "reducemean",
        "layernorm", "instancenorm", "groupnorm"}
    assert with_variant <= described, with_variant - described
    assert {case.values[0] for case in CASES} >= with_variant | {"const_pool"}
