"""What keeps a run's memory down: a model file written one weight at a time, folds the finalists share made and
held once, and the original's session handed over to the A/B rather than kept beside its fresh pairs."""

from __future__ import annotations

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
