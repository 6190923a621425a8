"""The simulated environment: event-driven list scheduling of a placed graph over a topology."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xflow.placement.problem import Problem
from xflow.placement.segments import segment_starts
from xflow.placement.topology import Topology

INFEASIBLE_SECONDS = 100.0  # the runtime an infeasible placement is charged (ColocRL's OOM constant)


@dataclass(frozen=True)
class SimParams:
    """Calibration knobs: node costs are scaled by ``compute_scale``; every node pays ``node_overhead``
    (plus its device's own); every transfer pays ``transfer_overhead`` and moves at ``bandwidth_scale``
    x the link bandwidth; the first node of each segment (a run of nodes on one device, which the
    executor runs as one ORT session call) pays ``segment_overhead``."""

    compute_scale: float = 1.0
    node_overhead: float = 0.0
    transfer_overhead: float = 0.0
    bandwidth_scale: float = 1.0
    segment_overhead: float = 0.0


@dataclass(frozen=True)
class SimResult:
    """One simulated run: step time, whether it fits, peak bytes per device, why not if it does not."""

    seconds: float
    feasible: bool
    peak_memory: tuple[float, ...]
    reason: str = ""


class Simulator:
    """Runs placements of one problem on one topology in simulation (``runtime(plan) -> seconds``).

    A device runs one node at a time, choosing among its ready nodes the earliest in topological order;
    a node is ready when all its inputs are on its device. Each value moves once per consumer device,
    over a serial link, ``latency + bytes / bandwidth``. Graph inputs start on device 0; weights live
    on every device that reads them. Memory per device = its weights + its peak of live activations."""

    def __init__(self, problem: Problem, topology: Topology, params: SimParams | None = None) -> None:
        self.problem = problem
        self.topology = topology
        self.params = params or SimParams()
        devices = topology.devices
        p = self.params
        self._node_time = [[(c * p.compute_scale / d.op_speed.get(op, d.speed)) + d.overhead + p.node_overhead
                            for c, op in zip(problem.costs, problem.ops, strict=True)] for d in devices]
        self._link = {(a, b): (topology.link(a, b).latency + p.transfer_overhead,
                               topology.link(a, b).bandwidth * p.bandwidth_scale)
                      for a in range(len(devices)) for b in range(len(devices)) if a != b}
        self._t_prod = [t.producer for t in problem.tensors]
        self._t_cons = [t.consumers for t in problem.tensors]
        self._t_bytes = [t.nbytes for t in problem.tensors]
        self._t_out = [1 if t.is_output else 0 for t in problem.tensors]
        names = sorted({w for ws in problem.weights for w, _ in ws})
        column = {w: i for i, w in enumerate(names)}
        self._reads = np.zeros((problem.size, len(names)), dtype=bool)
        self._weight_bytes = np.zeros(len(names))
        for node, ws in enumerate(problem.weights):
            for w, nbytes in ws:
                self._reads[node, column[w]] = True
                self._weight_bytes[column[w]] = nbytes
        self._out_bytes = [sum(self._t_bytes[t] for t in outs) for outs in problem.outputs_of]
        self._supported = [[True] * problem.size for _ in devices]
        self._pending0 = [len(ins) for ins in problem.inputs_of]
        self._capacity = [float("inf")] * len(devices)
        self.footprint = self.run([0] * problem.size).peak_memory[0]
        """Peak bytes of the whole model on one device: what ``memory_fraction`` is a fraction of."""
        self._capacity = [d.capacity(self.footprint) for d in devices]
        self._supported = [[d.supports(op) for op in problem.ops] for d in devices]

    @property
    def node_times(self) -> list[list[float]]:
        """Seconds of each node (columns) on each device (rows), overheads included."""
        return self._node_time

    def runtime(self, plan: Sequence[int]) -> float:
        """Step time in seconds, or ``INFEASIBLE_SECONDS`` when the plan does not fit."""
        result = self.run(plan)
        return result.seconds if result.feasible else INFEASIBLE_SECONDS

    def check(self, plan: Sequence[int]) -> str:
        """Why ``plan`` cannot run at all (unsupported op), or "" when it can."""
        for node, dev in enumerate(plan):
            if not self._supported[dev][node]:
                return f"{self.problem.ops[node]} is not supported on {self.topology.devices[dev].name}"
        return ""

    def run(self, plan: Sequence[int]) -> SimResult:
        """Simulate ``plan`` (device index per node) and report time, feasibility and peak memory."""
        reason = self.check(plan)
        n_dev = len(self.topology.devices)
        if reason:
            return SimResult(float("inf"), False, (0.0,) * n_dev, reason)
        plan = list(plan)
        plan_arr = np.asarray(plan)
        live = [float(self._weight_bytes[self._reads[plan_arr == d].any(axis=0)].sum()) for d in range(n_dev)]
        t_prod, t_cons, t_bytes, t_out = self._t_prod, self._t_cons, self._t_bytes, self._t_out
        n_t = len(t_prod)
        # refs[t * n_dev + d]: readers of tensor t's copy on device d (its consumers there, plus outgoing
        # transfers and graph-output status at the source); the copy is freed when they are done.
        refs = [0] * (n_t * n_dev)
        targets: list[tuple[int, ...]] = []
        for t in range(n_t):
            src = plan[t_prod[t]] if t_prod[t] >= 0 else 0
            remote = set()
            for c in t_cons[t]:
                d = plan[c]
                refs[t * n_dev + d] += 1
                if d != src:
                    remote.add(d)
            targets.append(tuple(remote))
            refs[t * n_dev + src] += len(remote) + t_out[t]
        node_time = self._node_time
        per_segment = self.params.segment_overhead
        opens_segment = segment_starts(self.problem, plan) if per_segment > 0 else [False] * self.problem.size
        links = self._link
        outputs_of, inputs_of = self.problem.outputs_of, self.problem.inputs_of
        out_bytes = self._out_bytes
        pending = list(self._pending0)
        ready: list[list[int]] = [[] for _ in range(n_dev)]
        busy = [False] * n_dev
        link_free: dict[tuple[int, int], float] = {}
        events: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, device, node or tensor)
        seq = itertools.count()
        push, pop = heapq.heappush, heapq.heappop
        peak = list(live)

        def send(t: int, src: int, now: float) -> None:
            nbytes = t_bytes[t]
            for dst in targets[t]:
                latency, bandwidth = links[(src, dst)]
                end = max(now, link_free.get((src, dst), 0.0)) + latency + nbytes / bandwidth
                link_free[(src, dst)] = end
                push(events, (end, next(seq), 1, dst, t))  # arrives at dst

        def arrive(t: int, dev: int) -> None:
            for c in t_cons[t]:
                if plan[c] == dev:
                    pending[c] -= 1
                    if pending[c] == 0:
                        push(ready[dev], c)

        def start(dev: int, now: float) -> None:
            if busy[dev] or not ready[dev]:
                return
            node = pop(ready[dev])
            busy[dev] = True
            live[dev] += out_bytes[node]
            peak[dev] = max(peak[dev], live[dev])
            took = node_time[dev][node] + (per_segment if opens_segment[node] else 0.0)
            push(events, (now + took, next(seq), 0, dev, node))  # node done

        for node in range(self.problem.size):
            if pending[node] == 0:
                push(ready[plan[node]], node)
        for t in range(n_t):
            if t_prod[t] < 0:
                live[0] += t_bytes[t]
                send(t, 0, 0.0)
                arrive(t, 0)
        now = 0.0
        for d in range(n_dev):
            peak[d] = max(peak[d], live[d])
            start(d, now)
        while events:
            now, _, kind, dev, item = pop(events)
            if kind == 0:
                busy[dev] = False
                for t in inputs_of[item]:
                    refs[t * n_dev + dev] -= 1
                    if refs[t * n_dev + dev] == 0:
                        live[dev] -= t_bytes[t]
                for t in outputs_of[item]:
                    send(t, dev, now)
                    arrive(t, dev)
                    if refs[t * n_dev + dev] == 0:
                        live[dev] -= t_bytes[t]
            else:  # tensor ``item`` arrived on ``dev``; its source copy has one reader less
                live[dev] += t_bytes[item]
                peak[dev] = max(peak[dev], live[dev])
                arrive(item, dev)
                src = plan[t_prod[item]] if t_prod[item] >= 0 else 0
                refs[item * n_dev + src] -= 1
                if refs[item * n_dev + src] == 0:
                    live[src] -= t_bytes[item]
            start(dev, now)
        for dev in range(n_dev):
            if peak[dev] > self._capacity[dev]:
                name = self.topology.devices[dev].name
                return SimResult(now, False, tuple(peak),
                                 f"{name} needs {peak[dev] / 1e6:.1f} MB, has {self._capacity[dev] / 1e6:.1f} MB")
        return SimResult(now, True, tuple(peak))
