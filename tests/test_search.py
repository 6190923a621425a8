"""The backtracking search: finds improving rewrites, dedups, respects budgets; folding."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rulebook import ALL, CONV_RELU_FOLD, MATMUL_MERGE, SPLIT_SPLIT_MERGE
from xflow.cost import AnalyticCost, GraphCoster
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.rewrite import fold_constants
from xflow.rules import rules_from_json
from xflow.search import SearchLimits, backtracking_search, complete_sweeps


def limits(**given: object) -> SearchLimits:
    """Search limits as these tests were written for (no patience, no branches), ``given`` over them."""
    return SearchLimits(**{"patience": None, "branches": 0, **given})  # type: ignore[arg-type]


def assert_same_outputs(model: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """Both models give the same outputs in ORT on one random x of shape (4, 64)."""
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    a = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    b = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-3)


def shared_input_model(n: int, hidden: int = 64) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", f"W{k}"], [f"y{k}"]) for k in range(n)]
    inits = [numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), f"W{k}")
             for k in range(n)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, hidden])],
                              [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [4, hidden])
                               for k in range(n)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# An overhead-dominated model: launching a kernel costs more than moving the bytes.
LAUNCH_BOUND = AnalyticCost(overhead_seconds=1e-3)


class KernelCount:
    """Costs for tests of the search's moves: 1 per kernel, a tenth for a split (a view in some
    runtimes), nothing for a node folded into a constant. Merging two matmuls then pays at once."""

    name = "kernels"
    fuses = False

    def node_costs(self, graph, nodes):  # noqa: ANN001, ANN201 - the CostModel protocol
        from xflow.cost.base import is_folded

        return [0.0 if is_folded(graph, n) else 0.1 if n.op == "split" else 1.0 for n in nodes]

    def group_costs(self, items):  # noqa: ANN001, ANN201
        return [sum(self.node_costs(graph, group)) for graph, group in items]


def test_search_merges_three_parallel_matmuls_and_output_matches_ort():
    model = shared_input_model(3)
    graph = graph_from_model(model)
    rules = rules_from_json([MATMUL_MERGE, SPLIT_SPLIT_MERGE])
    result = backtracking_search(graph, rules, GraphCoster(LAUNCH_BOUND), limits(budget=300))
    assert result.best_cost < result.initial_cost
    counts = result.graph.op_counts()
    assert counts["matmul"] == 1 and counts["split"] == 1
    folded = fold_constants(result.graph)
    assert "concat" not in folded.op_counts()  # weight concats became initializers
    out = to_model_proto(folded)
    onnx.checker.check_model(out)
    assert_same_outputs(model, out)


def test_search_dedups_graphs_reached_in_different_orders():
    graph = graph_from_model(shared_input_model(3))
    result = backtracking_search(graph, rules_from_json([MATMUL_MERGE]), GraphCoster(LAUNCH_BOUND),
                                 limits(budget=1000, alpha=10.0))
    assert result.stop_reason == "exhausted"
    # 3 matmuls: pairwise merges in any order reach a small, finite set of distinct graphs
    assert result.generated < 100


def test_budget_and_no_rules_stop_reasons():
    graph = graph_from_model(shared_input_model(4))
    coster = GraphCoster(LAUNCH_BOUND)
    once = backtracking_search(graph, rules_from_json([MATMUL_MERGE]), coster, limits(budget=1))
    assert once.stop_reason == "budget"
    none = backtracking_search(graph, [], coster, limits(budget=1000))
    assert none.stop_reason == "no-rules" and none.graph is graph


def test_incremental_hash_and_cost_agree_with_full_recomputation():
    graph = graph_from_model(shared_input_model(3))
    coster = GraphCoster(LAUNCH_BOUND)
    result = backtracking_search(graph, rules_from_json([MATMUL_MERGE]), coster, limits(budget=50))
    g = result.graph
    fresh = type(g)(g.nodes, g.inputs, g.outputs, g.types, g.constants, g.context)
    assert fresh.hash_sum == g.hash_sum
    assert abs(GraphCoster(LAUNCH_BOUND).cost(fresh) - result.best_cost) < 1e-12


@pytest.mark.parametrize("name", ["inception_v3", "nasrnn", "bert"])
def test_incremental_matching_finds_every_match_of_the_child(name):
    """derived_matches (parent matches away from the change + matches around it) = matching the whole
    child anew, along a walk of rewrites with the dev rules and shipped rules."""
    from xflow import zoo
    from xflow.rewrite import RuleIndex, plan_match
    from xflow.rules import load_rules
    from xflow.search.backtrack import derived_matches

    graph = graph_from_model(zoo.build(name, small=True))
    rules = list(load_rules("benchmarks/bench_rules.json")) + list(load_rules("rules/default.json"))
    index = RuleIndex(rules)
    key = lambda ms: sorted((m.rule.name, tuple(map(id, m.nodes))) for m in ms)  # noqa: E731
    matches = index.all_matches(graph)
    for step in range(5):
        if not matches:
            break
        match = matches[(7 * step) % len(matches)]
        change = plan_match(graph, match)
        if graph.creates_cycle(change.removed, change.added):
            break
        child = graph.derive(change.removed, change.added, change.types)
        matches = derived_matches(graph, matches, match, child, index)
        assert key(matches) == key(index.all_matches(child))
        graph = child


def test_search_result_is_the_same_in_every_run():
    graph = graph_from_model(shared_input_model(5))
    rules = rules_from_json([MATMUL_MERGE, SPLIT_SPLIT_MERGE])
    runs = [backtracking_search(graph, rules, GraphCoster(LAUNCH_BOUND), limits(budget=50)) for _ in range(2)]
    assert runs[0].steps == runs[1].steps and runs[0].best_cost == runs[1].best_cost
    assert runs[0].graph.structural_hash == runs[1].graph.structural_hash
    assert (runs[0].explored, runs[0].generated) == (runs[1].explored, runs[1].generated)


def conv_relu_model(chains: int) -> onnx.ModelProto:
    """``chains`` Conv -> Relu chains reading one image, each with its own kernel."""
    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    for k in range(chains):
        nodes.append(helper.make_node("Conv", ["x", f"K{k}"], [f"c{k}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"y{k}"]))
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), f"K{k}"))
        outputs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [1, 4, 8, 8]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_sweep_rewrites_every_copy_of_a_repeated_pattern_in_one_expansion():
    model = conv_relu_model(4)
    graph = graph_from_model(model)
    rules = rules_from_json([CONV_RELU_FOLD])
    swept = backtracking_search(graph, rules, GraphCoster(LAUNCH_BOUND), limits(budget=1))
    single = backtracking_search(graph, rules, GraphCoster(LAUNCH_BOUND), limits(budget=1, sweep=False))
    assert single.graph.op_counts().get("relu") == 3  # one fold per expansion
    assert "relu" not in swept.graph.op_counts() and len(swept.steps) == 4
    assert swept.best_cost < single.best_cost
    out = to_model_proto(fold_constants(swept.graph))
    onnx.checker.check_model(out)
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    got = ort.InferenceSession(out.SerializeToString()).run([o.name for o in model.graph.output], {"x": x})
    for u, v in zip(want, got, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-4)


def test_matches_of_a_swept_graph_derive_from_its_parent():
    """The sweep child's matches come from its parent's through the combined change: the same as
    matching the swept graph anew."""
    from xflow.rewrite import RuleIndex
    from xflow.search.backtrack import _sweep, derived_matches

    graph = graph_from_model(conv_relu_model(3))
    index = RuleIndex(ALL)
    matches = index.all_matches(graph)
    folds = [m for m in matches if m.rule.name == CONV_RELU_FOLD["name"]]
    swept = _sweep(graph, 1.0, folds, index, GraphCoster(LAUNCH_BOUND), cap=100)
    assert swept is not None and len(swept.applied) == 3
    key = lambda ms: sorted((m.rule.name, tuple(map(id, m.nodes))) for m in ms)  # noqa: E731
    assert key(derived_matches(graph, matches, swept.applied[-1], swept.graph, index, swept.change)) == \
        key(index.all_matches(swept.graph))


def test_patience_stops_a_search_that_no_longer_improves():
    graph = graph_from_model(conv_relu_model(3))
    rules = rules_from_json([CONV_RELU_FOLD])
    result = backtracking_search(graph, rules, GraphCoster(LAUNCH_BOUND),
                                 limits(budget=1000, alpha=10.0, patience=2))
    assert result.stop_reason == "patience"
    assert "relu" not in result.graph.op_counts()  # every fold was found before it stopped
    assert result.explored <= 4


def test_patience_waits_for_the_first_cheaper_graph():
    """Merging two of three matmuls costs more; only the second merge and the split merge pay off. A search
    with patience 1 still crosses that plateau: patience counts from the first cheaper graph."""
    graph = graph_from_model(shared_input_model(3))
    rules = rules_from_json([MATMUL_MERGE, SPLIT_SPLIT_MERGE])
    result = backtracking_search(graph, rules, GraphCoster(LAUNCH_BOUND), limits(budget=300, patience=1))
    assert result.best_cost < result.initial_cost
    assert result.graph.op_counts()["matmul"] == 1


def test_sweep_rounds_merge_all_eight_matmuls_sharing_an_input_in_one_expansion():
    """A pairwise merge swept in rounds merges the merged pairs again within the same expansion: one
    expansion of the input graph ends with one matmul instead of four."""
    model = shared_input_model(8)
    graph = graph_from_model(model)
    rules = rules_from_json([MATMUL_MERGE])
    one_round = backtracking_search(graph, rules, GraphCoster(KernelCount()), limits(budget=1, sweep_rounds=1))
    rounds = backtracking_search(graph, rules, GraphCoster(KernelCount()), limits(budget=1))
    assert one_round.graph.op_counts()["matmul"] == 4
    assert rounds.graph.op_counts()["matmul"] == 1 and len(rounds.steps) == 7
    assert rounds.best_cost < one_round.best_cost
    assert_same_outputs(model, to_model_proto(fold_constants(rounds.graph)))


def test_sweeps_pair_copies_alike():
    """Equally cheap matches are swept in graph order, so two copies of one structure (two inputs each
    read by four matmuls) are merged into weights concatenated in the same order."""
    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    for x in ("x", "z"):
        for k in range(4):
            nodes.append(helper.make_node("MatMul", [x, f"W{k}"], [f"{x}{k}"]))
            outputs.append(helper.make_tensor_value_info(f"{x}{k}", TensorProto.FLOAT, [4, 64]))
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), f"W{k}") for k in range(4)]
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, 64]) for x in ("x", "z")]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    result = backtracking_search(graph_from_model(model), rules_from_json([MATMUL_MERGE]),
                                 GraphCoster(KernelCount()), limits(budget=1))
    matmuls = [n for n in result.graph.nodes if n.op == "matmul"]
    assert len(matmuls) == 2 and matmuls[0].inputs[1] == matmuls[1].inputs[1]  # one concatenated weight


def two_part_model() -> onnx.ModelProto:
    """Four matmuls sharing an input, and two conv -> relu chains on an image."""
    mm, conv = shared_input_model(4), conv_relu_model(2)
    renamed = {"x": "image", "y0": "r0", "y1": "r1"}  # the two models' names apart
    for node in conv.graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        node.output[:] = [renamed.get(o, o) for o in node.output]
    for value in (*conv.graph.input, *conv.graph.output):
        value.name = renamed[value.name]
    graph = helper.make_graph([*mm.graph.node, *conv.graph.node], "g", [*mm.graph.input, *conv.graph.input],
                              [*mm.graph.output, *conv.graph.output], [*mm.graph.initializer, *conv.graph.initializer])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_branches_search_on_from_the_first_sweeps_the_best_graph_did_not_take():
    graph = graph_from_model(two_part_model())
    rules = rules_from_json([MATMUL_MERGE, CONV_RELU_FOLD])
    plain = backtracking_search(graph, rules, GraphCoster(KernelCount()), limits(budget=50))
    result = backtracking_search(graph, rules, GraphCoster(KernelCount()), limits(budget=50, branches=2))
    assert plain.branches == [] and len(result.root_sweeps) == 2
    assert result.best_cost == plain.best_cost
    (branch,) = result.branches
    first_rules = {sweep.steps[0].rule for sweep in result.root_sweeps}
    assert first_rules == {MATMUL_MERGE["name"], CONV_RELU_FOLD["name"]}
    assert branch.steps[0].rule != result.steps[0].rule  # it started from the other sweep
    assert branch.cost == pytest.approx(result.best_cost)  # and got as far: every fold and merge
    assert branch.graph.op_counts() == result.graph.op_counts()


class SplitsCostLikeKernels(KernelCount):
    """Every kernel costs 1, splits too: merging two matmuls (matmul + split) costs what they cost."""

    def node_costs(self, graph, nodes):  # noqa: ANN001, ANN201
        return [1.0 if c else 0.0 for c in super().node_costs(graph, nodes)]


def test_a_sweep_with_a_limit_crosses_a_plateau_and_the_search_keeps_it_only_if_it_ends_cheaper():
    from xflow.rewrite import RuleIndex
    from xflow.search.backtrack import _sweep

    graph = graph_from_model(shared_input_model(8))
    index = RuleIndex(rules_from_json([MATMUL_MERGE]))
    coster = GraphCoster(SplitsCostLikeKernels())
    matches = index.all_matches(graph)  # each one a plateau: within 1.05 of the cost, not below it
    relaxed = _sweep(graph, coster.cost(graph), matches, index, coster, cap=100, rounds=8, limit=1.05)
    assert relaxed is not None
    assert relaxed.graph.op_counts()["matmul"] == 1  # every round taken, each one a plateau
    assert relaxed.cost == pytest.approx(coster.cost(graph))  # 1 matmul + 7 splits: no cheaper
    result = backtracking_search(graph, index.rules, coster, limits(budget=5))  # the sweep is no better: not kept
    assert result.best_cost == pytest.approx(result.initial_cost) and not result.steps


class WideMatmulsCostMore(KernelCount):
    """A matmul costs its column count squared (in units of 64): merging two of them never looks cheaper."""

    def node_costs(self, graph, nodes):  # noqa: ANN001, ANN201
        base = super().node_costs(graph, nodes)
        return [(graph.types[n.outputs[0]].shape[-1] / 64) ** 2 if n.op == "matmul" and c else c
                for n, c in zip(nodes, base, strict=True)]


def test_complete_sweeps_applies_a_rule_at_every_match_whatever_the_costs_say():
    model = shared_input_model(8)
    graph = graph_from_model(model)
    rules = rules_from_json([MATMUL_MERGE])
    coster = GraphCoster(WideMatmulsCostMore())
    assert not backtracking_search(graph, rules, coster, limits(budget=20)).steps  # no merge looks cheaper
    completed = complete_sweeps(graph, coster.cost(graph), rules, coster)
    assert completed is not None and len(completed.steps) == 7
    assert completed.graph.op_counts()["matmul"] == 1
    assert completed.cost > coster.cost(graph)  # dearer by the estimate: end-to-end timing decides
    assert_same_outputs(model, to_model_proto(fold_constants(completed.graph)))
    assert complete_sweeps(graph, coster.cost(graph), rules_from_json([CONV_RELU_FOLD]), coster) is None


def test_optimize_times_the_completion_of_the_best_graph_as_a_finalist():
    """A search cut short (one sweep round) ends with four of eight matmuls merged in pairs; the finalists
    are that graph and its completion, with every matmul merged into one."""
    from xflow.optimize.finalize import finalists

    graph = graph_from_model(shared_input_model(8))
    rules = rules_from_json([MATMUL_MERGE])
    coster = GraphCoster(KernelCount())
    result = backtracking_search(graph, rules, coster, limits(budget=1, sweep_rounds=1))
    assert result.graph.op_counts()["matmul"] == 4
    best, completion = finalists(result, True, coster, rules)
    assert not best.completed and best.simplified.graph.op_counts()["matmul"] == 4
    assert completion.completed and completion.simplified.graph.op_counts()["matmul"] == 1
    assert completion.steps[:len(result.steps)] == result.steps and len(completion.steps) == 7


def test_a_first_sweep_the_best_graph_did_not_take_is_timed_alone_and_on_the_best_graph():
    """The search's best graph merges the matmuls; the conv-relu folds' first sweep is a finalist as it is,
    and the best graph with the folds applied too (the two gains add up end to end when both are real)."""
    from xflow.optimize.finalize import finalists

    graph = graph_from_model(two_part_model())
    rules = rules_from_json([MATMUL_MERGE, CONV_RELU_FOLD])
    coster = GraphCoster(KernelCount())
    result = backtracking_search(graph, rules, coster, limits(budget=1))  # one expansion: one sweep kept
    assert {s.rule for s in result.steps} == {MATMUL_MERGE["name"]}
    assert {s.steps[0].rule for s in result.root_sweeps} == {MATMUL_MERGE["name"], CONV_RELU_FOLD["name"]}

    def shape(finalist) -> tuple[int, int]:  # noqa: ANN001 - (matmuls, relus) of a finalist
        counts = finalist.simplified.graph.op_counts()
        return counts.get("matmul", 0), counts.get("relu", 0)

    found = [shape(f) for f in finalists(result, True, coster, rules)]
    assert found[0] == (1, 2)  # the best graph
    assert (4, 0) in found  # the folds' sweep alone, on the input
    assert (1, 0) in found  # and on the best graph


def test_folding_keeps_one_copy_of_equal_new_constants():
    """Two rewrites that concatenated the same weights in the same order under different names: the
    folded model holds that weight once, read by both matmuls."""
    from xflow.ir import Node, TensorType
    from xflow.ops import OPS

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", f"V{k}"], [f"y{k}"]) for k in range(2)]
    inits = [numpy_helper.from_array(w, "W")] + [numpy_helper.from_array(np.concatenate([w, w], 1), f"V{k}")
                                                   for k in range(2)]
    graph = graph_from_model(helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [2, 8]) for k in range(2)], inits),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    axis1 = OPS["concat"].normalize_attrs({"axis": 1})
    rewritten = graph.with_nodes(
        [Node("concat", ("W", "W"), (f"c{k}",), axis1) for k in range(2)]
        + [Node("matmul", ("x", f"c{k}"), (f"y{k}",)) for k in range(2)],
        types={f"c{k}": TensorType(TensorProto.FLOAT, (4, 8)) for k in range(2)})
    folded = fold_constants(rewritten)
    assert [n.op for n in folded.nodes] == ["matmul", "matmul"]
    assert folded.nodes[0].inputs[1] == folded.nodes[1].inputs[1]
    assert sum(c.type.shape == (4, 8) for c in folded.constants.values()) == 1
    # the same when the second copy is folded later (simplify_splits permutes a weight after the search's fold)
    one = fold_constants(rewritten.with_nodes([n for n in rewritten.nodes if "c1" not in (*n.inputs, *n.outputs)]
                                              + [Node("matmul", ("x", "c0"), ("y1",))]))
    (kept,) = [k for k, c in one.constants.items() if c.type.shape == (4, 8)]
    again = fold_constants(one.with_nodes(
        [n for n in one.nodes if n.outputs != ("y1",)]
        + [Node("concat", ("W", "W"), ("c1",), axis1), Node("matmul", ("x", "c1"), ("y1",))],
        types={"c1": TensorType(TensorProto.FLOAT, (4, 8))}, constants={"W": rewritten.constants["W"]}))
    assert [n.inputs[1] for n in again.nodes] == [kept, kept]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    got = ort.InferenceSession(to_model_proto(folded).SerializeToString()).run(None, {"x": x})
    for y in got:
        np.testing.assert_allclose(y, x @ np.concatenate([w, w], 1), rtol=1e-5, atol=1e-5)
