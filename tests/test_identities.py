"""Nodes that compute their input (rules/identities.json): a one-input Concat, which transformers' exports write
where a cache of past keys and values would be concatenated (GPT-2: 24 of them) and ONNX Runtime runs as a copy,
a Cast to the type its input has (Llama's `.to(torch.float32)` of float32 tensors), an Identity (ALBERT reads
each shared layer's weights through one: 66), and a product with a constant one (Whisper's attention: 24)."""

from __future__ import annotations

import os

import pytest
from xflow.verifier import AXIOMS, prove_rule, verify_rule

from tests.rewrite_case import rewrite_case
from xflow.rules import load_rules

RULES = os.path.join(os.path.dirname(__file__), "..", "rules")


def _identity(op: str):
    (rule,) = [r for r in load_rules(os.path.join(RULES, "identities.json")) if r.src[0].op == op]
    return rule


def _cancel_concat():
    return _identity("concat")


@pytest.mark.parametrize(("op", "axiom"), [("concat", "concat_single"), ("cast", "cast_same_type"),
                                               ("identity", "identity_elim"), ("smul", "smul_one")])
def test_the_rule_is_shipped_and_proved_from_its_axiom_alone(op: str, axiom: str) -> None:
    rule = _identity(op)
    assert not rule.dst
    shipped = {r.name for r in load_rules(os.path.join(RULES, "default.json"))}
    assert rule.name in shipped
    assert verify_rule(rule).status == "proved"
    without = tuple(a for a in AXIOMS if a.name != axiom)
    # at the budget rules are generated and shipped with (``generate-rules --rlimit 150000``): without its axiom z3
    # searches far longer for a proof that is not there
    assert prove_rule(rule, rlimit=150_000, axioms=without).status != "proved"


def test_a_cast_to_its_inputs_type_goes_and_one_to_another_type_stays() -> None:
    rule = _identity("cast")
    text = """<ir_version: 8, opset_import: ["" : 17]>
norm (float[2,3] x, float[2,3] w) => (float[2,3] y) {{
    c = Cast <to = {to}> (x)
    y = Mul(c, w)
}}"""
    rewrite_case(rule, text.format(to=1), text.format(to=1).replace("c = Cast <to = 1> (x)\n", "")
                 .replace("Mul(c, w)", "Mul(x, w)"), tolerance=0)
    to_half = text.format(to=10).replace("float[2,3] w", "float16[2,3] w").replace("float[2,3] y", "float16[2,3] y")
    rewrite_case(rule, to_half, None)


@pytest.mark.parametrize("one", ["float one = {1.0}", "float[1] one = {1.0}"])
def test_a_product_with_a_constant_one_goes(one: str) -> None:
    """Whisper's attention multiplies Q and K by 1.0 after splitting the heads (24 Muls); x * 1 is x exactly."""
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
scale (float[1,6,8,8] x) => (float[1,6,8,8] y) <{one}> {{
    s = Mul(x, one)
    y = Relu(s)
}}"""
    rewrite_case(_identity("smul"), text, text.replace("    s = Mul(x, one)\n", "").replace("Relu(s)", "Relu(x)"),
                 tolerance=0)
    rewrite_case(_identity("smul"), text.replace("Mul(x, one)", "Mul(one, x)"),
                 text.replace("    s = Mul(x, one)\n", "").replace("Relu(s)", "Relu(x)"), tolerance=0)


@pytest.mark.parametrize("scale", ["<float one = {2.0}>", "<float one = {-1.0}>", ""])
def test_a_product_with_another_constant_or_an_input_stays(scale: str) -> None:
    extra = "" if scale else ", float one"
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
scale (float[1,6,8,8] x{extra}) => (float[1,6,8,8] y) {scale} {{
    s = Mul(x, one)
    y = Relu(s)
}}"""
    rewrite_case(_identity("smul"), text, None)


def _keys_text(concat_is_output: bool, concat: str = "present = Concat <axis = -2> (kt)") -> str:
    """Keys transposed, passed through a one-input Concat (axis -2; the line ``concat``, none when empty), and
    multiplied by the queries; the Concat's output also a graph output where ``concat_is_output`` (a model's
    "present" keys)."""
    present = ", float[1,2,5,4] present" if concat_is_output else ""
    return f"""<ir_version: 8, opset_import: ["" : 17]>
keys (float[1,5,2,4] k, float[1,2,5,4] q, float[1] scale) => (float[1,2,5,5] y{present}) {{
    kt = Transpose <perm = [0, 2, 1, 3]> (k)
    {concat}
    ktt = Transpose <perm = [0, 1, 3, 2]> ({"present" if concat else "kt"})
    scores = MatMul(q, ktt)
    y = Mul(scores, scale)
}}"""


def test_a_one_input_concat_goes_and_the_interface_stays() -> None:
    """Removed where it feeds other nodes; where its value is also a graph output the output keeps its name and
    value (the model's interface is not the rule's to change)."""
    rule = _cancel_concat()
    for concat_is_output in (False, True):
        after = _keys_text(concat_is_output, "present = Identity(kt)" if concat_is_output else "")
        rewrite_case(rule, _keys_text(concat_is_output), after, constants=("scale",), tolerance=0)


def test_a_two_input_concat_is_not_matched() -> None:
    # now the keys twice along the sequence: not an identity
    twice = _keys_text(False, "present = Concat <axis = -2> (kt, kt)").replace("float[1,2,5,5] y", "float[1,2,5,10] y")
    rewrite_case(_cancel_concat(), twice, None, constants=("scale",))


def test_identities_over_a_shared_weight_go_in_every_finalist_though_no_estimate_gains() -> None:
    """ONNX Runtime deletes an Identity when it loads the model, so the search's costs see no gain in removing one;
    the finalize pass removes every node a rule with no right-hand side matches (the model that keeps them is not
    the simpler one), and the rewritten model reads the weight itself."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from xflow.cost import AnalyticCost, GraphCoster
    from xflow.onnx_io import graph_from_model, to_model_proto
    from xflow.optimize.finalize import finalists
    from xflow.search import SearchLimits, backtracking_search

    weight = numpy_helper.from_array(np.eye(8, dtype=np.float32), "W")
    nodes = [helper.make_node("Identity", ["W"], ["w1"]), helper.make_node("Identity", ["W"], ["w2"]),
             helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [weight]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph = graph_from_model(model)
    rules = load_rules(os.path.join(RULES, "identities.json"))
    coster = GraphCoster(AnalyticCost())
    result = backtracking_search(graph, [], coster, SearchLimits(budget=50))  # as if no estimate gained
    (only,) = finalists(result, False, coster, rules)
    written = to_model_proto(only.graph)
    assert [n.op_type for n in written.graph.node] == ["MatMul", "MatMul"]
    assert [list(n.input) for n in written.graph.node] == [["x", "W"], ["h", "W"]]
    assert {s.rule for s in only.steps} == {_identity("identity").name}
    onnx.checker.check_model(written)
