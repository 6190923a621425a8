"""Where the estimates see no gain in removing a node (ONNX Runtime fuses or deletes it anyway), the finalists still
include the graph with every node-removing rule applied, and select prefers the simpler of finalists that time
alike: the written model is then as small as the rules can make it (MobileNet-v2: 110 -> 97 nodes, onnxslim's 97)."""

from __future__ import annotations

import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.test_keep_simpler import transpose_pair_model
from xflow.cost import AnalyticCost, GraphCoster
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.optimize.finalize import Finalist, finalists
from xflow.optimize.select import SELECT_TIE, simplest_of_the_fastest
from xflow.rewrite.simplify import simplify_splits
from xflow.rules import load_rules
from xflow.search import SearchLimits, backtracking_search

RULES = os.path.join(os.path.dirname(__file__), "..", "rules")


def _computing() -> Finalist:
    """The transpose pair's model as onnxslim writes it: the four nodes that compute."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Mul", ["s", "r"], ["m"]), helper.make_node("Add", ["m", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "four", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 512])]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return Finalist(simplify_splits(graph_from_model(model)), 0.0, ())


def test_of_finalists_timed_alike_the_one_with_fewest_nodes_is_chosen():
    seven, four = Finalist(simplify_splits(graph_from_model(transpose_pair_model())), 0.0, ()), _computing()
    alike = {0: 1.000, 1: 1.000 * (1 + SELECT_TIE / 2)}
    assert simplest_of_the_fastest(0, alike, [seven, four]) == 1
    apart = {0: 1.000, 1: 1.000 * (1 + 2 * SELECT_TIE)}  # measurably slower: the fastest stays
    assert simplest_of_the_fastest(0, apart, [seven, four]) == 0
    assert simplest_of_the_fastest(0, {0: 1.0}, [seven]) == 0


def test_a_pad_before_a_depthwise_conv_goes_in_a_finalist_though_no_estimate_gains():
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "W"),
               numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("Conv", ["p", "W"], ["y"], group=8, kernel_shape=[3, 3])]
    model = helper.make_model(helper.make_graph(
        nodes, "depthwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], weights),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph = graph_from_model(model)
    rules = load_rules(os.path.join(RULES, "default.json"))
    coster = GraphCoster(AnalyticCost())
    result = backtracking_search(graph, [], coster, SearchLimits(budget=10))  # as if no estimate gained
    found = finalists(result, True, coster, rules)
    written = [[n.op_type for n in to_model_proto(f.graph).graph.node] for f in found]
    assert ["Conv"] in written, written
