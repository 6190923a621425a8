"""The rule engine: matching (attributes, kinds, outside users, shape preconditions) and applying."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rewrite_case import rewrite_case
from tests.rulebook import CONCAT_SPLIT_CANCEL, CONV_RELU_FOLD, MATMUL_MERGE
from xflow.ir import CycleError
from xflow.onnx_io import graph_from_model
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


def qkv_model() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", f"W{k}"], [f"m{k}"]) for k in "qkv"]
    nodes += [helper.make_node("Add", [f"m{k}", f"b{k}"], [k]) for k in "qkv"]
    return make_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, [1, 8, 16]) for k in "qkv"],
        [weight(f"W{k}", 16, 16) for k in "qkv"] + [weight(f"b{k}", 16) for k in "qkv"])


HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
QKV_WEIGHTS = ("Wq", "Wk", "Wv", "bq", "bk", "bv")
QKV_INPUTS = ("float[1,8,16] x, float[16,16] Wq, float[16,16] Wk, float[16,16] Wv, "
              "float[16] bq, float[16] bk, float[16] bv")
QKV = HEADER + f"""qkv ({QKV_INPUTS}) => (float[1,8,16] q, float[1,8,16] k, float[1,8,16] v) {{
    mq = MatMul(x, Wq)
    mk = MatMul(x, Wk)
    mv = MatMul(x, Wv)
    q = Add(mq, bq)
    k = Add(mk, bk)
    v = Add(mv, bv)
}}"""
QKV_MERGED = HEADER + f"""qkv ({QKV_INPUTS}) => (float[1,8,16] q, float[1,8,16] k, float[1,8,16] v)
    <int64[2] vkq = {{16, 32}}, int64[2] kq = {{16, 16}}> {{
    wkq = Concat <axis = 1> (Wk, Wq)
    wvkq = Concat <axis = 1> (Wv, wkq)
    y = MatMul(x, wvkq)
    mv, ykq = Split <axis = 2> (y, vkq)
    mk, mq = Split <axis = 2> (ykq, kq)
    q = Add(mq, bq)
    k = Add(mk, bk)
    v = Add(mv, bv)
}}"""


def test_qkv_merge_applies_twice_and_keeps_outputs():
    graph = graph_from_model(qkv_model())
    rule = rules_from_json([MATMUL_MERGE])[0]
    matches = list(find_matches(graph, rule))
    assert len(matches) == 6  # 3 pairs x 2 orders
    # one matmul after two merges, the outputs' names and values kept
    merged = rewrite_case(rule, QKV, QKV_MERGED, constants=QKV_WEIGHTS, times=2)
    assert next(find_matches(merged, rule), None) is None  # and no third


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


CONV_RELU = HEADER + """conv_relu (float[1,4,10,10] x, float[8,2,3,3] W) => (float[1,8,5,5] y) {
    c = Conv <pads = [1, 1, 1, 1], strides = [2, 2], group = 2> (x, W)
    y = Relu(c)
}"""
CONV_RELU_FOLDED = HEADER + """conv_relu (float[1,4,10,10] x, float[8,2,3,3] W) => (float[1,8,5,5] y) {
    c = Conv <group = 2, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]> (x, W)
    y = Relu(c)
}"""  # the fused activation is written back as a Relu after the Conv


def test_conv_relu_fold_binds_attributes_and_runs_in_ort():
    graph = graph_from_model(conv_relu_model(extra_use=False))
    rule = rules_from_json([CONV_RELU_FOLD])[0]
    (match,) = find_matches(graph, rule)
    assert match.variables == {"s": (2, 2), "p": (1, 1, 1, 1), "g": 2}
    folded = rewrite_case(rule, CONV_RELU, CONV_RELU_FOLDED, constants=("W",))
    assert [n.op for n in folded.nodes] == ["conv"]
    assert folded.nodes[0].attrs["act"] == "relu"


def test_internal_value_used_outside_blocks_fold():
    graph = graph_from_model(conv_relu_model(extra_use=True))
    tracer = MatchTracer()
    assert list(find_matches(graph, rules_from_json([CONV_RELU_FOLD])[0], tracer)) == []
    (refused,) = tracer.failures["conv_relu_fold"]
    assert refused.kind is FailureKind.INTERNAL_USED_OUTSIDE and refused.node.op == "conv"
    assert refused.node.outputs == ("c",) and tracer.best("conv_relu_fold") is refused


def concat_split(sizes: tuple[int, int], as_output: bool) -> str:
    """a [2, 3] and b [2, 5] concatenated and split again into ``sizes``; the pieces are graph outputs where
    ``as_output``, else read by a Relu and a Tanh."""
    outputs = "float[2,3] s1, float[2,5] s2" if as_output else "float[2,3] r1, float[2,5] r2"
    readers = "" if as_output else "r1 = Relu(s1)\n    r2 = Tanh(s2)"
    return HEADER + f"""g (float[2,3] a, float[2,5] b) => ({outputs}) <int64[2] sizes = {{{sizes[0]}, {sizes[1]}}}> {{
    c = Concat <axis = 1> (a, b)
    s1, s2 = Split <axis = 1> (c, sizes)
    {readers}
}}"""


@pytest.mark.parametrize("as_output", [False, True])
def test_concat_split_cancel(as_output):
    # graph outputs keep their names through identities
    cancelled = "s1 = Identity(a)\n    s2 = Identity(b)" if as_output else "r1 = Relu(a)\n    r2 = Tanh(b)"
    outputs = "float[2,3] s1, float[2,5] s2" if as_output else "float[2,3] r1, float[2,5] r2"
    after = HEADER + f"g (float[2,3] a, float[2,5] b) => ({outputs}) {{\n    {cancelled}\n}}"
    rewrite_case(CONCAT_SPLIT_CANCEL, concat_split((3, 5), as_output), after, tolerance=0)


def test_concat_split_with_other_sizes_does_not_match():
    rewrite_case(CONCAT_SPLIT_CANCEL, concat_split((4, 4), as_output=False), None)


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
