"""Nodes that compute their input (rules/identities.json): a one-input Concat, which transformers' exports write
where a cache of past keys and values would be concatenated (GPT-2: 24 of them) and ONNX Runtime runs as a copy."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from verifier import AXIOMS, prove_rule, verify_rule
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ort import session_options
from xflow.rewrite import apply_match, find_matches
from xflow.rules import load_rules

RULES = os.path.join(os.path.dirname(__file__), "..", "rules")


def _cancel_concat():
    (rule,) = load_rules(os.path.join(RULES, "identities.json"))
    return rule


def _attention_keys(concat_is_output: bool) -> onnx.ModelProto:
    """Keys transposed, passed through a one-input Concat (axis -2), and multiplied by the queries; the Concat's
    output also a graph output where ``concat_is_output`` (a model's "present" keys)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1, 3]),
             helper.make_node("Concat", ["kt"], ["present"], axis=-2),
             helper.make_node("Transpose", ["present"], ["ktt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "ktt"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 2, 5, 5))]
    if concat_is_output:
        outputs.append(helper.make_tensor_value_info("present", TensorProto.FLOAT, (1, 2, 5, 4)))
    graph = helper.make_graph(nodes, "keys", [helper.make_tensor_value_info("k", TensorProto.FLOAT, (1, 5, 2, 4)),
                                              helper.make_tensor_value_info("q", TensorProto.FLOAT, (1, 2, 5, 4))],
                              outputs, [numpy_helper.from_array(rng.uniform(0.1, 1, (1,)).astype(np.float32),
                                                                "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {"k": rng.standard_normal((1, 5, 2, 4)).astype(np.float32),
             "q": rng.standard_normal((1, 2, 5, 4)).astype(np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_the_rule_is_shipped_and_proved_from_its_axiom_alone() -> None:
    rule = _cancel_concat()
    assert rule.readable_name == "cancel-concat" and not rule.dst
    shipped = {r.name for r in load_rules(os.path.join(RULES, "default.json"))}
    assert rule.name in shipped
    assert verify_rule(rule).status == "proved"
    without = tuple(a for a in AXIOMS if a.name != "concat_single")
    assert prove_rule(rule, axioms=without).status != "proved"


def test_a_one_input_concat_goes_and_the_interface_stays() -> None:
    """Removed where it feeds other nodes; where its value is also a graph output the output keeps its name and
    value (the model's interface is not the rule's to change)."""
    rule = _cancel_concat()
    for concat_is_output in (False, True):
        model = _attention_keys(concat_is_output)
        graph = graph_from_model(model)
        rewritten = apply_match(graph, next(find_matches(graph, rule)))
        assert rewritten is not None
        written = to_model_proto(rewritten)
        assert "Concat" not in {n.op_type for n in written.graph.node}
        assert [o.name for o in written.graph.output] == [o.name for o in model.graph.output]
        for got, want in zip(_run(written), _run(model), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_two_input_concat_is_not_matched() -> None:
    model = _attention_keys(False)
    concat = model.graph.node[1]
    concat.input.append("kt")  # now the keys twice along the sequence: not an identity
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 2, 5, 10)))
    assert next(find_matches(graph_from_model(model), _cancel_concat()), None) is None
