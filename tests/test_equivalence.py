"""The equivalence check that stands behind every write (xflow.equivalence): it refuses each way an
output can be broken, and accepts what float32 reassociation does to a correct one."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from xflow import equivalence
from xflow.equivalence import (
    EquivalenceError,
    NonFiniteReference,
    check_equivalence,
    check_output,
    float64_reference,
    verify_against_original,
)
from xflow.optimize import OptimizeOptions, optimize_file
from xflow.ort import open_session
from xflow.runtime import random_feeds

PROPERTY = settings(derandomize=True, max_examples=60, deadline=None, database=None)


@st.composite
def matmul_case(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(original, reordered, float64 reference) of x @ w: float32 results summed in two orders, as a merge
    or a reassociation does; magnitudes up to 1e3 and sums that cancel."""
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    n, k, m = draw(st.integers(1, 4)), draw(st.integers(1, 64)), draw(st.integers(1, 6))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0, 1e3]))
    x = (rng.standard_normal((n, k)) * scale).astype(np.float32)
    w = rng.standard_normal((k, m)).astype(np.float32)
    original = x @ w
    reordered = np.zeros((n, m), np.float32)
    for j in reversed(range(k)):  # another summation order, rounded in float32 at every step
        reordered += x[:, j:j + 1] * w[j:j + 1, :]
    return original, reordered, x.astype(np.float64) @ w.astype(np.float64)


@PROPERTY
@given(matmul_case())
def test_a_reordered_float32_sum_is_accepted(case):
    original, reordered, reference = case
    check_output("y", original, reordered, reference)


@PROPERTY
@given(matmul_case(), st.data())
def test_an_element_changed_by_one_percent_is_refused(case, data):
    original, _, reference = case
    broken = original.copy()
    at = tuple(data.draw(st.integers(0, d - 1)) for d in original.shape)
    broken[at] = original[at] * 1.01 + np.float32(0.01) * np.sign(original[at] or 1)
    with pytest.raises(EquivalenceError, match="differs at"):
        check_output("y", original, broken, reference)


@PROPERTY
@given(st.lists(st.floats(-10, 10, width=32), min_size=2, max_size=20), st.data())
def test_an_infinity_turned_finite_is_refused(values, data):
    """The old check's tolerance grew with max|a|: an inf anywhere made it infinite and -5 passed for inf."""
    original = np.array(values, np.float32)
    at = data.draw(st.integers(0, len(values) - 1))
    original[at] = np.inf
    broken = original.copy()
    broken[at] = -5.0
    with pytest.raises(EquivalenceError, match="NaN/inf positions differ"):
        check_output("y", original, broken)


def _changed_beside(values: list[float], data: st.DataObject, other: float, before: float,
                    after: float) -> tuple[np.ndarray, np.ndarray]:
    """(original, broken): ``values`` with ``other`` at one place and ``before`` at another, and the same
    with ``before`` turned into ``after``."""
    original = np.array(values, np.float32)
    where_other, where_changed = data.draw(st.lists(st.integers(0, len(values) - 1), min_size=2, max_size=2,
                                                    unique=True))
    original[where_other], original[where_changed] = other, before
    broken = original.copy()
    broken[where_changed] = after
    return original, broken


@PROPERTY
@given(st.lists(st.floats(-10, 10, width=32), min_size=3, max_size=20), st.data())
def test_a_change_beside_a_shared_infinity_is_refused(values, data):
    """+inf at one place on both sides made the old check's difference NaN, and NaN > bound is false."""
    original, broken = _changed_beside(values, data, np.inf, 2.0, 200.0)
    with pytest.raises(EquivalenceError, match="differs at"):
        check_output("y", original, broken)


@PROPERTY
@given(st.lists(st.floats(-10, 10, width=32), min_size=3, max_size=20), st.data())
def test_a_large_element_widens_no_other_elements_tolerance(values, data):
    """The old bound was atol + rtol * max|a|: with 1e6 in the output, 1.0 -> 900 passed."""
    original, broken = _changed_beside(values, data, 1e6, 1.0, 900.0)
    with pytest.raises(EquivalenceError, match="differs at"):
        check_output("y", original, broken, original.astype(np.float64))


@pytest.mark.parametrize(("before", "after"), [(np.nan, 0.0), (np.inf, -np.inf), (-np.inf, np.nan), (1.0, np.nan)])
def test_nan_and_infinities_keep_their_place_and_sign(before, after):
    original = np.array([before, 3.0], np.float32)
    broken = np.array([after, 3.0], np.float32)
    with pytest.raises(EquivalenceError, match="NaN/inf positions differ"):
        check_output("y", original, broken)
    assert check_output("y", original, original.copy()).nonfinite == int(not np.isfinite(before))


def test_integer_outputs_must_be_equal_and_shapes_and_dtypes_must_stay():
    with pytest.raises(EquivalenceError, match="integer"):
        check_output("i", np.array([1, 2]), np.array([1, 3]))
    with pytest.raises(EquivalenceError, match="changed from"):
        check_output("y", np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(EquivalenceError, match="changed from"):
        check_output("y", np.zeros(2, np.float32), np.zeros(2, np.float64))


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], dtype: int = TensorProto.FLOAT,
           shape: tuple[int, ...] = (2, 3)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_all_nan_inputs_are_reported_and_other_inputs_checked(tmp_path):
    """All-NaN inputs make NaN == NaN everywhere: the check says so and compares on random inputs, where
    a wrong model is caught."""
    w = numpy_helper.from_array(np.full((3,), 2.0, np.float32), "w")
    good = _model([helper.make_node("Mul", ["x", "w"], ["y"])], [w])
    bad = _model([helper.make_node("Add", ["x", "w"], ["y"])], [w])  # x + 2 is not x * 2
    path = tmp_path / "good.onnx"
    onnx.save(good, path)
    a = open_session(good)
    nan_feeds = {"x": np.full((2, 3), np.nan, np.float32)}
    verdict = verify_against_original(str(path), a, open_session(good), nan_feeds, "--inputs")
    assert verdict.inputs == ["--inputs", "random inputs (draw 1)"]
    assert "not all finite" in verdict.notes[0] and "6 of 6" in verdict.notes[0]
    with pytest.raises(EquivalenceError, match="differs at"):
        verify_against_original(str(path), a, open_session(bad), nan_feeds, "--inputs")


def test_outputs_nan_on_every_input_are_refused_as_unverifiable():
    """sqrt(-1 - x*x) is NaN everywhere: no inputs can check it, and the check says so rather than pass."""
    one = numpy_helper.from_array(np.array(-1.0, np.float32), "one")
    model = _model([helper.make_node("Mul", ["x", "x"], ["s"]), helper.make_node("Sub", ["one", "s"], ["d"]),
                    helper.make_node("Sqrt", ["d"], ["y"])], [one])
    a, b = open_session(model), open_session(model)
    with pytest.raises(NonFiniteReference, match="NaN/inf everywhere on every input tried"):
        check_equivalence(a, b, random_feeds(a, 0), "seed 0", lambda k: random_feeds(a, k))


def test_optimize_with_all_nan_inputs_does_not_claim_a_vacuous_match(tmp_path):
    """``xflow optimize --inputs nan.npz``: the run says the NaN outputs were not a check and verifies on
    random inputs (the old check printed "outputs match the original (max abs diff 0)")."""
    from tests.test_optimize_api import rules_file
    from tests.test_search import LAUNCH_BOUND, shared_input_model

    model = shared_input_model(3)
    src, out, npz = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "nan.npz"
    onnx.save(model, src)
    feeds = random_feeds(open_session(model), 0)
    np.savez(npz, **{k: np.full_like(v, np.nan) for k, v in feeds.items()})
    said: list[str] = []
    options = OptimizeOptions.of(rules_path=rules_file(tmp_path), budget=20, measure=False, inputs_npz=str(npz))
    report = optimize_file(str(src), str(out), options, cost_model=LAUNCH_BOUND, say=said.append)
    assert report.decision == "optimized" and report.verified, report.decision
    assert report.verify_inputs[0] == "--inputs" and len(report.verify_inputs) >= 2
    assert any("on --inputs are not all finite" in line for line in said), said
    assert report.verify_reference.startswith("the original in float64")


def test_float64_reference_runs_ops_without_a_float64_kernel_in_float32(tmp_path):
    """ORT has no float64 Conv: the reference runs it in float32 between casts, and says so."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                    helper.make_node("Tanh", ["c"], ["y"])], [w], shape=(1, 2, 5, 5))
    path = tmp_path / "conv.onnx"
    onnx.save(model, path)
    session, what = float64_reference(str(path))
    assert session is not None and "Conv in float32" in what, what
    x = rng.uniform(-1, 1, (1, 2, 5, 5))
    (wide,) = session.run(None, {"x": x})
    (narrow,) = open_session(model).run(None, {"x": x.astype(np.float32)})
    assert wide.dtype == np.float64
    np.testing.assert_allclose(wide, narrow, rtol=1e-5, atol=1e-6)


def test_cli_names_the_reference_and_the_inputs_compared_on(tmp_path):
    """What `xflow optimize` prints: never "outputs match" for NaN compared with NaN alone."""
    from click.testing import CliRunner

    from tests.test_optimize_api import rules_file
    from tests.test_search import shared_input_model
    from xflow.cli import main

    model = shared_input_model(3, hidden=8)  # launch-bound: the analytic cost merges the matmuls, always
    src, out, npz = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "nan.npz"
    onnx.save(model, src)
    np.savez(npz, x=np.full((4, 8), np.nan, np.float32))
    # --trust-rules: the file's split_split_merge is true but z3 cannot settle it (tests/test_user_rules.py)
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--rules", rules_file(tmp_path), "--inputs",
                                       str(npz), "--keep-if-slower", "--cost", "analytic", "--trust-rules"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "the original's outputs on --inputs are not all finite" in result.output
    assert "compared with the original in float64 on --inputs, random inputs (draw 1))" in result.output


def test_the_float64_reference_is_read_from_files_it_leaves_behind_nothing_of(tmp_path):
    """The float64 copy goes to ORT as a model file with its weights beside it (not as bytes, which would hold the
    copy's weights three times over while the session is built): it computes what the copy computes, the model given
    is unchanged, and the scratch folder is left empty."""
    from xflow.equivalence import float64_reference
    from xflow.onnx_io.widen import widened_external
    from xflow.ort import Sessions

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    before = model.SerializeToString()
    sessions = Sessions(threads=1, scratch=str(tmp_path))
    session, what = float64_reference(model, sessions)
    assert session is not None and what == "the original in float64"
    assert model.SerializeToString() == before and not list(tmp_path.iterdir())
    x = rng.standard_normal((4, 64))
    expected = x @ numpy_helper.to_array(weight).astype(np.float64)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-12)
    wide = widened_external(model, str(tmp_path), "copy")
    assert model.SerializeToString() == before  # the model widened is left as it was
    assert wide.SerializeToString() != before and len(wide.SerializeToString()) < 1024  # its weights are in the file
    assert os.path.getsize(tmp_path / "copy.data") >= 64 * 64 * 8
    path = str(tmp_path / "copy.onnx")
    onnx.save(wide, path)
    np.testing.assert_allclose(Sessions(threads=1).open(path).run(None, {"x": x})[0], expected, rtol=1e-12)
    assert onnx.load(path, load_external_data=False).graph.initializer[0].data_type == TensorProto.DOUBLE


def test_without_a_float64_copy_a_mismatch_is_asked_again_in_another_order_and_still_refused(monkeypatch):
    """A model too large for a float64 copy is compared with the original alone, which states no rounding of its
    own; a mismatch is asked again against the original run without ORT's graph optimizations (a second float32
    evaluation, whose difference from the first measures that rounding). A real change is still refused, and the
    message names the reference it was refused against."""
    weight = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    original = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(weight, "w")],
                      shape=(2, 8))
    changed = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(weight * 1.01, "w")],
                     shape=(2, 8))
    monkeypatch.setattr(equivalence, "MAX_REFERENCE_BYTES", 0)
    session_a, session_b = open_session(original.SerializeToString()), open_session(changed.SerializeToString())
    feeds = random_feeds(session_a, 0)
    with pytest.raises(EquivalenceError, match="differs"):
        verify_against_original(original, session_a, session_b, feeds, "seed 0")
    same = verify_against_original(original, session_a, open_session(original.SerializeToString()), feeds, "seed 0")
    assert "too large" in same.reference and "graph optimizations" not in same.reference  # asked once: it matched
    other = equivalence.other_order_reference(original)
    assert other is not None
    wide = {name: value.astype(np.float64) for name, value in feeds.items()}
    np.testing.assert_array_equal(other.run(None, wide)[0], session_a.run(None, feeds)[0])
