"""A per-column scale after a Linear layer folded into its weight and bias (rules/folded-scales.json, also in
rules/default.json): ConvNeXt's layer scale. Proved from the axiom ``ewmul_matmul_columns``; the written model
computes the same and ONNX Runtime runs no Mul for the scale."""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from xflow.verifier import verify_rule

from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ort import session_options
from xflow.rewrite import apply_match, find_matches, fold_constants
from xflow.rules import load_rules

RULES = os.path.join(os.path.dirname(__file__), "..", "rules", "folded-scales.json")
SHAPE = (1, 7, 16)


def _scaled_linear(bias: bool = True) -> onnx.ModelProto:
    """MatMul, bias Add (optional), then a Mul by a per-column constant, as ConvNeXt's blocks end."""
    rng = np.random.default_rng(2)
    k, n = SHAPE[-1], 24
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "gamma")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"])]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
        nodes.append(helper.make_node("Add", ["m", "b"], ["a"]))
    nodes.append(helper.make_node("Mul", ["a" if bias else "m", "gamma"], ["y"]))
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (*SHAPE[:-1], n))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto, tmp_path) -> tuple[collections.Counter, np.ndarray]:  # noqa: ANN001
    options = session_options(1)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    out = session.run(None, {"x": x})[0]
    return collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node), out


def test_the_rules_are_proved() -> None:
    rules = load_rules(RULES)
    assert len(rules) == 2
    for rule in rules:
        assert verify_rule(rule).status == "proved", rule.name


def test_shifting_the_weight_instead_is_refuted() -> None:
    """x @ (w + g) has the same shape as (x @ w) * g and is another function: the verifier must not prove it."""
    rule = min(load_rules(RULES), key=lambda r: len(r.src))
    wrong = dataclasses.replace(rule, dst=tuple(
        dataclasses.replace(n, op="add") if n.op == "mul" else n for n in rule.dst))
    assert verify_rule(wrong).status != "proved"


def test_the_scale_folds_into_the_linear_layer(tmp_path) -> None:
    for bias in (True, False):
        model = _scaled_linear(bias)
        graph = graph_from_model(model)
        rules = [r for r in load_rules(RULES) if len(r.src) == (3 if bias else 2)]
        match = next(find_matches(graph, rules[0]))
        rewritten = apply_match(graph, match)
        assert rewritten is not None
        written = to_model_proto(fold_constants(rewritten))
        assert "Mul" not in [n.op_type for n in written.graph.node]  # w * g (and b * g) folded into initializers
        before, want = _run(model, tmp_path)
        after, got = _run(written, tmp_path)
        assert before["Mul"] == 1 and after["Mul"] == 0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
