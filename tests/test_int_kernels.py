"""The integer kernels behind rule fingerprints compute what they claim, value by value: the float
kernel exactly (small integers are exact in float64) where the op has no integer variant, and the
stated stand-in (TASO's non-linear polynomials, window sums, an affine batchnorm) where it has one."""

from __future__ import annotations

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


STAND_INS = {"relu": _poly((1, 1)), "sigmoid": _poly((0, 3, 7)), "tanh": _poly((0, 5, 11))}


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
    if op == "batchnorm":
        x, scale, bias, mean, var = arrays
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        scale, bias, mean, var = (p.reshape(per_channel) for p in (scale, bias, mean, var))
        return [(x - mean) * scale * var + bias]
    return OPS[op].evaluate(np, wide, attrs)


@pytest.mark.parametrize(("op", "shapes", "attrs"), CASES)
def test_int_kernel_values(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    node = make_node_for(op, shapes, attrs)
    arrays = random_inputs(op, shapes, np.int64)
    got = OPS[op].evaluate_int(np, arrays, node.attrs)
    want = expected_int(op, arrays, node.attrs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.rint(np.asarray(w)).astype(np.int64))


def test_every_integer_variant_is_described_here() -> None:
    """An op given a new integer variant must get its stand-in above, or this file checks it against the
    float kernel and fails."""
    with_variant = {name for name, op in OPS.items() if op.int_kernel is not None and not op.weights_only}
    assert with_variant <= set(STAND_INS) | {"conv", "avgpool", "batchnorm"}, with_variant
    assert {case.values[0] for case in CASES} >= with_variant | {"const_pool"}
