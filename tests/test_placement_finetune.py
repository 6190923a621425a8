"""Where a fine-tune spends its time: a short REINFORCE fine-tune, then an improvement pass that gives most of
its time to the fastest start (docs/lab-notes/2026-11-25-placement-finetune.md)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.test_placement import branches_model
from xflow.cost import AnalyticCost
from xflow.onnx_io import graph_from_model
from xflow.placement.baselines import all_baselines
from xflow.placement.features import BASE_FEATURES
from xflow.placement.groups import make_groups
from xflow.placement.improve import Start, improve_all
from xflow.placement.options import PlaceOptions
from xflow.placement.place import place
from xflow.placement.policy import DECODER_SCHEDULE, Policy
from xflow.placement.problem import build_problem
from xflow.placement.simulator import Simulator
from xflow.placement.topology import load_topology
from xflow.placement.train import TrainOptions, TrainTask


def ticking() -> callable:
    """A clock that advances one "second" per reading: time limits count readings (one per move tried)."""
    ticks = iter(range(10**7))
    return lambda: float(next(ticks))


@pytest.fixture(scope="module")
def eight_branches():
    graph = graph_from_model(branches_model(width=64, branches=8, depth=3))
    topo = load_topology("4xgpu-pcie")
    problem = build_problem(graph, AnalyticCost())
    grouping = make_groups(problem, topo)
    sim = Simulator(problem, topo)
    starts = [Start(k, sim.runtime(p), grouping.project(p)) for k, p in all_baselines(grouping, sim).items()]
    return graph, topo, TrainTask(problem, grouping, sim), starts


@pytest.mark.parametrize("first_share", [0.0, 0.7])
def test_the_fastest_start_gets_its_share_of_the_improvement_pass(eight_branches, first_share):
    _, _, task, starts = eight_branches
    clock = ticking()
    began = clock()
    improved = improve_all(task, starts, deadline=began + 400, clock=clock, first_share=first_share)
    assert len(improved) >= 3
    assert improved[0].start_seconds == min(s.seconds for s in starts)  # fastest first
    spent = [r.spent for r in improved]
    assert sum(spent) == pytest.approx(400, abs=len(spent) + 2)
    if first_share:
        assert spent[0] == pytest.approx(0.7 * 400, abs=3)
        assert max(spent[1:]) < spent[0] / 2
    else:  # equal shares: no start descends from the fastest alone for long
        assert max(spent) == pytest.approx(400 / len(spent), abs=len(spent) + 2)
    for r in improved:
        assert r.seconds <= r.start_seconds


def test_a_fine_tune_trains_briefly_then_descends_mostly_from_its_fastest_start(eight_branches):
    graph, topo, _, _ = eight_branches
    policy = Policy.create(BASE_FEATURES + len(topo.devices), len(topo.devices), hidden=8, seed=0,
                           decoder=DECODER_SCHEDULE)
    limit = 400.0
    options = PlaceOptions(policy=policy, fine_tune=True, time_limit=limit, zero_shot_samples=8,
                           train=TrainOptions(samples=2, time_limit=0, clock=ticking()))
    rl = place(graph, AnalyticCost(), topo, options).plan.rl
    share = 0.65
    assert rl["mode"] == "fine-tuned" and (1 - share) * limit - 20 <= rl["train_seconds"] <= (1 - share) * limit + 2
    spent = rl["improve_seconds"]
    first = next(iter(spent))  # the fastest start, improved first
    total = sum(spent.values())
    assert total >= share * limit - 5
    assert spent[first] >= 0.65 * total  # equal shares over these five starts would give it a fifth
    assert max(v for k, v in spent.items() if k != first) < spent[first] / 4
    # the per-graph pipeline keeps its split: training for 1 - improve_share, equal shares per start
    per_graph = place(graph, AnalyticCost(), topo, replace(options, policy=None, fine_tune=False,
                                                           train=TrainOptions(samples=2, time_limit=0,
                                                                                    clock=ticking()))).plan.rl
    assert per_graph["train_seconds"] >= (1 - PlaceOptions.improve_share) * limit - 20
    spread = list(per_graph["improve_seconds"].values())
    assert max(spread) - min(spread) <= 3 or spread[-1] < min(spread[:-1])  # the last may find the deadline early


def test_fine_tune_settings_are_the_measured_ones():
    options = PlaceOptions()
    assert options.fine_tune_improve_share > options.improve_share
    assert 0 < options.fine_tune_focus < 1  # every start is still improved: the plan is never worse than a baseline
    assert np.isclose(options.improve_share, 0.35)  # the per-graph reference is unchanged
