"""The simulator's event loop against a plain reference of the same schedule.

``Simulator.run`` is written for speed (one function, flattened links, inlined helpers), because planning
spends nearly all its time there. The reference below states the schedule the simple way (the loop as it
was before it was flattened: helper functions, a dict of links, ``max``); both must agree to the bit on
times and peak memory, on graphs with shared weights, multi-consumer values and graph outputs, on every
built-in multi-device topology, with and without calibration knobs."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.test_placement import model_of, two_gpu
from xflow import zoo
from xflow.cost import AnalyticCost
from xflow.onnx_io import graph_from_model
from xflow.placement.groups import make_groups
from xflow.placement.problem import build_problem
from xflow.placement.segments import segment_starts
from xflow.placement.simulator import SimParams, Simulator
from xflow.placement.topology import load_topology, topology_from_json


def reference_run(sim: Simulator, plan: Sequence[int]) -> tuple[float, bool, tuple[float, ...], str]:
    """(seconds, feasible, peak bytes per device, reason) of ``plan``, scheduled as the docstring of
    ``Simulator`` says: one node at a time per device, earliest ready in topological order; each value moves
    once per consumer device over a serial link; weights held once per device that reads them."""
    problem, topology, params = sim.problem, sim.topology, sim.params
    n_dev = len(topology.devices)
    plan = list(plan)
    for node, dev in enumerate(plan):
        if not topology.devices[dev].supports(problem.ops[node]):
            return float("inf"), False, (0.0,) * n_dev, f"{problem.ops[node]} is not supported on " \
                                                          f"{topology.devices[dev].name}"
    node_time = sim.node_times
    links = {(a, b): (topology.link(a, b).latency + params.transfer_overhead,
                      topology.link(a, b).bandwidth * params.bandwidth_scale)
             for a in range(n_dev) for b in range(n_dev) if a != b}
    tensors = problem.tensors
    held: list[dict[str, int]] = [{} for _ in range(n_dev)]
    for node, ws in enumerate(problem.weights):
        for w, nbytes in ws:
            held[plan[node]][w] = nbytes
    live = [float(sum(h.values())) for h in held]
    refs = [[0] * n_dev for _ in tensors]
    targets = []
    for t, tensor in enumerate(tensors):
        src = plan[tensor.producer] if tensor.producer >= 0 else 0
        remote = set()
        for c in tensor.consumers:
            refs[t][plan[c]] += 1
            if plan[c] != src:
                remote.add(plan[c])
        targets.append(tuple(remote))
        refs[t][src] += len(remote) + int(tensor.is_output)
    opens = segment_starts(problem, plan) if params.segment_overhead > 0 else [False] * problem.size
    pending = [len(ins) for ins in problem.inputs_of]
    ready: list[list[int]] = [[] for _ in range(n_dev)]
    busy = [False] * n_dev
    link_free: dict[tuple[int, int], float] = {}
    events: list = []
    seq = itertools.count()
    peak = list(live)

    def send(t: int, src: int, now: float) -> None:
        for dst in targets[t]:
            latency, bandwidth = links[(src, dst)]
            end = max(now, link_free.get((src, dst), 0.0)) + latency + tensors[t].nbytes / bandwidth
            link_free[(src, dst)] = end
            heapq.heappush(events, (end, next(seq), 1, dst, t))

    def arrive(t: int, dev: int) -> None:
        for c in tensors[t].consumers:
            if plan[c] == dev:
                pending[c] -= 1
                if pending[c] == 0:
                    heapq.heappush(ready[dev], c)

    def start(dev: int, now: float) -> None:
        if busy[dev] or not ready[dev]:
            return
        node = heapq.heappop(ready[dev])
        busy[dev] = True
        live[dev] += sum(tensors[t].nbytes for t in problem.outputs_of[node])
        peak[dev] = max(peak[dev], live[dev])
        took = node_time[dev][node] + (params.segment_overhead if opens[node] else 0.0)
        heapq.heappush(events, (now + took, next(seq), 0, dev, node))

    for node in range(problem.size):
        if pending[node] == 0:
            heapq.heappush(ready[plan[node]], node)
    for t, tensor in enumerate(tensors):
        if tensor.producer < 0:
            live[0] += tensor.nbytes
            send(t, 0, 0.0)
            arrive(t, 0)
    now = 0.0
    for d in range(n_dev):
        peak[d] = max(peak[d], live[d])
        start(d, now)
    while events:
        now, _, kind, dev, item = heapq.heappop(events)
        if kind == 0:
            busy[dev] = False
            for t in problem.inputs_of[item]:
                refs[t][dev] -= 1
                if refs[t][dev] == 0:
                    live[dev] -= tensors[t].nbytes
            for t in problem.outputs_of[item]:
                send(t, dev, now)
                arrive(t, dev)
                if refs[t][dev] == 0:
                    live[dev] -= tensors[t].nbytes
        else:
            live[dev] += tensors[item].nbytes
            peak[dev] = max(peak[dev], live[dev])
            arrive(item, dev)
            producer = tensors[item].producer
            src = plan[producer] if producer >= 0 else 0
            refs[item][src] -= 1
            if refs[item][src] == 0:
                live[src] -= tensors[item].nbytes
        start(dev, now)
    capacity = [d.capacity(sim.footprint) for d in topology.devices]
    for d in range(n_dev):
        if peak[d] > capacity[d]:
            name = topology.devices[d].name
            return now, False, tuple(peak), f"{name} needs {peak[d] / 1e6:.1f} MB, has {capacity[d] / 1e6:.1f} MB"
    return now, True, tuple(peak), ""


def shared_weight_problem():
    """x -> two MatMuls reading one weight -> Add, and the first MatMul's output is also a graph output:
    a weight read on two devices, a value with two consumers, an output that is also read."""
    w = numpy_helper.from_array(np.eye(256, dtype=np.float32), "w")  # 256 KB against 4 KB activations
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MatMul", ["x", "w"], ["b"]),
             helper.make_node("Relu", ["a"], ["c"]), helper.make_node("Add", ["c", "b"], ["y"])]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 256]) for n in ("x", "y", "a")]
    return build_problem(graph_from_model(model_of(nodes, info[:1], info[1:], [w])), AnalyticCost())


def test_a_shared_weight_is_held_once_on_every_device_that_reads_it():
    problem = shared_weight_problem()
    sim = Simulator(problem, topology_from_json(two_gpu()))
    weight, activations = 256 * 256 * 4, 5 * 4 * 256 * 4  # every value of the graph at once
    apart, together = sim.run([0, 1, 0, 0]), sim.run([0, 0, 0, 0])
    assert apart.peak_memory[1] >= weight and apart.peak_memory[0] >= weight
    assert together.peak_memory[1] == 0.0  # nothing placed there, nothing sent there
    assert weight <= together.peak_memory[0] <= weight + activations  # one copy, not one per reader


@pytest.mark.parametrize("params", [SimParams(), SimParams(1.3, 1e-6, 2e-6, 0.5, 3e-6)], ids=["plain", "calibrated"])
@pytest.mark.parametrize("topology", ["4xgpu-pcie", "2xgpu-memcap", "8xgpu-nvlink"])
@pytest.mark.parametrize("model", ["nasnet_a", "bert", "inception_v3"])
def test_fast_event_loop_matches_the_reference_schedule_to_the_bit(model, topology, params):
    problem = build_problem(graph_from_model(zoo.build(model, small=True)), AnalyticCost(), model)
    topo = load_topology(topology)
    sim = Simulator(problem, topo, params)
    grouping = make_groups(problem, topo)
    rng = np.random.default_rng(0)
    devices = len(topo.devices)
    plans = [[d] * problem.size for d in range(devices)]
    plans += [grouping.expand(rng.integers(0, devices, grouping.count)) for _ in range(12)]
    plans.append(rng.integers(0, devices, problem.size).tolist())  # node by node, ignoring groups
    feasible = 0
    for plan in plans:
        fast = sim.run(np.asarray(plan))  # arrays and lists read alike
        assert (fast.seconds, fast.feasible, fast.peak_memory, fast.reason) == reference_run(sim, plan)
        feasible += fast.feasible
    assert feasible > 0


def test_shared_weight_problem_matches_the_reference_on_every_placement():
    problem = shared_weight_problem()
    sim = Simulator(problem, topology_from_json(two_gpu(fraction=0.9)))
    for code in range(2 ** problem.size):
        plan = [(code >> i) & 1 for i in range(problem.size)]
        fast = sim.run(plan)
        assert (fast.seconds, fast.feasible, fast.peak_memory, fast.reason) == reference_run(sim, plan)
