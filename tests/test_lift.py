"""Bias and batchnorm lifts: conv candidates become the forms real models have, and only proved lifts ship."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from xflow.generator.lift import lift_candidate, lift_candidates
from xflow.verifier.batch import verify_candidate
from xflow.verifier.status import OutcomeStatus

from xflow.onnx_io import graph_from_model
from xflow.onnx_io.save import to_model_proto
from xflow.ort import open_session
from xflow.rewrite.apply import apply_match
from xflow.rewrite.fold import fold_constants
from xflow.rewrite.match import find_matches
from xflow.rules import parse_rule

CONV = {"strides": "?s", "pads": "?p", "group": 1, "act": "?act"}

#: Two convs of one input merged into one conv over the concatenated kernels, then split.
MERGE = {
    "name": "merge", "doc": "", "inputs": {"x": "any", "a": "const", "b": "const"},
    "src": [{"op": "conv", "in": ["x", "a"], "out": ["y1"], "attrs": CONV},
            {"op": "conv", "in": ["x", "b"], "out": ["y2"], "attrs": CONV}],
    "dst": [{"op": "concat", "in": ["a", "b"], "out": ["w"], "attrs": {"axis": "=rank(a) - 4"}},
            {"op": "conv", "in": ["x", "w"], "out": ["y"], "attrs": CONV},
            {"op": "split", "in": ["y"], "out": ["z1", "z2"],
             "attrs": {"axis": "=rank(y1) - 3", "split": "=(dim(a, 0), dim(b, 0))"}}],
    "outputs": {"y1": "z1", "y2": "z2"},
    "where": ["dim(a, 1) == dim(b, 1)", "dim(a, 2) == dim(b, 2)", "dim(a, 3) == dim(b, 3)"],
}

#: conv of a sum is the sum of convs: true without a bias, false with one (the bias counts twice).
ADD_INPUTS = {
    "name": "conv_add", "doc": "", "inputs": {"x": "any", "y": "any", "w": "const"},
    "src": [{"op": "conv", "in": ["x", "w"], "out": ["c1"], "attrs": {**CONV, "act": "none"}},
            {"op": "conv", "in": ["y", "w"], "out": ["c2"], "attrs": {**CONV, "act": "none"}},
            {"op": "add", "in": ["c1", "c2"], "out": ["d"]}],
    "dst": [{"op": "add", "in": ["x", "y"], "out": ["s"]},
            {"op": "conv", "in": ["s", "w"], "out": ["c"], "attrs": {**CONV, "act": "none"}}],
    "outputs": {"d": "c"},
    # images of one shape: a broadcast image would make the rule false (see conv_ewadd_input's guard)
    "where": ["rank(x) == 4", "rank(y) == 4", *(f"dim(x, {i}) == dim(y, {i})" for i in range(4))],
}


def _ops(nodes: list[dict]) -> list[str]:
    return [n["op"] for n in nodes]


def test_bias_lift_concatenates_the_biases_like_the_kernels():
    lifted = lift_candidate(MERGE, "bias")
    assert lifted is not None
    assert lifted["inputs"]["b_a"] == "const" and lifted["inputs"]["b_b"] == "const"
    convs = [n for n in lifted["src"] + lifted["dst"] if n["op"] == "conv"]
    assert all(len(n["in"]) == 3 for n in convs)
    bias_concat = [n for n in lifted["dst"] if n["op"] == "concat" and n["in"] == ["b_a", "b_b"]]
    assert bias_concat and bias_concat[0]["attrs"] == {"axis": 0}
    assert lifted["provenance"]["lifted"] == {"from": "merge", "by": "bias"}
    outcome = verify_candidate(lifted)
    assert outcome.status == OutcomeStatus.PROVED, outcome.statuses


def test_batchnorm_lift_is_proved_and_merges_conv_batchnorm_pairs_of_a_real_graph():
    lifted = lift_candidate(MERGE, "batchnorm")
    assert lifted is not None
    assert _ops(lifted["src"]) == ["conv", "batchnorm", "conv", "batchnorm"]
    assert _ops(lifted["dst"]).count("batchnorm") == 1 and _ops(lifted["dst"]).count("concat") == 5
    outcome = verify_candidate(lifted)
    assert outcome.status == OutcomeStatus.PROVED, outcome.statuses
    rule = outcome.rule

    model = _two_conv_bn_model()
    graph = graph_from_model(model)
    matches = list(find_matches(graph, parse_rule(rule)))
    assert matches
    rewritten = fold_constants(apply_match(graph, matches[0]))
    optimized = to_model_proto(rewritten)
    assert [n.op_type for n in optimized.graph.node].count("Conv") == 1
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    before = open_session(model).run(None, feeds)
    after = open_session(optimized).run(None, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_unsound_lift_is_refuted_by_the_verifier():
    assert verify_candidate(ADD_INPUTS).status == OutcomeStatus.PROVED
    lifted = lift_candidate(ADD_INPUTS, "bias")
    assert lifted is not None
    outcome = verify_candidate(lifted)
    assert outcome.status == OutcomeStatus.REFUTED, outcome.statuses


def test_kernels_built_by_other_ops_and_fused_activations_are_not_lifted():
    transposed = json.loads(json.dumps(MERGE))
    transposed["dst"][0] = {"op": "transpose", "in": ["a"], "out": ["w"], "attrs": {"perm": [1, 0, 2, 3]}}
    assert lift_candidate(transposed, "bias") is None
    relu = json.loads(json.dumps(MERGE))
    for node in relu["src"] + relu["dst"]:
        if node["op"] == "conv":
            node["attrs"] = {**node["attrs"], "act": "relu"}
    assert lift_candidate(relu, "batchnorm") is None
    assert lift_candidate(relu, "bias") is not None
    no_conv = {**ADD_INPUTS, "src": ADD_INPUTS["dst"][:1], "dst": ADD_INPUTS["dst"][:1]}
    assert lift_candidates([no_conv]) == []
    with pytest.raises(ValueError):
        lift_candidate(MERGE, "gelu")


def _two_conv_bn_model() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    inits, nodes = [], []
    for i in (1, 2):
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [4, 3, 3, 3],
                                        rng.standard_normal(4 * 3 * 9).astype(np.float32)))
        for p in ("s", "t", "m", "v"):
            values = rng.uniform(0.5, 1.5, 4) if p == "v" else rng.standard_normal(4)
            inits.append(helper.make_tensor(f"{p}{i}", TensorProto.FLOAT, [4], values.astype(np.float32)))
        nodes.append(helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("BatchNormalization", [f"c{i}", f"s{i}", f"t{i}", f"m{i}", f"v{i}"],
                                      [f"y{i}"], epsilon=1e-5))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 4, 8, 8])
                               for i in (1, 2)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


#: A zero pad (top and left) folded into a grouped conv's pads, as the generator found it (a 4-channel image and a
#: depthwise kernel): random shapes drawn by role seldom give a kernel that fits the image's channels and groups.
PAD_INTO_GROUPED_CONV = {
    "name": "pad_into_grouped_conv", "doc": "", "inputs": {"i1": "any", "kd": "const"},
    "src": [{"op": "pad", "in": ["i1"], "out": ["s0"], "attrs": {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "value": 0.0}},
            {"op": "conv", "in": ["s0", "kd"], "out": ["s1"],
             "attrs": {"act": "none", "group": "?cg", "pads": [0, 0, 0, 0], "strides": "?cs"}}],
    "dst": [{"op": "conv", "in": ["i1", "kd"], "out": ["d0"],
             "attrs": {"act": "none", "group": "?cg", "pads": [1, 1, 1, 1], "strides": "?cs"}}],
    "outputs": {"s1": "d0"},
    "provenance": {"found_on": {"i1": [1, 4, 7, 7], "kd": [4, 1, 3, 3]}},
}
#: conv(x, s * k) -> conv(s * x, k): true, but its bias lift scales the bias on one side only.
SCALED_KERNEL = {
    "name": "scaled_kernel", "doc": "", "inputs": {"i1": "any", "kd": "const", "s": "const"},
    "src": [{"op": "smul", "in": ["kd", "s"], "out": ["s0"]},
            {"op": "conv", "in": ["i1", "s0"], "out": ["s1"],
             "attrs": {"act": "none", "group": 4, "pads": "?cp", "strides": "?cs"}}],
    "dst": [{"op": "smul", "in": ["i1", "s"], "out": ["d0"]},
            {"op": "conv", "in": ["d0", "kd"], "out": ["d1"],
             "attrs": {"act": "none", "group": 4, "pads": "?cp", "strides": "?cs"}}],
    "outputs": {"s1": "d1"},
    "provenance": {"found_on": {"i1": [1, 4, 7, 7], "kd": [4, 1, 3, 3], "s": []}},
}


def test_lifts_start_from_the_shapes_the_rule_was_found_on():
    """The new vector inputs get their kernel's output channels in ``found_on``, so the numeric check draws
    near the generator's shapes: without them these lifts had no valid instance ("unchecked": never shipped,
    never refuted)."""
    vectors = {"bias": ["b_kd"], "batchnorm": [f"bn_{p}_kd" for p in ("scale", "shift", "mean", "var")]}
    for kind, names in vectors.items():
        lifted = lift_candidate(PAD_INTO_GROUPED_CONV, kind)
        assert lifted is not None
        found_on = lifted["provenance"]["found_on"]
        assert all(found_on[name] == [4] for name in names), found_on
        outcome = verify_candidate(lifted)
        assert outcome.status == OutcomeStatus.PROVED, (kind, outcome.statuses)
    outcome = verify_candidate(lift_candidate(SCALED_KERNEL, "bias"))
    assert outcome.status == OutcomeStatus.REFUTED and "mismatch" in outcome.reason, outcome.statuses
