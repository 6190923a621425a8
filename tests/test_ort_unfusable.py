"""Forms ONNX Runtime's fusions do not match (rules/ort-unfusable.json, also in rules/default.json): Add -> Sum
before a LayerNormalization (SkipLayerNormFusion), a batched matmul's bias given a leading unit axis
(MatMulAddFusion). The cost model measures what ORT fuses as one group, with what the fusion inserts."""

from __future__ import annotations

import collections
import dataclasses
import os
import sqlite3

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from xflow.verifier import verify_rule

from xflow.cost import GraphCoster
from xflow.cost.cache import CostCache
from xflow.cost.fusion import chain, head_of
from xflow.cost.measured import MeasuredCost, _median_kernel_times
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ort import Sessions, session_options
from xflow.rewrite import apply_match, find_matches, fold_constants
from xflow.rules import load_rules

RULES = os.path.join(os.path.dirname(__file__), "..", "rules", "ort-unfusable.json")
FLOAT = TensorProto.FLOAT
SEQ = (1, 16, 32)


def _residual_block(matmul: bool = True) -> onnx.ModelProto:
    """A post-LN transformer sublayer as exported: MatMul, bias Add, residual Add, LayerNormalization; or
    (``matmul`` false) only the residual Add and the LayerNormalization, as after BERT's embeddings."""
    rng = np.random.default_rng(0)
    hidden = SEQ[-1]
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "beta")]
    nodes = [helper.make_node("Add", ["x", "r"], ["summed"]),
             helper.make_node("LayerNormalization", ["summed", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12)]
    if matmul:
        inits += [numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * 0.1).astype(np.float32), "w"),
                  numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "bias")]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["bias", "mm"], ["biased"]),
                 helper.make_node("Add", ["biased", "r"], ["summed"]), nodes[1]]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info(n, FLOAT, SEQ) for n in ("x", "r")],
                              [helper.make_tensor_value_info("y", FLOAT, SEQ)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _rewrite_all(graph, rules):  # noqa: ANN001, ANN202 - a Graph and parsed rules
    applied = []
    for rule in rules:
        while (match := next(find_matches(graph, rule), None)) is not None:
            new = apply_match(graph, match)
            if new is None:
                break
            graph = new
            applied.append(rule.name)
    return graph, applied


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {n: rng.standard_normal(SEQ).astype(np.float32) for n in ("x", "r")}


def _ort_ops(model: onnx.ModelProto, tmp_path) -> tuple[collections.Counter, np.ndarray]:  # noqa: ANN001
    """The op types ORT runs for ``model`` at ORT_ENABLE_ALL (its optimized model) and the output."""
    options = session_options(1)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    out = session.run(None, _feeds())[0]
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    return collections.Counter(n.op_type for n in optimized.graph.node), out


def test_the_rules_are_proved() -> None:
    rules = load_rules(RULES)
    assert len(rules) == 3
    for rule in rules:
        assert verify_rule(rule).status == "proved", rule.name


def test_a_wrong_target_is_refuted() -> None:
    """The same rule with Sub where Sum is (x - s is not x + s) does not pass the verifier."""
    rule = load_rules(RULES)[0]
    wrong = dataclasses.replace(rule, dst=tuple(dataclasses.replace(n, op="sub") if n.op == "sum" else n
                                                for n in rule.dst))
    assert verify_rule(wrong).status != "proved"


def _layernorm_rules() -> list:
    return [r for r in load_rules(RULES) if any(n.op == "sum" for n in r.dst)]


def _bias_rule():  # noqa: ANN202 - a parsed Rule
    (rule,) = [r for r in load_rules(RULES) if any(n.op == "unsqueeze" for n in r.dst)]
    return rule


def test_the_rule_rewrites_an_add_layernorm_block_that_ort_then_leaves_unfused(tmp_path) -> None:
    model = _residual_block()
    graph = graph_from_model(model)
    rewritten, applied = _rewrite_all(graph, _layernorm_rules())
    assert len(applied) == 1
    assert sorted(n.op for n in rewritten.nodes if n.op in ("add", "sum")) == ["add", "sum"]
    written = to_model_proto(rewritten)
    before, want = _ort_ops(model, tmp_path)
    after, got = _ort_ops(written, tmp_path)
    assert before["SkipLayerNormalization"] == 1 and before["LayerNormalization"] == 0
    assert after["SkipLayerNormalization"] == 0 and after["LayerNormalization"] == 1 and after["Sum"] == 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_wrong_rewrite_would_change_the_outputs(tmp_path) -> None:
    """The check above sees a wrong rewrite: the Sum written as Sub gives other outputs."""
    model = _residual_block()
    rewritten, _ = _rewrite_all(graph_from_model(model), _layernorm_rules())
    written = to_model_proto(rewritten)
    for node in written.graph.node:
        if node.op_type == "Sum":
            node.op_type = "Sub"
    _, want = _ort_ops(model, tmp_path)
    _, got = _ort_ops(written, tmp_path)
    assert not np.allclose(got, want, rtol=1e-5, atol=1e-5)


def _groups(graph) -> list[tuple[str, ...]]:  # noqa: ANN001
    memo: dict = {}
    return sorted(tuple(n.op for n in chain(graph, n, memo)) for n in graph.nodes if head_of(graph, n, memo) is None)


def test_an_add_and_its_layernorm_are_one_group() -> None:
    # a MatMul's chain goes on through the bias and residual Adds into the norm (ORT: Gemm + SkipLayerNorm)
    assert _groups(graph_from_model(_residual_block(matmul=True))) == [("matmul", "add", "add", "layernorm")]
    # an Add no chain absorbs heads one of its own with the norm
    assert _groups(graph_from_model(_residual_block(matmul=False))) == [("add", "layernorm")]
    # after the rewrite the Sum and the norm stand alone, and the MatMul keeps its bias Add
    for matmul, want in ((True, [("layernorm",), ("matmul", "add"), ("sum",)]), (False, [("layernorm",), ("sum",)])):
        rewritten, _ = _rewrite_all(graph_from_model(_residual_block(matmul)), _layernorm_rules())
        assert _groups(rewritten) == want


def test_a_norm_after_anything_but_an_add_stays_out_of_a_chain() -> None:
    model = _residual_block(matmul=True)
    model.graph.node[2].op_type = "Mul"  # biased * r, then the norm
    assert _groups(graph_from_model(model)) == [("layernorm",), ("matmul", "add", "mul")]


def test_a_fused_node_ort_names_afresh_is_charged_to_its_group() -> None:
    events = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
              {"cat": "Node", "name": "xf0n0_kernel_time", "ts": 10, "dur": 5},
              {"cat": "Node", "name": "SkipLayerNormalization_kernel_time", "ts": 20, "dur": 7},
              {"cat": "Node", "name": "ReorderOutput_kernel_time", "ts": 30, "dur": 11}]
    assert _median_kernel_times(events, 0, 2) == {0: pytest.approx(5e-6)}
    times = _median_kernel_times(events, 0, 2, {"SkipLayerNormalization": 1})
    assert times == {0: pytest.approx(5e-6), 1: pytest.approx(7e-6)}


def test_the_add_layernorm_group_is_measured_with_its_fused_kernel(tmp_path) -> None:
    """Measured in one session, the group costs what ORT's SkipLayerNormalization takes (not 0, as a fused
    node named by ORT counted before)."""
    graph = graph_from_model(_residual_block(matmul=False))
    model = MeasuredCost(Sessions(threads=1), cache=CostCache(tmp_path / "c.sqlite"), warmup=1, runs=3)
    GraphCoster(model).cost(graph)
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        costs = dict(conn.execute("SELECT op, seconds FROM costs").fetchall())
    assert costs["add+layernorm"] > 0


def test_sum_decodes_and_round_trips() -> None:
    nodes = [helper.make_node("Sum", ["a", "b"], ["s"]), helper.make_node("Sum", ["a", "b", "a"], ["t"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, FLOAT, (2, 3)) for n in ("a", "b")],
                              [helper.make_tensor_value_info(n, FLOAT, (2, 3)) for n in ("s", "t")])
    ir = graph_from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    ops = {n.outputs[0]: n.op for n in ir.nodes}
    assert ops == {"s": "sum", "t": "opaque"}  # two inputs: the op; three: opaque
    assert [n.op_type for n in to_model_proto(ir).graph.node] == ["Sum", "Sum"]


# ---- a batched matmul's bias given a leading unit axis (MatMulAddFusion) -----------------------------------


def _linear(rank: int = 3, identity_bias: bool = False) -> onnx.ModelProto:
    """A Linear layer as exported: MatMul of an activation of ``rank`` by a weight, then Add of the bias (first,
    as torch writes it; passed on by an Identity, as exports of tied weights do, with ``identity_bias``)."""
    rng = np.random.default_rng(1)
    hidden = SEQ[-1]
    shape = SEQ if rank == 3 else SEQ[1:]
    inits = [numpy_helper.from_array((rng.standard_normal((hidden, 2 * hidden)) * 0.1).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(2 * hidden).astype(np.float32), "bias")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["bias_in" if identity_bias else "bias", "mm"], ["y"])]
    if identity_bias:
        nodes.insert(0, helper.make_node("Identity", ["bias"], ["bias_in"]))
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", FLOAT, shape)],
                              [helper.make_tensor_value_info("y", FLOAT, (*shape[:-1], 2 * hidden))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ort_ops_of(model: onnx.ModelProto, tmp_path, x: np.ndarray) -> tuple[collections.Counter, np.ndarray]:  # noqa: ANN001
    options = session_options(1)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    out = session.run(None, {"x": x})[0]
    return collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node), out


def test_a_batched_linear_bias_rewritten_escapes_ort_gemm_fusion(tmp_path) -> None:
    """The bias written with shape (1, n): the same outputs, and ORT runs MatMul + Add, not Reshape, Gemm,
    Reshape."""
    model = _linear(identity_bias=True)
    rewritten, applied = _rewrite_all(graph_from_model(model), [_bias_rule()])
    assert len(applied) == 1
    written = to_model_proto(fold_constants(rewritten))  # as xflow optimize writes its finalists
    # the unsqueeze of the bias the Identity passes on is folded into a new (1, n) initializer
    assert "Unsqueeze" not in [n.op_type for n in written.graph.node]
    assert [1, 2 * SEQ[-1]] in [list(i.dims) for i in written.graph.initializer]
    x = np.random.default_rng(4).standard_normal(SEQ).astype(np.float32)
    before, want = _ort_ops_of(model, tmp_path, x)
    after, got = _ort_ops_of(written, tmp_path, x)
    assert before["Gemm"] == 1 and before["MatMul"] == 0
    assert after["Gemm"] == 0 and after["MatMul"] == 1 and after["Add"] == 1
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_bias_rule_leaves_a_two_dimensional_linear_alone() -> None:
    """ORT fuses a 2-D MatMul + Add into one Gemm with either bias shape, without copies: nothing to escape."""
    assert next(find_matches(graph_from_model(_linear(rank=2)), _bias_rule()), None) is None
    assert next(find_matches(graph_from_model(_linear(rank=3)), _bias_rule()), None) is not None


def test_a_bias_unsqueezed_on_the_wrong_axis_is_refuted() -> None:
    """(n) -> (n, 1) broadcasts along the other axis: the verifier must not prove that."""
    rule = _bias_rule()
    wrong = dataclasses.replace(rule, dst=tuple(
        dataclasses.replace(n, attrs={**n.attrs, "axes": (1,)}) if n.op == "unsqueeze" else n for n in rule.dst))
    assert verify_rule(wrong).status != "proved"


def test_a_bias_passed_on_by_an_identity_joins_its_matmul_group() -> None:
    """The chain's link skips constant inputs, whichever node passes them on: the Add is the MatMul's
    epilogue (ORT's Gemm), not a group of its own."""
    assert _groups(graph_from_model(_linear(identity_bias=True))) == [("identity",), ("matmul", "add")]
    assert _groups(graph_from_model(_linear(identity_bias=False))) == [("matmul", "add")]


def test_the_reshapes_ort_puts_around_a_fused_gemm_are_charged_to_its_group(tmp_path) -> None:
    """MatMulAddFusion's output Reshape copies the product: the measured group pays for it."""
    from xflow.cost.measured import _renamed_nodes

    optimized = helper.make_model(helper.make_graph([
        helper.make_node("Reshape", ["xf3v_in0", "s"], ["r_arg"], name="gemm_input_reshape"),
        helper.make_node("Gemm", ["r_arg", "w", "b"], ["g_arg"], name="xf3n0/MatMulAddFusion"),
        helper.make_node("Reshape", ["g_arg", "s2"], ["xf3o0"], name="gemm_output_reshape_token_5"),
        helper.make_node("ReorderOutput", ["xf1o0"], ["z"], name="ReorderOutput"),
    ], "g", [], []))
    onnx.save(optimized, tmp_path / "optimized.onnx")
    assert _renamed_nodes(str(tmp_path / "optimized.onnx")) == {"gemm_input_reshape": 3,
                                                                "gemm_output_reshape_token_5": 3}
