"""What keeps a run's memory down: a model file written one weight at a time, folds the finalists share made and
held once, and the original's session handed over to the A/B rather than kept beside its fresh pairs."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rulebook import MATMUL_MERGE
from xflow import heap
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.onnx_io.stream import write_model_file
from xflow.optimize.load import OriginalRun
from xflow.ort import open_session
from xflow.rewrite import find_matches, fold_constants
from xflow.rewrite.apply import apply_match
from xflow.rewrite.fold import FoldMemo
from xflow.rules import rules_from_json
from xflow.runtime import random_feeds


def _model() -> onnx.ModelProto:
    """Two MatMuls of one input by large weights, a float16 weight cast up, a Constant node and a small shape."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), name) for name in "AB"]
    weights.append(numpy_helper.from_array(rng.standard_normal((256,)).astype(np.float16), "h"))
    weights.append(numpy_helper.from_array(np.array([4, 256], np.int64), "shape"))
    nodes = [helper.make_node("MatMul", ["x", "A"], ["ya"]), helper.make_node("MatMul", ["x", "B"], ["yb"]),
             helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
             helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32(0.5), "c")),
             helper.make_node("Mul", ["yb", "c"], ["ybs"]), helper.make_node("Add", ["ybs", "hf"], ["yh"]),
             helper.make_node("Reshape", ["yh", "shape"], ["y2"])]
    model = helper.make_model(helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [helper.make_tensor_value_info("ya", TensorProto.FLOAT, [4, 256]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, [4, 256])], weights),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.metadata_props.add(key="producer-note", value="kept")
    return model


def test_a_model_file_written_a_weight_at_a_time_is_the_model_and_runs_as_it(tmp_path):
    graph = graph_from_model(_model())
    path = str(tmp_path / "m.onnx")
    write_model_file(graph, path)
    assert onnx.load(path) == to_model_proto(graph)  # the same fields, in the order a parser reads them
    onnx.checker.check_model(path)
    feeds = random_feeds(open_session(_model()), 0)
    for got, want in zip(open_session(path).run(None, feeds), open_session(_model()).run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_model_file_that_cannot_be_written_leaves_nothing(tmp_path):
    with pytest.raises(OSError):
        write_model_file(graph_from_model(_model()), str(tmp_path / "missing" / "m.onnx"))
    assert not list(tmp_path.iterdir())


def _merged(graph):  # noqa: ANN001, ANN202 - the graph with the two MatMuls merged (a concat of A and B to fold)
    rule = rules_from_json([MATMUL_MERGE])[0]
    merged = apply_match(graph, next(iter(find_matches(graph, rule))))
    assert merged is not None
    return merged


def test_finalists_sharing_a_fold_hold_one_array_and_the_same_values():
    graph = graph_from_model(_model())
    first, second = _merged(graph), _merged(graph.with_nodes(graph.nodes))  # two finalists, the same weights
    memo = FoldMemo()
    a, b = fold_constants(first, memo=memo), fold_constants(second, memo=memo)
    new = [name for name in a.constants if name not in graph.constants]
    assert new and all(a.constants[n].array is b.constants[n].array for n in new)  # folded once, held once
    alone = fold_constants(first)
    for name in new:
        assert alone.constants[name].array is not a.constants[name].array
        np.testing.assert_array_equal(alone.constants[name].array, a.constants[name].array)
    other = graph_from_model(_model())  # its own weight objects: nothing of the first two is reused
    c = fold_constants(_merged(other), memo=memo)
    assert all(c.constants[n].array is not a.constants[n].array for n in new if n in c.constants)


def test_the_original_s_session_handed_over_is_not_held_and_is_made_again_when_asked_for():
    made: list[object] = []

    def reopen() -> object:
        made.append(object())
        return made[-1]
    first = object()
    run = OriginalRun({}, [], reopen, first)
    assert run.hand_over() is first and run.held is None and not made
    again = run.session
    assert again is made[0] and run.session is again  # made once, then held


def test_handing_the_heap_back_keeps_what_is_alive():
    kept = np.ones(1 << 20)
    dropped = np.ones(1 << 22)
    del dropped
    heap.trim()
    assert kept.sum() == 1 << 20


def test_a_released_original_is_made_again_only_when_asked_for():
    made: list[object] = []
    run = OriginalRun({}, [], lambda: made.append(object()) or made[-1], object())
    run.release()
    assert run.held is None and not made
    assert run.session is made[0]


class _Counting:
    """A session that counts its runs (and answers with its feeds doubled)."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, names, feeds):
        self.runs += 1
        return [2 * np.asarray(feeds["x"])]


def test_the_float64_reference_is_recorded_then_released_and_opened_again_for_other_inputs():
    from xflow.equivalence import RecordedReference

    first, second = _Counting(), _Counting()
    opened: list[_Counting] = []
    recorded = RecordedReference(first, lambda: opened.append(second) or second)
    known = [{"x": np.arange(3.0)}, {"x": np.ones(3)}]
    recorded.record(known)
    assert recorded.session is None and first.runs == 2  # released once its outputs are kept
    for feeds in known:  # answered from the record, the copy not opened again
        np.testing.assert_array_equal(recorded.run(None, {"x": feeds["x"].copy()})[0], 2 * feeds["x"])
    assert not opened
    np.testing.assert_array_equal(recorded.run(None, {"x": np.zeros(3)})[0], np.zeros(3))
    assert opened == [second] and second.runs == 1


def test_a_reference_refusing_an_input_refuses_it_again_when_asked():
    from xflow.equivalence import RecordedReference

    class Refusing:
        def run(self, names, feeds):
            raise RuntimeError("no kernel")
    recorded = RecordedReference(Refusing(), lambda: None)
    recorded.record([{"x": np.ones(2)}])
    with pytest.raises(RuntimeError, match="no kernel"):
        recorded.run(None, {"x": np.ones(2)})


def test_the_optimize_run_times_its_finalists_without_the_original_s_session(monkeypatch):
    """select needs the original's inputs only: its session is let go before the finalists' sessions are made."""
    from xflow.optimize import chain, select

    seen: list[object] = []
    real = select.select

    def watching(finalists, original, sessions, memo=None):
        seen.append((len(finalists), original.held))
        return real(finalists, original, sessions, memo)
    monkeypatch.setattr(chain.select, "select", watching)
    from click.testing import CliRunner

    from xflow.cli import main
    with tempfile.TemporaryDirectory() as folder:
        src = os.path.join(folder, "in.onnx")
        made = CliRunner().invoke(main, ["zoo", "bert", src, "--small"], catch_exceptions=False)
        assert made.exit_code == 0, made.output
        result = CliRunner().invoke(main, ["optimize", src, os.path.join(folder, "out.onnx"), "-q"],
                                    catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert seen and all(held is None for count, held in seen if count > 1), seen
    assert any(count > 1 for count, _ in seen), seen
