"""A transfer policy that reads the fastest baseline's placement (``Policy.hint``) besides the graph."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.test_placement import branches_model, two_gpu
from xflow.cost import AnalyticCost
from xflow.onnx_io import graph_from_model
from xflow.placement.baselines import all_baselines
from xflow.placement.features import BASE_FEATURES
from xflow.placement.groups import make_groups
from xflow.placement.learn import hint_of
from xflow.placement.options import PlaceOptions
from xflow.placement.place import place
from xflow.placement.policy import HINT_FASTEST_BASELINE, Policy
from xflow.placement.problem import build_problem
from xflow.placement.simulator import Simulator
from xflow.placement.topology import topology_from_json
from xflow.placement.train import TrainOptions, TrainTask, graph_input
from xflow.placement.transfer import train_across


def copying_policy(devices: int, hint: str) -> Policy:
    """A policy whose most likely device for a group is the one its current-device columns name: the
    columns pass through the first layer, the rounds add nothing, the readout picks them out."""
    policy = Policy.create(BASE_FEATURES + devices, devices, hidden=8, rounds=1, hint=hint)
    p = policy.params
    for name in p:
        p[name][...] = 0.0
    for d in range(devices):
        p["W0"][BASE_FEATURES + d, d] = 1.0
        p["Wd"][d, d] = 2.0
    return policy


@pytest.fixture(scope="module")
def split_pays():
    """Four parallel branches on two free-link GPUs: m-ETF splits them, one device is twice as slow."""
    graph = graph_from_model(branches_model(width=64, branches=4, depth=3))
    return graph, topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))


def test_a_hinted_policy_reads_the_fastest_baseline_and_an_unhinted_twin_does_not(split_pays):
    graph, topo = split_pays
    options = PlaceOptions(improve_sweeps=0, zero_shot_samples=0, time_limit=0)  # the most likely placement alone
    hinted = place(graph, AnalyticCost(), topo, replace(options, policy=copying_policy(2, HINT_FASTEST_BASELINE)))
    blind = place(graph, AnalyticCost(), topo, replace(options, policy=copying_policy(2, "")))
    fastest = min(hinted.plan.baselines.values())
    assert fastest < hinted.plan.baselines["single:a"]  # the hint is a split, not one device
    assert hinted.plan.rl["seconds"] == fastest
    assert blind.plan.rl["seconds"] > fastest  # without the hint the same network sees zeros: one device


def test_hint_features_are_the_fastest_baselines_devices(split_pays):
    graph, topo = split_pays
    problem = build_problem(graph, AnalyticCost())
    grouping = make_groups(problem, topo)
    sim = Simulator(problem, topo)
    plans = all_baselines(grouping, sim)
    seconds = {k: sim.runtime(v) for k, v in plans.items()}
    hint = hint_of(HINT_FASTEST_BASELINE, grouping, plans, seconds)
    assert np.array_equal(grouping.expand(hint), plans[min(seconds, key=seconds.get)])
    x = graph_input(TrainTask(problem, grouping, sim, hint=hint), 2).x
    assert np.array_equal(x[:, BASE_FEATURES:].argmax(axis=1), hint) and np.all(x[:, BASE_FEATURES:].sum(axis=1) == 1)
    with pytest.raises(ValueError, match="unknown policy hint"):
        hint_of("random", grouping, plans, seconds)


def test_transfer_training_with_a_hint_writes_a_hinted_policy_that_loads_back(tmp_path, split_pays):
    _, topo = split_pays
    graphs = {f"b{i}": graph_from_model(branches_model(width=32, branches=2 + i, seed=i)) for i in range(2)}
    options = PlaceOptions(train=TrainOptions(seed=1, samples=4), transfer_steps=3, transfer_hint=HINT_FASTEST_BASELINE)
    policy, _ = train_across(graphs, topo, options, AnalyticCost())
    assert policy.hint == HINT_FASTEST_BASELINE and policy.copy().hint == HINT_FASTEST_BASELINE
    path = str(tmp_path / "p.npz")
    policy.save(path)
    again, _ = Policy.load(path)
    assert again.hint == HINT_FASTEST_BASELINE and again.params.keys() == policy.params.keys()
    plain, _ = train_across(graphs, topo, PlaceOptions(train=TrainOptions(seed=1, samples=4), transfer_steps=3),
                            AnalyticCost())
    assert plain.hint == ""


def test_a_policy_file_from_before_hints_reads_nothing(tmp_path):
    policy = Policy.create(4, 3, hidden=5)
    path = str(tmp_path / "old.npz")
    np.savez(path, rounds=np.array(policy.rounds), clip=np.array(policy.clip), meta=np.array("{}"), **policy.params)
    again, _ = Policy.load(path)
    assert again.hint == "" and again.params.keys() == policy.params.keys()
