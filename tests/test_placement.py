"""Device placement: topology files, groups, simulator, baselines, policy gradients, RL, executor."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow.cost import AnalyticCost
from xflow.errors import XflowError
from xflow.onnx_io import graph_from_model
from xflow.placement.baselines import all_baselines, heft, min_cut, round_robin, single_device
from xflow.placement.calibrate import calibrate, kendall_tau, random_plans
from xflow.placement.executor import Executor, cuda_available, make_segments, segment_order
from xflow.placement.features import BASE_FEATURES, group_features
from xflow.placement.groups import Grouping, make_groups
from xflow.placement.improve import improve
from xflow.placement.measure import spread_plans
from xflow.placement.place import PlaceOptions, place
from xflow.placement.plan import DEVICE_KEY, annotate_model, make_plan, read_plan
from xflow.placement.policy import GraphInput, Policy, policy_gradient
from xflow.placement.problem import build_problem
from xflow.placement.simulator import INFEASIBLE_SECONDS, SimParams, Simulator
from xflow.placement.topology import BUILTINS, load_topology, topology_from_json
from xflow.placement.train import TrainOptions, TrainTask, place_with, train
from xflow.placement.transfer import train_across


def model_of(nodes, inputs, outputs, inits) -> onnx.ModelProto:  # noqa: ANN001
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def branches_model(width: int = 64, branches: int = 2, depth: int = 3, seed: int = 0) -> onnx.ModelProto:
    """x -> ``branches`` independent MatMul/Relu chains -> Add: parallel work worth splitting."""
    rng = np.random.default_rng(seed)
    nodes, inits, tails = [], [], []
    for b in range(branches):
        prev = "x"
        for d in range(depth):
            w = f"w{b}_{d}"
            inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) * 0.1).astype(np.float32), w))
            nodes.append(helper.make_node("MatMul", [prev, w], [f"m{b}_{d}"]))
            nodes.append(helper.make_node("Relu", [f"m{b}_{d}"], [f"r{b}_{d}"]))
            prev = f"r{b}_{d}"
        tails.append(prev)
    out = tails[0]
    for i, t in enumerate(tails[1:]):
        nodes.append(helper.make_node("Add", [out, t], [f"sum{i}"]))
        out = f"sum{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, width])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, [8, width])
    return model_of(nodes, [x], [y], inits)


def two_gpu(fraction: float = 0.0, bandwidth: float = 1e9, latency: float = 1e-5) -> dict:
    """Two GPUs, each holding ``fraction`` of the model's single-device peak memory (0 = unlimited)."""
    return {"name": "t", "devices": [{"name": "a", "kind": "cuda", "memory_fraction": fraction},
                                     {"name": "b", "kind": "cuda", "memory_fraction": fraction}],
            "default_link": {"latency": latency, "bandwidth": bandwidth}}


@pytest.fixture(scope="module")
def branchy():
    graph = graph_from_model(branches_model())
    return graph, build_problem(graph, AnalyticCost(), "branches")


# ---- topology ------------------------------------------------------------------------------------
def test_builtin_topologies_load_and_round_trip_through_json(tmp_path):
    for name in BUILTINS:
        topo = load_topology(name)
        assert topo.devices and topo.name == name
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(topo.to_json()))
        again = load_topology(str(path))
        assert again.devices == topo.devices and again.links == topo.links
    memcap = load_topology("2xgpu-memcap")
    assert all(0 < d.memory_fraction < 1 for d in memcap.devices if d.kind == "cuda")


@pytest.mark.parametrize("text, problem", [
    ("{", "not JSON"),
    ('{"devices": []}', "non-empty list 'devices'"),
    ('{"devices": [{"name": "a", "kind": "tpu"}]}', "kind 'tpu'"),
    ('{"devices": [{"name": "a"}, {"name": "a"}]}', "unique"),
    ('{"devices": [{"name": "a"}], "links": [{"from": "a", "to": "z", "bandwidth": 1}]}', "known devices"),
    ('{"devices": [{"name": "a"}], "default_link": {"latency": 0}}', "bandwidth"),
    ('{"devices": [{"name": "a", "speed": "fast"}]}', "device 'a'"),
])
def test_malformed_topology_files_name_the_file_and_problem(tmp_path, text, problem):
    path = tmp_path / "topo.json"
    path.write_text(text)
    with pytest.raises(XflowError) as err:
        load_topology(str(path))
    assert str(path) in str(err.value) and problem in str(err.value)


def test_unknown_topology_name_lists_builtins():
    with pytest.raises(XflowError, match="built-ins: cpu"):
        load_topology("9xtpu")


# ---- groups and features -------------------------------------------------------------------------
def test_groups_keep_chains_together_and_branches_apart(branchy):
    _, problem = branchy
    grouping = make_groups(problem, load_topology("4xgpu-pcie"))
    key = problem.key_index()
    group = {k: int(grouping.group_of[i]) for k, i in key.items()}
    assert group["m0_0"] == group["r0_0"] == group["r0_2"]  # one chain, one group
    assert group["m0_0"] != group["m1_0"]  # the two branches can go to different devices
    assert grouping.allowed.all()


def test_group_cap_and_pinned_ops(branchy):
    _, problem = branchy
    topo = topology_from_json({"devices": [{"name": "cpu"}, {"name": "gpu", "kind": "cuda", "unsupported": ["relu"]}]})
    grouping = make_groups(problem, topo, max_groups=2)
    assert grouping.count <= 2  # relu pins split chains apart, the cap merges them back
    for g, members in enumerate(grouping.members):
        if any(problem.ops[u] == "relu" for u in members):
            assert grouping.allowed[g].tolist() == [True, False]
    capped = make_groups(problem, load_topology("4xgpu-pcie"), max_groups=1)
    assert capped.count == 1


def test_features_are_finite_and_sized(branchy):
    _, problem = branchy
    grouping = make_groups(problem, load_topology("4xgpu-pcie"))
    x = group_features(problem, grouping, 5, current=np.zeros(grouping.count, dtype=int))
    assert x.shape == (grouping.count, BASE_FEATURES + 5) and np.isfinite(x).all()
    assert x[:, -5].sum() == grouping.count


# ---- policy: backprop against finite differences -------------------------------------------------
def test_policy_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    groups, features, devices = 5, 6, 3
    pred = (rng.random((groups, groups)) < 0.4).astype(float)
    np.fill_diagonal(pred, 0)
    succ = pred.T.copy()
    for m in (pred, succ):
        rows = m.sum(axis=1, keepdims=True)
        np.divide(m, rows, out=m, where=rows > 0)
    allowed = np.ones((groups, devices), dtype=bool)
    allowed[2, 1] = False
    inp = GraphInput(rng.standard_normal((groups, features)), pred, succ, allowed)
    policy = Policy.create(features, devices, hidden=7, rounds=2, seed=3)
    for k, v in policy.params.items():  # non-zero readout so every path carries gradient
        policy.params[k] = v + rng.normal(0, 0.3, v.shape)
    actions = np.array([[0, 1, 2, 0, 1], [2, 2, 0, 1, 0], [1, 0, 0, 2, 2]])
    actions[:, 2] = np.where(actions[:, 2] == 1, 0, actions[:, 2])
    advantages = np.array([0.7, -1.2, 0.4])

    bias = rng.normal(0, 0.5, (groups, devices))

    def loss() -> float:
        logp, _ = policy.forward(inp, bias)
        return policy_gradient(logp, actions, advantages, allowed, 0.05)[0]

    logp, cache = policy.forward(inp, bias)
    _, dlogits, _ = policy_gradient(logp, actions, advantages, allowed, 0.05)
    grads = policy.backward(inp, cache, dlogits)
    assert_gradients_match([*policy.params.items(), ("bias", bias)], grads, loss)


def assert_gradients_match(params, grads, loss) -> None:  # noqa: ANN001 - arrays and a closure
    """Central finite differences of ``loss`` at the first 12 entries of each named array, against ``grads``."""
    eps = 1e-6
    for name, value in params:
        for idx in list(np.ndindex(value.shape))[:12]:
            old = value[idx]
            value[idx] = old + eps
            up = loss()
            value[idx] = old - eps
            down = loss()
            value[idx] = old
            assert grads[name][idx] == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-7), (name, idx)


def test_policy_save_and_load(tmp_path):
    policy = Policy.create(4, 3, hidden=5, seed=0)
    path = str(tmp_path / "p.npz")
    policy.save(path, {"topology": "x"})
    again, meta = Policy.load(path)
    assert meta == {"topology": "x"} and again.devices == 3 and again.rounds == policy.rounds
    assert all(np.array_equal(again.params[k], v) for k, v in policy.params.items())


# ---- simulator -----------------------------------------------------------------------------------
def chain_problem(nbytes_shape=(256, 256)):
    w = numpy_helper.from_array(np.eye(nbytes_shape[1], dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    model = model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(nbytes_shape))],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(nbytes_shape))], [w])
    return build_problem(graph_from_model(model), AnalyticCost())


def test_simulator_chain_costs_compute_plus_one_transfer():
    problem = chain_problem()
    topo = topology_from_json(two_gpu(bandwidth=1e9, latency=1e-5))
    sim = Simulator(problem, topo)
    c_mm, c_relu = problem.costs
    assert sim.runtime([0, 0]) == pytest.approx(c_mm + c_relu)
    transfer = 1e-5 + 256 * 256 * 4 / 1e9
    assert sim.runtime([0, 1]) == pytest.approx(c_mm + transfer + c_relu)
    # the graph input starts on device 0: placing the MatMul on b moves x first
    assert sim.runtime([1, 1]) == pytest.approx(transfer + c_mm + c_relu)
    fast = topology_from_json({**two_gpu(), "devices": [{"name": "a", "speed": 2.0, "overhead": 1e-6},
                                                        {"name": "b"}]})
    assert Simulator(problem, fast).runtime([0, 0]) == pytest.approx((c_mm + c_relu) / 2 + 2e-6)


def test_simulator_charges_each_segment_its_session_call():
    problem = chain_problem()
    topo = topology_from_json(two_gpu(bandwidth=1e9, latency=1e-5))
    plain, charged = Simulator(problem, topo), Simulator(problem, topo, SimParams(segment_overhead=1e-3))
    assert charged.runtime([0, 0]) == pytest.approx(plain.runtime([0, 0]) + 1e-3)  # one segment
    assert charged.runtime([0, 1]) == pytest.approx(plain.runtime([0, 1]) + 2e-3)  # cut in two


def test_simulator_runs_branches_in_parallel(branchy):
    _, problem = branchy
    sim = Simulator(problem, topology_from_json(two_gpu(bandwidth=1e12, latency=0.0)))
    key = problem.key_index()
    split = [1 if problem.keys[i].endswith(("1_0", "1_1", "1_2")) else 0 for i in range(problem.size)]
    assert sum(split) == 6 and key
    assert sim.runtime(split) < 0.7 * sim.runtime([0] * problem.size)


def test_simulator_memory_capacity_and_unsupported_ops(branchy):
    _, problem = branchy
    one = Simulator(problem, topology_from_json(two_gpu())).run([0] * problem.size)
    assert one.feasible and one.peak_memory[0] >= problem.weight_bytes
    tight = topology_from_json(two_gpu(fraction=0.6))
    sim = Simulator(problem, tight)
    assert sim.runtime([0] * problem.size) == INFEASIBLE_SECONDS
    assert "needs" in sim.run([0] * problem.size).reason
    split = [int(k.startswith(("m1", "r1"))) for k in problem.keys]
    assert sim.run(split).feasible
    pinned = topology_from_json({"devices": [{"name": "a"}, {"name": "b", "kind": "cuda", "unsupported": ["add"]}]})
    assert Simulator(problem, pinned).runtime([1] * problem.size) == INFEASIBLE_SECONDS


# ---- baselines -----------------------------------------------------------------------------------
def test_baselines_are_valid_and_heft_uses_parallel_devices(branchy):
    _, problem = branchy
    topo = topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))
    sim = Simulator(problem, topo)
    grouping = make_groups(problem, topo)
    plans = all_baselines(grouping, sim)
    assert set(plans) == {"single:a", "single:b", "round-robin", "min-cut", "m-etf"}
    for plan in plans.values():
        assert len(plan) == problem.size and set(plan) <= {0, 1}
    assert set(heft(grouping, sim)) == {0, 1}
    assert sim.runtime(plans["m-etf"]) < sim.runtime(plans["single:a"])
    assert set(round_robin(grouping)) == {0, 1} and set(min_cut(grouping, sim)) == {0, 1}
    assert single_device(grouping, 1) == [1] * problem.size


# ---- training ------------------------------------------------------------------------------------
def test_reinforce_learns_to_split_branches_and_is_deterministic(branchy):
    _, problem = branchy
    topo = topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))
    sim = Simulator(problem, topo)
    grouping = make_groups(problem, topo)
    options = TrainOptions(steps=60, samples=8, seed=0, learning_rate=0.05)
    first = train([TrainTask(problem, grouping, sim)], 2, options)
    second = train([TrainTask(problem, grouping, sim)], 2, options)
    assert first.best_seconds == second.best_seconds and first.best_plans == second.best_plans
    assert first.best_seconds[0] < 0.7 * sim.runtime([0] * problem.size)
    assert first.curve[-1][2] == first.best_seconds[0] and first.evaluations > 0
    task = TrainTask(problem, grouping, sim)
    seconds, plan = place_with(first.policy, task, samples=4)
    assert len(plan) == problem.size and seconds < INFEASIBLE_SECONDS
    better, groups = improve(task, np.zeros(grouping.count, dtype=int))
    assert better < sim.runtime([0] * problem.size) and len(groups) == grouping.count


def test_warm_start_imitates_the_given_placement_before_reinforce(branchy):
    _, problem = branchy
    topo = topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))
    grouping = make_groups(problem, topo)
    target = np.arange(grouping.count) % 2
    task = TrainTask(problem, grouping, Simulator(problem, topo), imitate=target)
    result = train([task], 2, TrainOptions(steps=1, samples=2))
    assert 0 < result.imitation_steps < TrainOptions.imitation_steps
    logp, _ = result.policy.forward(task.inp, task.bias)
    assert np.exp(logp[np.arange(grouping.count), target]).mean() > 0.7
    fresh = TrainTask(problem, grouping, Simulator(problem, topo))
    assert train([fresh], 2, TrainOptions(steps=1, samples=2)).imitation_steps == 0


def test_training_restarts_from_a_fresh_policy_when_stuck(branchy):
    _, problem = branchy
    topo = topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))
    sim = Simulator(problem, topo)
    result = train([TrainTask(problem, make_groups(problem, topo), sim)], 2,
                   TrainOptions(steps=40, samples=4, restart_patience=5))
    assert result.restarts >= 1 and result.best_seconds[0] == sim.runtime(result.best_plans[0])


def test_improve_makes_pair_moves_that_single_moves_cannot(branchy):
    # Two chained groups: splitting them does not fit (infeasible), both on device 1 is fastest. From
    # both on device 0 every single move is worse; only moving the pair together helps.
    _, problem = branchy

    class Env:
        def runtime(self, plan):  # noqa: ANN001, ANN202
            return {(0, 0): 2.0, (1, 1): 1.0}.get(tuple(plan[:2]), INFEASIBLE_SECONDS)

    grouping = Grouping(np.array([0, 1]), ((0,), (1,)), np.ones((2, 2), dtype=bool), ((0, 1, 4.0),))
    task = TrainTask(problem, grouping, Env())
    seconds, groups = improve(task, np.array([0, 0]))
    assert seconds == 1.0 and groups.tolist() == [1, 1]


def test_transfer_training_counts_steps_and_is_reproducible_then_places_zero_shot():
    graphs = {f"b{i}": graph_from_model(branches_model(width=32, branches=2 + i, seed=i)) for i in range(2)}
    topo = topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))
    options = PlaceOptions(train=TrainOptions(seed=3, samples=4, time_limit=1e-9), transfer_steps=5)
    said: list[str] = []
    first, best = train_across(graphs, topo, options, AnalyticCost(), said.append)
    second, _ = train_across(graphs, topo, options, AnalyticCost())
    assert [s.split(", ")[0] for s in said] == [f"training across 2 graphs: step {i}/5" for i in range(1, 6)]
    assert set(best) == set(graphs) and first.params.keys() == second.params.keys()
    assert all(np.array_equal(first.params[k], second.params[k]) for k in first.params)
    unseen = graph_from_model(branches_model(width=48, branches=3, seed=7))
    options = PlaceOptions(policy=first, zero_shot_samples=8, improve_sweeps=0)
    plan = place(unseen, AnalyticCost(), topo, options).plan
    assert plan.rl["mode"] == "zero-shot" and plan.rl["samples"] == 8 and plan.rl["seconds"] < INFEASIBLE_SECONDS


def test_fine_tuning_a_transferred_policy_keeps_its_network_and_never_loses_its_start():
    graphs = {f"b{i}": graph_from_model(branches_model(width=32, branches=2 + i, seed=i)) for i in range(2)}
    topo = topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))
    policy, _ = train_across(graphs, topo, PlaceOptions(train=TrainOptions(seed=1, samples=4), transfer_steps=5),
                             AnalyticCost())
    before = policy.copy()
    unseen = graph_from_model(branches_model(width=48, branches=3, seed=7))
    options = PlaceOptions(policy=policy, fine_tune=True, improve_sweeps=0,
                           train=TrainOptions(steps=20, samples=4, time_limit=0))
    plan = place(unseen, AnalyticCost(), topo, options).plan
    rl = plan.rl
    assert rl["mode"] == "fine-tuned" and rl["steps"] == 20 and rl["evaluations"] > 0
    assert rl["warm_start"] == "zero-shot" or rl["warm_start"] in plan.baselines
    # training never ends slower than where it started: the policy's own placement or the fastest baseline
    assert rl["seconds"] <= rl["zero_shot_seconds"] and plan.seconds <= min(plan.baselines.values())
    # the given policy is trained on a copy: the caller's transferred policy is unchanged
    assert all(np.array_equal(before.params[k], policy.params[k]) for k in policy.params)


def test_infeasible_placements_are_avoided():
    graph = graph_from_model(branches_model(width=96, depth=2))
    problem = build_problem(graph, AnalyticCost())
    topo = topology_from_json(two_gpu(fraction=0.7, bandwidth=1e12, latency=0.0))
    sim = Simulator(problem, topo)
    result = train([TrainTask(problem, make_groups(problem, topo), sim)], 2, TrainOptions(steps=30, samples=8))
    assert result.best_seconds[0] < INFEASIBLE_SECONDS and sim.run(result.best_plans[0]).feasible


# ---- executor ------------------------------------------------------------------------------------
def test_segments_follow_a_topological_order_without_cycles(branchy):
    graph, problem = branchy
    rng = np.random.default_rng(0)
    for _ in range(5):
        plan = rng.integers(0, 2, problem.size).tolist()
        order = segment_order(problem, plan)
        assert sorted(order) == list(range(problem.size))
        position = {u: i for i, u in enumerate(order)}
        for t in problem.tensors:
            for c in t.consumers:
                assert t.producer < 0 or position[t.producer] < position[c]
        segments = make_segments(problem, plan)
        produced_before: set[str] = set(graph.inputs)
        for seg in segments:
            assert all(plan[u] == seg.device for u in seg.nodes)
            assert set(seg.inputs) <= produced_before  # only values of earlier segments: no cycles
            produced_before |= set(seg.outputs)


def test_executor_runs_a_split_placement_with_matching_outputs(branchy):
    _, problem = branchy
    executor = Executor(problem, load_topology("cpu"), runs=3, warmup=1)
    try:
        split = [int(k.startswith(("m1", "r1"))) for k in problem.keys]
        measured = executor.measure(split)
        assert measured.segments >= 2 and measured.seconds > 0 and measured.max_abs_diff < 1e-4
        assert executor.runtime([0] * problem.size) > 0
    finally:
        executor.close()


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no usable CUDA GPU")
def test_executor_on_cpu_and_cuda(branchy):
    _, problem = branchy
    executor = Executor(problem, load_topology("cpu+cuda"), runs=3)
    try:
        split = [int(k.startswith(("m1", "r1"))) for k in problem.keys]
        assert executor.measure(split).max_abs_diff < 1e-3
        assert executor.runtime([1] * problem.size) > 0
    finally:
        executor.close()


def test_cuda_topology_without_a_gpu_is_a_clear_error(branchy):
    if cuda_available():
        pytest.skip("a GPU is present")
    _, problem = branchy
    with pytest.raises(XflowError, match="cannot run CUDA"):
        Executor(problem, load_topology("cpu+cuda"))


def test_confirm_plan_keeps_whichever_measures_faster(branchy):
    """The simulator's choice timed for real against the fastest baseline: both measured in interleaved rounds,
    the faster kept; nothing to confirm where the choice is that baseline, or where this machine cannot run
    the topology."""
    from xflow.placement.executor import can_run
    from xflow.placement.measure import confirm_plan

    _, problem = branchy
    topo = load_topology("cpu")
    plans = {"single:cpu0": [0] * problem.size, "rl": [i % 2 for i in range(problem.size)]}
    baselines = {"single:cpu0": 1.0}
    confirmed = confirm_plan(problem, topo, plans, baselines, "rl", rounds=3)
    measured = confirmed["measured"]
    assert set(measured) == {"rl", "single:cpu0"} and all(t > 0 for t in measured.values())
    assert confirmed["kept"] == min(measured, key=lambda k: measured[k]) and confirmed["rounds"] == 3
    assert confirm_plan(problem, topo, plans, baselines, "single:cpu0", rounds=3) is None
    assert not can_run(load_topology("4xgpu-pcie"))
    assert confirm_plan(problem, load_topology("4xgpu-pcie"), {"a": [0] * problem.size, "b": [1] * problem.size},
                        {"a": 1.0}, "b", rounds=3) is None


def test_place_confirms_on_the_cpu_topology_only_when_asked(branchy):
    """``--confirm`` sets the rounds; the plan records the measurement and holds the plan kept."""
    from xflow.placement.options import CONFIRM_ROUNDS, PlaceSettings

    assert PlaceSettings(confirm=True).options(2, "cpu").confirm_rounds == CONFIRM_ROUNDS
    assert PlaceSettings().options(2, "cpu").confirm_rounds == 0
    graph, _ = branchy
    # a simulator that charges nothing for crossing devices picks a split plan; the real executor decides
    free = SimParams(transfer_overhead=0.0, segment_overhead=0.0)
    result = place(graph, None, load_topology("cpu"), PlaceOptions(time_limit=2, sim_params=free, confirm_rounds=2))
    confirmed, baselines = result.plan.rl.get("confirmed"), result.plan.baselines
    if confirmed is None:  # nothing to confirm: the simulator's choice is the fastest baseline itself
        assert result.plan.chosen == min(baselines, key=lambda k: baselines[k])
    else:
        assert result.plan.chosen == confirmed["kept"] == min(confirmed["measured"],
                                                              key=lambda k: confirmed["measured"][k])
    assert "confirmed" not in place(graph, None, load_topology("cpu"),
                                    PlaceOptions(time_limit=1, sim_params=free)).plan.rl


# ---- calibration ---------------------------------------------------------------------------------
def test_interleaved_measurement_times_every_placement_each_round(branchy):
    _, problem = branchy
    topo = load_topology("cpu")
    plans = [[0] * problem.size, [1] * problem.size, [i % 2 for i in range(problem.size)]]
    executor = Executor(problem, topo, runs=2, warmup=1)
    try:
        measured = executor.measure_interleaved(plans, rounds=3)
    finally:
        executor.close()
    assert [len(m.times) for m in measured] == [3, 3, 3]
    assert all(m.seconds == sorted(m.times)[1] > 0 for m in measured)
    assert [m.segments for m in measured][:2] == [1, 1] and measured[2].segments > 1


def test_spread_plans_span_the_simulated_range_without_repeats(branchy):
    _, problem = branchy
    topo = topology_from_json(two_gpu())
    sim = Simulator(problem, topo)
    grouping = make_groups(problem, topo)
    pool = random_plans(grouping, 50, seed=0)
    excluded = [pool[0]]
    chosen = spread_plans(sim, pool, 4, excluded)
    times = [sim.run(p).seconds for p in chosen]
    others = [sim.run(p).seconds for p in pool if p != pool[0]]
    assert len({tuple(p) for p in chosen}) == len(chosen) == 4 and pool[0] not in chosen
    assert times == sorted(times) and times[0] == min(others) and times[-1] == max(others)


def test_spread_plans_space_neighbours_by_one_ratio():
    """Where most random placements crowd together, the test set still spreads evenly over the range (log scale):
    quantiles would put three of five placements inside the crowd, a few per cent apart."""
    class Times:
        def run(self, plan):
            return SimpleNamespace(seconds=plan[0])

    crowd = [[1.0 + 0.01 * k] for k in range(20)]
    chosen = spread_plans(Times(), [*crowd, [0.5], [2.0], [4.0], [8.0]], 5, exclude=[])
    assert [p[0] for p in chosen] == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_kendall_tau():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_calibration_recovers_known_parameters(branchy):
    _, problem = branchy
    topo = topology_from_json(two_gpu())
    truth = SimParams(compute_scale=4.0, transfer_overhead=2e-4)
    grouping = make_groups(problem, topo)
    plans = random_plans(grouping, 12, seed=0) + [[0] * problem.size]
    measured = [Simulator(problem, topo, truth).run(p).seconds for p in plans]
    fit = calibrate(problem, topo, plans, measured)
    assert fit.log_rmse < 0.05 and fit.tau > 0.9
    held_out = random_plans(grouping, 10, seed=1)  # the fit predicts placements it never saw
    fitted, real = Simulator(problem, topo, fit.params), Simulator(problem, topo, truth)
    for plan in held_out:
        assert fitted.run(plan).seconds == pytest.approx(real.run(plan).seconds, rel=0.1)


# ---- plans ---------------------------------------------------------------------------------------
def test_plan_json_round_trip_and_onnx_metadata(tmp_path, branchy):
    graph, problem = branchy
    topo = load_topology("cpu")
    devices = [i % 2 for i in range(problem.size)]
    plan = make_plan("m", problem, topo, "sim", devices, 1e-3, "rl", baselines={"single:cpu0": 2e-3})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    again = read_plan(str(path))
    assert again.devices_for(problem) == devices and again.baselines == {"single:cpu0": 2e-3}
    model = annotate_model(problem, plan)
    tagged = {p.output[0]: {e.key: e.value for e in p.metadata_props}[DEVICE_KEY] for p in model.graph.node}
    assert tagged == {k: topo.devices[d].name for k, d in zip(problem.keys, devices, strict=True)}
    other = build_problem(graph_from_model(branches_model(branches=3)), AnalyticCost())
    with pytest.raises(XflowError, match="does not match"):
        again.devices_for(other, str(path))
    (tmp_path / "bad.json").write_text('{"format": "nope"}')
    with pytest.raises(XflowError, match="malformed plan"):
        read_plan(str(tmp_path / "bad.json"))


def test_time_limits_are_read_on_the_given_clock(branchy):
    # a clock that advances one "second" per reading: the limit counts readings, not wall time, as a CPU-time
    # clock on a shared machine counts only the time the process computed
    _, problem = branchy
    topo = topology_from_json(two_gpu(bandwidth=1e12, latency=0.0))
    ticks = iter(range(10**6))
    options = TrainOptions(steps=1000, samples=2, time_limit=5.0, restart_patience=0, clock=lambda: float(next(ticks)))
    result = train([TrainTask(problem, make_groups(problem, topo), Simulator(problem, topo))], 2, options)
    assert result.steps == 6 and result.seconds == 7.0  # read once at the start, once per step, once at the end
    wall = train([TrainTask(problem, make_groups(problem, topo), Simulator(problem, topo))], 2,
                 TrainOptions(steps=100, samples=2, time_limit=5.0, restart_patience=0))
    assert wall.steps == 100  # the same budget on the wall clock: far more steps than six (0.1 s here)
