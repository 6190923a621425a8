"""The last word before a write: a rewrite that measures slower end to end is reverted, and the run
says so. (How often an identical copy would be kept by chance is measured in
benchmarks/ab_false_positive.py, not here: that is a rate, not a behaviour.)"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper

from xflow.optimize import OptimizeOptions, optimize_file
from xflow.ort import open_session
from xflow.runtime import random_feeds

# relu(x) -> the first half of relu(concat(x, x)): the same values for twice the work plus two copies.
# The condition keeps it from matching its own doubled relu, so the search ends.
RELU_ON_A_DOUBLED_COPY = {
    "name": "relu_on_a_doubled_copy", "inputs": {"x": "any"},
    "src": [{"op": "relu", "in": ["x"], "out": ["y"]}],
    "dst": [{"op": "concat", "in": ["x", "x"], "out": ["c"], "attrs": {"axis": 0}},
            {"op": "relu", "in": ["c"], "out": ["r"]},
            {"op": "split", "in": ["r"], "out": ["z", "z2"], "attrs": {"axis": 0, "split": "=(dim(x, 0), dim(x, 0))"}}],
    "outputs": {"y": "z"}, "where": ["rank(x) == 2", "dim(x, 0) <= dim(x, 1)"]}


class CopiesLookFree:
    """A cost model that gets it wrong: concat, split and relu cost less than nothing, so the search
    takes the doubled relu for a gain and only the end-to-end timing can tell."""

    name = "copies-look-free"
    fuses = False

    def node_costs(self, graph, nodes):  # noqa: ANN001, ANN201 - the CostModel protocol
        return [-1.0 if n.op in ("relu", "concat", "split") else 1.0 for n in nodes]

    def group_costs(self, items):  # noqa: ANN001, ANN201
        return [sum(self.node_costs(graph, group)) for graph, group in items]


def _relu_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 512])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(tmp_path, keep_if_slower: bool):  # noqa: ANN001, ANN202
    rules, src, out = tmp_path / "rules.json", tmp_path / "in.onnx", tmp_path / "out.onnx"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [RELU_ON_A_DOUBLED_COPY]}))
    onnx.save(_relu_model(), src)
    said: list[str] = []
    options = OptimizeOptions.of(rules_path=str(rules), budget=4, branches=0, keep_if_slower=keep_if_slower)
    report = optimize_file(str(src), str(out), options, cost_model=CopiesLookFree(), say=said.append)
    return report, said, onnx.load(str(out))


def test_a_slower_rewrite_is_reverted_and_the_run_says_so(tmp_path):
    report, said, written = _run(tmp_path, keep_if_slower=False)
    assert report.rules_applied == {"relu_on_a_doubled_copy": 1} and report.verified
    assert report.decision == "copied (optimized model was not faster)"
    assert report.outcome == "kept-original-not-faster" and report.copied
    assert [n.op_type for n in written.graph.node] == ["Relu"]
    assert any(line.startswith("the optimized model was not measurably faster") and "the original is" in line
               for line in said), said
    assert report.rank_test_p is not None and report.rank_test_p >= 0.01


def test_keep_if_slower_writes_the_rewrite_and_it_computes_the_same(tmp_path):
    report, _, written = _run(tmp_path, keep_if_slower=True)
    assert report.decision == "optimized"
    assert sorted(n.op_type for n in written.graph.node) == ["Concat", "Relu", "Split"]
    feeds = random_feeds(open_session(_relu_model()), 0)
    np.testing.assert_array_equal(open_session(written).run(None, feeds)[0], np.maximum(feeds["x"], 0))
