"""The rule engine: matching (attributes, kinds, outside users, shape preconditions) and applying."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rulebook import CONCAT_SPLIT_CANCEL, CONV_RELU_FOLD, MATMUL_MERGE
from xflow.ir import CycleError
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.rewrite import FailureKind, MatchStatus, MatchTracer, RuleIndex, apply_match, find_matches, plan_match
from xflow.rules import RuleError, parse_rule, rules_from_json

RNG = np.random.default_rng(0)


def make_model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def qkv_model() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", f"W{k}"], [f"m{k}"]) for k in "qkv"]
    nodes += [helper.make_node("Add", [f"m{k}", f"b{k}"], [k]) for k in "qkv"]
    return make_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, [1, 8, 16]) for k in "qkv"],
        [weight(f"W{k}", 16, 16) for k in "qkv"] + [weight(f"b{k}", 16) for k in "qkv"])


def rewrite_all(graph, rule):
    """Apply the first match repeatedly until none is left; returns the graph and the count."""
    count = 0
    while True:
        match = next(find_matches(graph, rule), None)
        if match is None:
            return graph, count
        new = apply_match(graph, match)
        assert new is not None
        graph, count = new, count + 1


def test_qkv_merge_applies_twice_and_keeps_outputs():
    model = qkv_model()
    graph = graph_from_model(model)
    rule = rules_from_json([MATMUL_MERGE])[0]
    matches = list(find_matches(graph, rule))
    assert len(matches) == 6  # 3 pairs x 2 orders
    merged, count = rewrite_all(graph, rule)
    assert count == 2
    assert merged.op_counts()["matmul"] == 1
    assert merged.outputs == graph.outputs
    out = to_model_proto(merged)
    onnx.checker.check_model(out)
    feeds = {"x": RNG.standard_normal((1, 8, 16)).astype(np.float32)}
    for a, b in zip(run(model, feeds), run(out, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_const_kind_and_outside_users_block_matches():
    model = qkv_model()
    # make Wk a runtime input: the const-kind input no longer holds for pairs using it
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "Wk"))
    model.graph.input.append(helper.make_tensor_value_info("Wk", TensorProto.FLOAT, [16, 16]))
    graph = graph_from_model(model)
    rule = rules_from_json([MATMUL_MERGE])[0]
    tracer = MatchTracer()
    matches = list(find_matches(graph, rule, tracer))
    assert len(matches) == 2  # only q/v, in both orders
    refused = [f for f in tracer.failures[rule.name] if f.kind is FailureKind.INPUT_NOT_CONSTANT]
    assert refused and all(f.status is MatchStatus.CONDITION_FAILED for f in refused)
    assert {f.node.inputs[1] for f in refused} == {"Wk"}  # the matmul reading the run-time weight


def test_shape_precondition_rejects_mismatched_rank():
    nodes = [helper.make_node("MatMul", ["x", "A"], ["y1"]), helper.make_node("MatMul", ["x", "B"], ["y2"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                       [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 5]) for n in ("y1", "y2")],
                       [weight("A", 4, 5), weight("B", 2, 4, 5)])
    graph = graph_from_model(model)
    tracer = MatchTracer()
    assert list(find_matches(graph, rules_from_json([MATMUL_MERGE])[0], tracer)) == []
    refused = [f for f in tracer.failures["matmul_merge_shared_lhs"] if f.kind is FailureKind.CONDITION_FALSE]
    assert any(f.subject == "rank(b) == 2" and f.node.op == "matmul" for f in refused)


def conv_relu_model(extra_use: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], group=2),
             helper.make_node("Relu", ["c"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 5, 5])]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 8, 5, 5]))
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])], outputs,
                      [weight("W", 8, 2, 3, 3)])


def test_conv_relu_fold_binds_attributes_and_runs_in_ort():
    model = conv_relu_model(extra_use=False)
    graph = graph_from_model(model)
    rule = rules_from_json([CONV_RELU_FOLD])[0]
    (match,) = find_matches(graph, rule)
    assert match.variables == {"s": (2, 2), "p": (1, 1, 1, 1), "g": 2}
    folded = apply_match(graph, match)
    assert [n.op for n in folded.nodes] == ["conv"]
    assert folded.nodes[0].attrs["act"] == "relu"
    out = to_model_proto(folded)
    feeds = {"x": RNG.standard_normal((1, 4, 10, 10)).astype(np.float32)}
    np.testing.assert_allclose(run(model, feeds)[0], run(out, feeds)[0], rtol=1e-5, atol=1e-5)


def test_internal_value_used_outside_blocks_fold():
    graph = graph_from_model(conv_relu_model(extra_use=True))
    tracer = MatchTracer()
    assert list(find_matches(graph, rules_from_json([CONV_RELU_FOLD])[0], tracer)) == []
    (refused,) = tracer.failures["conv_relu_fold"]
    assert refused.kind is FailureKind.INTERNAL_USED_OUTSIDE and refused.node.op == "conv"
    assert refused.node.outputs == ("c",) and tracer.best("conv_relu_fold") is refused


def concat_split_model(sizes: list[int], as_output: bool) -> onnx.ModelProto:
    split = numpy_helper.from_array(np.array(sizes, dtype=np.int64), "sizes")
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Split", ["c", "sizes"], ["s1", "s2"], axis=1)]
    outs = ["s1", "s2"]
    if not as_output:
        nodes += [helper.make_node("Relu", ["s1"], ["r1"]), helper.make_node("Tanh", ["s2"], ["r2"])]
        outs = ["r1", "r2"]
    return make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                              helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 5])],
                      [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 3] if o.endswith("1") else [2, 5])
                       for o in outs],
                      [split])


@pytest.mark.parametrize("as_output", [False, True])
def test_concat_split_cancel(as_output):
    model = concat_split_model([3, 5], as_output)
    graph = graph_from_model(model)
    (match,) = find_matches(graph, rules_from_json([CONCAT_SPLIT_CANCEL])[0])
    new = apply_match(graph, match)
    ops = [n.op for n in new.nodes]
    assert "concat" not in ops and "split" not in ops
    if as_output:  # graph outputs keep their names through identities
        assert ops.count("identity") == 2
    out = to_model_proto(new)
    onnx.checker.check_model(out)
    feeds = {"a": RNG.standard_normal((2, 3)).astype(np.float32), "b": RNG.standard_normal((2, 5)).astype(np.float32)}
    for x, y in zip(run(model, feeds), run(out, feeds), strict=True):
        np.testing.assert_array_equal(x, y)


def test_concat_split_with_other_sizes_does_not_match():
    graph = graph_from_model(concat_split_model([4, 4], as_output=False))
    assert list(find_matches(graph, rules_from_json([CONCAT_SPLIT_CANCEL])[0])) == []


def test_applier_rejects_cycles():
    # y2 = x @ relu(x @ A): merging the two matmuls that share x would feed the merge its own output
    nodes = [helper.make_node("MatMul", ["x", "A"], ["y1"]), helper.make_node("Relu", ["y1"], ["b"]),
             helper.make_node("MatMul", ["x", "b"], ["y2"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                       [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [4, 4])], [weight("A", 4, 4)])
    graph = graph_from_model(model)
    rule = parse_rule({**MATMUL_MERGE, "name": "m2", "inputs": {"x": "any", "a": "any", "b": "any"}})
    matches = list(find_matches(graph, rule))
    assert matches
    assert all(apply_match(graph, m) is None for m in matches)
    for m in matches:  # the search's check, which builds no graph, says the same
        change = plan_match(graph, m)
        assert graph.creates_cycle(change.removed, change.added)


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["src"][0].update(op="nosuchop"), "unknown op"),
    (lambda r: r["dst"][1].update({"in": ["x", "nothere"]}), "neither a rule input"),
    (lambda r: r["dst"][0].update(attrs={"axis": "?unbound"}), "unbound variable"),
    (lambda r: r["dst"][0].update(attrs={"axis": "=dim(q, 0)"}), "unknown tensor"),
    (lambda r: r.update(outputs={"y1": "z1", "y2": "zz"}), "output map value"),
    (lambda r: r["src"][0].update(attrs={"bogus": 1}), "unknown attribute"),
    (lambda r: r.update(outputs={"y1": "z1", "y3": "z2"}), "not produced by"),
    (lambda r: r.update(inputs={"x": "any", "a": "const", "b": "weird"}), "kind"),
    (lambda r: r["dst"][0].update(attrs={"axis": "=__import__('os')"}), "unknown function"),
])
def test_bad_rules_are_rejected_when_loaded(mutate, message):
    raw = copy.deepcopy(MATMUL_MERGE)
    mutate(raw)
    with pytest.raises(RuleError, match=message):
        parse_rule(raw)


def _walk(graph, rules, steps):
    """A deterministic walk of rewrites (each step the middle match), yielding (graph, match, change)."""
    index = RuleIndex(rules)
    for _ in range(steps):
        matches = index.all_matches(graph)
        if not matches:
            return
        match = matches[len(matches) // 2]
        change = plan_match(graph, match)
        yield graph, match, change
        if graph.creates_cycle(change.removed, change.added):
            return
        graph = graph.derive(change.removed, change.added, change.types)


@pytest.mark.parametrize("name", ["inception_v3", "nasrnn", "squeezenet"])
def test_pending_graph_and_incremental_indexes_equal_a_fresh_build(name):
    from xflow import zoo
    from xflow.rules import load_rules

    graph = graph_from_model(zoo.build(name, small=True))
    rules = load_rules("benchmarks/bench_rules.json") + list(load_rules("rules/default.json"))[:200]
    assert graph.users and graph.by_op  # computed, so derived graphs update them instead of rebuilding
    for parent, _match, change in _walk(graph, rules, 6):
        cyclic = parent.creates_cycle(change.removed, change.added)
        pending = parent.pending(change.removed, change.added, change.types)
        if cyclic:
            with pytest.raises(CycleError):
                pending.build()
            continue
        built = pending.build()
        assert pending.hash_sum == built.hash_sum == built.fresh().hash_sum
        assert pending.size == len(built.nodes)
        fresh = built.fresh()
        assert built.producers == fresh.producers
        assert {k: v for k, v in built.users.items()} == fresh.users
        assert built.by_op == fresh.by_op
        for node in change.added:
            for name_ in (*node.inputs, *node.outputs):
                assert pending.types.get(name_) == built.types.get(name_)
                assert pending.is_constant_value(name_) == fresh.is_constant_value(name_)


def test_rule_index_finds_what_find_matches_finds_in_rule_order():
    from xflow import zoo
    from xflow.rules import load_rules

    graph = graph_from_model(zoo.build("inception_v3", small=True))
    rules = list(load_rules("rules/default.json")) + list(load_rules("benchmarks/bench_rules.json"))
    index = RuleIndex(rules)
    key = lambda ms: [(m.rule.name, tuple(map(id, m.nodes))) for m in ms]  # noqa: E731
    assert key(index.all_matches(graph)) == key(m for r in rules for m in find_matches(graph, r))
    anchor = graph.nodes[::7]
    assert key(index.anchored_matches(graph, anchor)) == key(
        m for r in rules for m in find_matches(graph, r, anchor=anchor))
