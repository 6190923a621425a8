"""Conv and pool windows: gathered through a cached index table up to ``GATHER_LIMIT`` elements, read through a
strided view past it. Both paths give the same values, float and integer (the conformance tests hold the gathered
path to ONNX Runtime; these hold the strided one to it): integers exactly, floats to rounding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.test_ops import CASES, Shape, make_node_for, random_inputs
from xflow.ops import OPS
from xflow.ops import _windows as windows

WINDOWED = [c for c in CASES if c.values[0] in ("conv", "maxpool", "avgpool")]


def _run(op: str, arrays: list[np.ndarray], attrs: Any, integer: bool) -> list[np.ndarray]:
    with np.errstate(over="ignore"):
        return (OPS[op].evaluate_int if integer else OPS[op].evaluate)(np, arrays, attrs)


@pytest.mark.parametrize(("op", "shapes", "attrs"), WINDOWED)
def test_gathered_and_strided_windows_agree(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    node = make_node_for(op, shapes, attrs)
    cases = [(random_inputs(op, shapes, np.float64), False),
             ([np.random.default_rng(1).integers(-2**62, 2**62, s) for s in shapes], True)]
    gathered = [_run(op, arrays, node.attrs, integer) for arrays, integer in cases]
    windows._window_index.cache_clear()
    monkeypatch.setattr(windows, "GATHER_LIMIT", 0)
    try:
        assert all(windows._window_index(np, s, (1, 1), (1, 1), (0, 0, 0, 0), 0) is None for s in shapes if len(s) == 4)
        strided = [_run(op, arrays, node.attrs, integer) for arrays, integer in cases]
    finally:
        windows._window_index.cache_clear()
    for (want,), (got,), (_, integer) in zip(strided, gathered, cases, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        if integer:  # wrap-around sums and products: exact in any order
            np.testing.assert_array_equal(got, want)
        else:  # a window's sum may add in another order: within an ulp or two
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)


def test_a_large_image_reads_windows_through_a_strided_view() -> None:
    """No index table past the limit: a 64-channel 56x56 image's 3x3 windows would be 16 MB of indices."""
    assert windows._window_index(np, (1, 64, 56, 56), (3, 3), (1, 1), (1, 1, 1, 1), 0) is None
    small = windows._window_index(np, (1, 4, 7, 7), (3, 3), (1, 1), (1, 1, 1, 1), 1)
    assert small is not None and small.shape == (1, 1, 49, 36) and small.max() == 4 * 7 * 7
