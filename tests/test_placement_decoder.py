"""The schedule decoder (``Policy.decoder``): groups placed one by one, reading the partial schedule."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.test_placement import assert_gradients_match, branches_model, two_gpu
from xflow.cost import AnalyticCost
from xflow.onnx_io import graph_from_model
from xflow.placement.features import BASE_FEATURES, DECODER_FEATURES, Schedule, schedule_view
from xflow.placement.groups import make_groups
from xflow.placement.learn import transfer_options
from xflow.placement.options import PlaceOptions
from xflow.placement.place import place
from xflow.placement.policy import DECODER_SCHEDULE, GraphInput, Policy, policy_gradient
from xflow.placement.problem import build_problem
from xflow.placement.simulator import Simulator
from xflow.placement.topology import topology_from_json
from xflow.placement.train import TrainOptions, TrainTask, graph_input, place_with
from xflow.placement.transfer import train_across


def small_input(rng: np.random.Generator) -> GraphInput:
    """Seven groups (a diamond, then a fork and a join), three devices, one device not allowed for one group."""
    groups, features, devices = 7, 5, 3
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5), (4, 6), (5, 6)]
    pred, succ = np.zeros((groups, groups)), np.zeros((groups, groups))
    preds: list[list] = [[] for _ in range(groups)]
    for a, b in edges:
        pred[b, a] = succ[a, b] = 1.0
        seconds = rng.uniform(0.2, 1.0, (devices, devices))
        np.fill_diagonal(seconds, 0.0)
        preds[b].append((a, seconds, 100.0 * (a + 1)))
    allowed = np.ones((groups, devices), dtype=bool)
    allowed[2, 1] = False
    schedule = Schedule(rng.uniform(1, 3, (groups, devices)), tuple(tuple(p) for p in preds), 1.5)
    return GraphInput(rng.standard_normal((groups, features)), pred, succ, allowed, schedule)


def test_schedule_decoder_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    inp = small_input(rng)
    policy = Policy.create(5, 3, hidden=8, seed=1, decoder=DECODER_SCHEDULE)
    for k, v in policy.params.items():  # non-zero everywhere so every path carries gradient
        policy.params[k] = v + rng.normal(0, 0.3, v.shape)
    bias = rng.normal(size=(7, 3))
    actions, logp, cache = policy.decode(inp, 4, np.random.default_rng(3), bias)
    advantages = rng.normal(size=4)
    assert not inp.allowed[2, 1] or (actions[:, 2] != 1).all()

    def loss() -> float:  # the sampled devices fixed: REINFORCE differentiates log-probabilities, not choices
        _, lp, _ = policy.decode(inp, 4, bias=bias, actions=actions)
        return sum(policy_gradient(lp[s], actions[s:s + 1], advantages[s:s + 1], inp.allowed, 0.05)[0]
                   for s in range(4)) / 4

    dlogits = np.stack([policy_gradient(logp[s], actions[s:s + 1], advantages[s:s + 1], inp.allowed, 0.05)[1]
                        for s in range(4)]) / 4
    grads = policy.backward_decode(inp, cache, dlogits)
    assert {"v", "U"} <= grads.keys()
    assert_gradients_match([*policy.params.items(), ("bias", bias)], grads, loss)


def test_teacher_forcing_decodes_the_given_devices():
    rng = np.random.default_rng(2)
    inp = small_input(rng)
    policy = Policy.create(5, 3, hidden=8, seed=1, decoder=DECODER_SCHEDULE)
    given = np.array([[0, 1, 2, 0, 1, 2, 0], [2, 2, 0, 1, 0, 1, 1]])
    actions, logp, _ = policy.decode(inp, 2, actions=given)
    assert np.array_equal(actions, given) and logp.shape == (2, 7, 3)
    assert np.allclose(np.exp(logp).sum(axis=2), 1.0) and (np.exp(logp[:, 2, 1]) < 1e-12).all()


@pytest.fixture(scope="module")
def four_branches():
    """Four parallel branches on two free-link GPUs: splitting them halves the step."""
    graph = graph_from_model(branches_model(width=64, branches=4, depth=3))
    topo = topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))
    problem = build_problem(graph, AnalyticCost())
    grouping = make_groups(problem, topo)
    sim = Simulator(problem, topo)
    return problem, grouping, sim, topo


def test_the_decoder_reads_the_partial_schedule_and_splits_branches_an_independent_policy_cannot(four_branches):
    problem, grouping, sim, _ = four_branches
    devices = 2
    blind = Policy.create(BASE_FEATURES + devices, devices, hidden=8, seed=0)  # zero readout: every group alike
    reading = Policy.create(BASE_FEATURES + devices, devices, hidden=8, seed=0, decoder=DECODER_SCHEDULE)
    reading.params["v"][0] = -4.0  # prefer the device where the group finishes first
    task = TrainTask(problem, grouping, sim)
    one_device, _ = place_with(blind, task)
    split, plan = place_with(reading, task)
    assert one_device == pytest.approx(sim.runtime([0] * problem.size))
    assert len(set(plan)) == 2 and split < 0.75 * one_device


def test_schedule_view_and_decoder_features(four_branches):
    problem, grouping, sim, _ = four_branches
    view = schedule_view(grouping, sim)
    assert view.time.shape == (grouping.count, 2) and view.scale > 0
    assert sum(len(p) for p in view.preds) == sum(a < b for a, b, _ in grouping.edges)
    inp = graph_input(TrainTask(problem, grouping, sim), 2)
    assert inp.schedule is not None
    policy = Policy.create(inp.x.shape[1], 2, hidden=8, decoder=DECODER_SCHEDULE)
    _, _, cache = policy.decode(inp, 3, np.random.default_rng(0))
    feats = cache["feats"]
    assert feats.shape == (3, grouping.count, 2, DECODER_FEATURES) and np.isfinite(feats).all()
    assert (feats[:, 0, :, 5] == 1.0).all()  # nothing is placed before the first group: every device unused


def test_a_schedule_policy_trains_across_graphs_saves_and_places_zero_shot_and_fine_tuned(tmp_path, four_branches):
    _, _, _, topo = four_branches
    graphs = {f"b{i}": graph_from_model(branches_model(width=32, branches=2 + i, seed=i)) for i in range(2)}
    options = PlaceOptions(train=TrainOptions(seed=1, samples=4), transfer_steps=4, transfer_decoder=DECODER_SCHEDULE)
    policy, _ = train_across(graphs, topo, options, AnalyticCost())
    again, _ = train_across(graphs, topo, options, AnalyticCost())
    assert policy.decoder == DECODER_SCHEDULE and {"v", "U"} <= policy.params.keys()
    assert all(np.array_equal(policy.params[k], again.params[k]) for k in policy.params)
    path = str(tmp_path / "p.npz")
    policy.save(path)
    loaded, _ = Policy.load(path)
    assert loaded.decoder == DECODER_SCHEDULE
    unseen = graph_from_model(branches_model(width=48, branches=3, seed=7))
    zero = place(unseen, AnalyticCost(), topo, PlaceOptions(policy=loaded, zero_shot_samples=8, improve_sweeps=0))
    assert zero.plan.rl["mode"] == "zero-shot" and zero.plan.seconds <= min(zero.plan.baselines.values())
    tuned = place(unseen, AnalyticCost(), topo, PlaceOptions(policy=loaded, fine_tune=True, improve_sweeps=0,
                                                             train=TrainOptions(steps=5, samples=4, time_limit=0)))
    assert tuned.plan.rl["mode"] == "fine-tuned" and tuned.plan.rl["steps"] == 5
    assert tuned.plan.rl["seconds"] <= tuned.plan.rl["zero_shot_seconds"]


def test_policy_files_without_a_decoder_read_the_independent_one(tmp_path):
    policy = Policy.create(4, 3, hidden=5)
    path = str(tmp_path / "old.npz")
    np.savez(path, rounds=np.array(policy.rounds), clip=np.array(policy.clip), meta=np.array("{}"), **policy.params)
    assert Policy.load(path)[0].decoder == ""
    with pytest.raises(ValueError, match="decoder"):
        Policy.create(4, 3, decoder="beam")


def test_the_schedule_decoder_is_device_equivariant():
    """Relabelling the devices (their times, links and allowed masks) relabels the decoder's distributions: no
    weight belongs to one device, so nothing learnt about "device 3" on one graph is carried to another."""
    rng = np.random.default_rng(4)
    inp = small_input(rng)
    policy = Policy.create(5, 3, hidden=8, seed=1, decoder=DECODER_SCHEDULE)
    for k, v in policy.params.items():
        policy.params[k] = v + rng.normal(0, 0.5, v.shape)
    assert not {"Wd", "Wg", "bd"} & policy.params.keys() and policy.devices == 3
    perm = np.array([2, 0, 1])  # new device j is old device perm[j]
    inverse = np.argsort(perm)
    sched = inp.schedule
    moved = GraphInput(inp.x, inp.pred, inp.succ, inp.allowed[:, perm],
                       Schedule(sched.time[:, perm], tuple(tuple((q, s[np.ix_(perm, perm)], b) for q, s, b in p)
                                                          for p in sched.preds), sched.scale))
    actions = np.array([[0, 1, 2, 0, 1, 2, 0], [2, 2, 0, 1, 0, 1, 1]])
    _, logp, _ = policy.decode(inp, 2, actions=actions)
    _, relabelled, _ = policy.decode(moved, 2, actions=inverse[actions])
    assert np.allclose(relabelled, logp[:, :, perm])


def test_fine_tuning_starts_from_the_best_of_the_policys_samples(four_branches):
    problem, grouping, sim, topo = four_branches
    graph = graph_from_model(branches_model(width=64, branches=4, depth=3))
    policy = Policy.create(BASE_FEATURES + 2, 2, hidden=8, seed=0, decoder=DECODER_SCHEDULE)
    policy.params["v"][5] = 3.0  # prefer unused devices: its most likely placement is not its best one
    greedy, _ = place_with(policy, TrainTask(problem, grouping, sim))
    sampled, _ = place_with(policy, TrainTask(problem, grouping, sim), 64, 0, 1.0)
    assert sampled < greedy
    options = PlaceOptions(policy=policy, fine_tune=True, improve_sweeps=0, zero_shot_samples=64,
                           train=TrainOptions(steps=1, samples=2, time_limit=0))
    assert place(graph, AnalyticCost(), topo, options).plan.rl["zero_shot_seconds"] == pytest.approx(sampled)
    alone = place(graph, AnalyticCost(), topo, replace(options, zero_shot_samples=0))
    assert alone.plan.rl["zero_shot_seconds"] == pytest.approx(greedy)


def test_zero_shot_temperature_is_the_policys_own_unless_given(four_branches):
    _, _, _, topo = four_branches
    graph = graph_from_model(branches_model(width=64, branches=4, depth=3))
    decoder = Policy.create(BASE_FEATURES + 2, 2, hidden=8, decoder=DECODER_SCHEDULE)
    independent = Policy.create(BASE_FEATURES + 2, 2, hidden=8)
    options = PlaceOptions(improve_sweeps=0, zero_shot_samples=4, time_limit=0)
    temperature = {name: place(graph, AnalyticCost(), topo, replace(options, policy=p)).plan.rl["temperature"]
                   for name, p in (("decoder", decoder), ("independent", independent))}
    assert temperature == {"decoder": 1.0, "independent": 0.3}
    given = place(graph, AnalyticCost(), topo, replace(options, policy=decoder, zero_shot_temperature=0.5))
    assert given.plan.rl["temperature"] == 0.5 and given.plan.rl["greedy_seconds"] >= given.plan.rl["seconds"]


def test_transfer_settings_differ_for_the_decoder_only():
    base = TrainOptions()
    plain, decoding = transfer_options(base), transfer_options(base, DECODER_SCHEDULE)
    assert (plain.normalize, plain.entropy_weight) == (False, 0.02)
    assert (decoding.normalize, decoding.entropy_weight) == (True, 0.05)
    assert PlaceOptions().transfer_decoder == DECODER_SCHEDULE  # what `xflow place --train-on` trains
