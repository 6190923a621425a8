"""Fusion-aware costs: a head and the epilogues ORT fuses into it are costed as one group, and a
derived graph's cost (only the groups around the change re-costed) equals its cost from scratch."""

from __future__ import annotations

import random
import sqlite3

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow import zoo
from xflow.cost import GraphCoster
from xflow.cost.analytic import AnalyticCost
from xflow.cost.cache import CostCache
from xflow.cost.fusion import chain, head_of
from xflow.cost.measured import MeasuredCost
from xflow.onnx_io import graph_from_model
from xflow.rewrite import RuleIndex, plan_match
from xflow.rules import load_rules
from xflow.search.backtrack import SearchLimits, backtracking_search


def conv_block_model(output_bn: bool = False) -> onnx.ModelProto:
    """conv1 -> BatchNormalization -> Relu (a chain ORT fuses), and conv2 whose output feeds a Relu
    and an Add (two readers: no chain)."""
    rng = np.random.default_rng(0)
    channels = 8
    inits = [numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32), w)
             for w in ("w1", "w2")]
    inits += [numpy_helper.from_array((rng.random(channels) + 0.5).astype(np.float32), p)
              for p in ("scale", "bias", "mean", "var")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["b1"], name="bn1"),
             helper.make_node("Relu", ["b1"], ["y1"], name="relu1"),
             helper.make_node("Conv", ["x", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Add", ["c2", "r2"], ["y2"], name="add2")]
    shape = [1, channels, 16, 16]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
               for n in ("y1", "y2", *(("b1",) if output_bn else ()))]
    model = helper.make_model(helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], outputs, inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _by_name(graph, name):  # noqa: ANN001, ANN202
    return next(n for n in graph.nodes if n.outputs[0] == name)


def test_a_conv_heads_its_batchnorm_and_relu_but_not_a_value_with_two_readers():
    graph = graph_from_model(conv_block_model())
    conv1, bn1, relu1 = (_by_name(graph, v) for v in ("c1", "b1", "y1"))
    conv2, relu2 = _by_name(graph, "c2"), _by_name(graph, "r2")
    assert chain(graph, conv1) == (conv1, bn1, relu1)
    assert head_of(graph, relu1) is conv1 and head_of(graph, bn1) is conv1
    assert chain(graph, conv2) == (conv2,)
    assert head_of(graph, relu2) is None


def test_a_graph_output_ends_the_chain():
    graph = graph_from_model(conv_block_model(output_bn=True))
    conv1, bn1, relu1 = (_by_name(graph, v) for v in ("c1", "b1", "y1"))
    assert chain(graph, conv1) == (conv1, bn1)  # b1 must be written: the Relu is not fused after it
    assert head_of(graph, relu1) is None


def test_absorbed_epilogues_add_no_pass_over_memory():
    graph = graph_from_model(conv_block_model())
    fused = GraphCoster(AnalyticCost(fuses=True)).cost(graph)
    plain = GraphCoster(AnalyticCost()).cost(graph)
    assert fused < plain


def test_a_group_is_measured_as_one_subgraph(tmp_path):
    graph = graph_from_model(conv_block_model())
    model = MeasuredCost(cache=CostCache(tmp_path / "c.sqlite"), warmup=1, runs=3)
    total = GraphCoster(model).cost(graph)
    assert total > 0
    # groups: conv1+bn1+relu1, conv2, relu2, add2 -- four subgraphs in one session
    assert model.stats.measured == 4 and model.stats.sessions == 1
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        ops = sorted(op for (op,) in conn.execute("SELECT op FROM costs"))
    assert ops == ["add", "conv", "conv+batchnorm+relu", "relu"]
    # the same graph costs the same from the cache
    again = MeasuredCost(cache=CostCache(tmp_path / "c.sqlite"), warmup=1, runs=3)
    assert GraphCoster(again).cost(graph) == pytest.approx(total)
    assert again.stats.measured == 0


def _walk_and_compare(name: str, steps: int, seeds: int) -> int:
    """Random rewrites of a small zoo model; how many derived costs differ from a fresh costing."""
    index = RuleIndex(load_rules())
    mismatches = 0
    for seed in range(seeds):
        rng = random.Random(seed)
        graph = graph_from_model(zoo.build(name, small=True))
        coster = GraphCoster(AnalyticCost(fuses=True))
        cost = coster.cost(graph)
        for _ in range(steps):
            matches = index.all_matches(graph)
            rng.shuffle(matches)
            change = next((c for c in map(lambda m: plan_match(graph, m), matches)
                           if not graph.creates_cycle(c.removed, c.added)), None)
            if change is None:
                break
            child = graph.derive(change.removed, change.added, change.types)
            cost = coster.derived_cost(graph, cost, child)
            graph = child
            fresh = GraphCoster(AnalyticCost(fuses=True)).cost(graph.fresh())
            if abs(cost - fresh) > 1e-12:
                mismatches += 1
                cost = fresh
    return mismatches


@pytest.mark.parametrize("name", ["inception_v3", "resnet50", "nasrnn"])
def test_derived_fused_costs_equal_fresh_costs(name):
    assert _walk_and_compare(name, steps=6, seeds=2) == 0


def test_every_single_rewrite_of_inception_costs_the_same_derived_and_fresh():
    index = RuleIndex(load_rules())
    graph = graph_from_model(zoo.build("inception_v3", small=True))
    coster = GraphCoster(AnalyticCost(fuses=True))
    base = coster.cost(graph)
    checked = 0
    for match in index.all_matches(graph):
        change = plan_match(graph, match)
        if graph.creates_cycle(change.removed, change.added):
            continue
        pending = graph.pending(change.removed, change.added, change.types)
        derived = coster.derived_cost(graph, base, pending)
        fresh = GraphCoster(AnalyticCost(fuses=True)).cost(graph.derive(change.removed, change.added,
                                                                        change.types).fresh())
        assert derived == pytest.approx(fresh, rel=1e-12, abs=1e-15), match.rule.name
        checked += 1
    assert checked > 20


def test_search_with_fused_costs_reports_the_cost_of_the_graph_it_returns():
    graph = graph_from_model(zoo.build("inception_v3", small=True))
    result = backtracking_search(graph, load_rules(), GraphCoster(AnalyticCost(fuses=True)),
                                 SearchLimits(budget=30, patience=None, branches=0))
    assert result.best_cost == pytest.approx(GraphCoster(AnalyticCost(fuses=True)).cost(result.graph), rel=1e-9)
