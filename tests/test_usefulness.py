"""Candidates that can fire on real models are found before verification, and are kept by the dedupe."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from xflow.generator.generalize import dedupe, final_name
from xflow.generator.usefulness import match_counts

from xflow.onnx_io import graph_from_model

# x @ w1, x @ w2 -> split(x @ concat(w1, w2)): BERT's Q/K/V projections, NasRNN's gates of one input
SHARED_LHS = {
    "name": "shared_lhs",
    "inputs": {"x1": "any", "w1": "const", "w2": "const"},
    "src": [{"op": "matmul", "in": ["x1", "w1"], "out": ["s0"]},
            {"op": "matmul", "in": ["x1", "w2"], "out": ["s1"]}],
    "dst": [{"op": "concat", "in": ["w1", "w2"], "out": ["d0"], "attrs": {"axis": "=rank(w1) - 1"}},
            {"op": "matmul", "in": ["x1", "d0"], "out": ["d1"]},
            {"op": "split", "in": ["d1"], "out": ["d2", "d3"],
             "attrs": {"axis": "=rank(d1) - 1", "split": "=(dim(w1, -1), dim(w2, -1))"}}],
    "outputs": {"s0": "d2", "s1": "d3"},
    "where": ["rank(w1) == rank(w2)"],
}
# the same text with the shared operand a constant and the others activations
SHARED_CONST_LHS = {
    **SHARED_LHS, "name": "shared_const_lhs", "inputs": {"w1": "const", "x1": "any", "x2": "any"},
    "src": [{"op": "matmul", "in": ["w1", "x1"], "out": ["s0"]},
            {"op": "matmul", "in": ["w1", "x2"], "out": ["s1"]}],
    "dst": [{"op": "concat", "in": ["x1", "x2"], "out": ["d0"], "attrs": {"axis": "=rank(x1) - 1"}},
            {"op": "matmul", "in": ["w1", "d0"], "out": ["d1"]},
            {"op": "split", "in": ["d1"], "out": ["d2", "d3"],
             "attrs": {"axis": "=rank(d1) - 1", "split": "=(dim(x1, -1), dim(x2, -1))"}}],
    "where": ["rank(x1) == rank(x2)"],
}


def _qkv_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("q", "k", "v")]
    weights = [helper.make_tensor(f"w_{n}", TensorProto.FLOAT, [16, 16], np.ones(256, np.float32)) for n in "qkv"]
    nodes = [helper.make_node("MatMul", ["x", f"w_{n}"], [n]) for n in "qkv"]
    graph = helper.make_graph(nodes, "qkv", [x], outs, initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _biased_convs_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")]
    inits = []
    for n in "ab":
        inits.append(helper.make_tensor(f"w_{n}", TensorProto.FLOAT, [4, 4, 1, 1], np.ones(16, np.float32)))
        inits.append(helper.make_tensor(f"b_{n}", TensorProto.FLOAT, [4], np.ones(4, np.float32)))
    nodes = [helper.make_node("Conv", ["x", f"w_{n}", f"b_{n}"], [n]) for n in "ab"]
    graph = helper.make_graph(nodes, "convs", [x], outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


_CONV = {"act": "none", "group": 1, "pads": "?cp", "strides": "?cs"}
CONV_MERGE = {  # as the generator writes it: convs without a bias
    "name": "conv_merge",
    "inputs": {"i1": "any", "k1": "const", "k2": "const"},
    "src": [{"op": "conv", "in": ["i1", "k1"], "out": ["s0"], "attrs": _CONV},
            {"op": "conv", "in": ["i1", "k2"], "out": ["s1"], "attrs": _CONV}],
    "dst": [{"op": "concat", "in": ["k1", "k2"], "out": ["d0"], "attrs": {"axis": "=rank(k1) - 4"}},
            {"op": "conv", "in": ["i1", "d0"], "out": ["d1"], "attrs": _CONV},
            {"op": "split", "in": ["d1"], "out": ["d2", "d3"],
             "attrs": {"axis": "=rank(d1) - 3", "split": "=(dim(k1, -4), dim(k2, -4))"}}],
    "outputs": {"s0": "d2", "s1": "d3"},
    "where": ["rank(k1) == rank(k2)"],
}


def test_match_counts_find_the_qkv_merge_only_with_the_activation_shared():
    graph = graph_from_model(_qkv_model())
    # three matmuls of x: 3 * 2 ordered pairs
    assert match_counts([SHARED_LHS, SHARED_CONST_LHS], [graph]) == [6, 0]


def test_match_counts_see_conv_candidates_through_their_bias_lift():
    graph = graph_from_model(_biased_convs_model())
    assert match_counts([CONV_MERGE], [graph]) == [2]


def test_dedupe_keeps_constant_patterns_neither_of_which_is_more_general():
    # one canonical text; constants at {in1, in2} vs {in0}: both stay, with different names
    both_const = {**SHARED_LHS, "name": "a", "inputs": {"x1": "const", "w1": "const", "w2": "const"}}
    kept = dedupe([SHARED_CONST_LHS, SHARED_LHS, both_const])
    assert sorted(r["name"] for r in kept) == ["shared_const_lhs", "shared_lhs"]
    assert final_name(SHARED_LHS, 3) != final_name(SHARED_CONST_LHS, 3)
    # a pattern needing constants at a superset of another's positions is dropped, whatever the order
    assert [r["name"] for r in dedupe([both_const, SHARED_LHS])] == ["shared_lhs"]

