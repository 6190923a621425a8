"""The simulated environment: event-driven list scheduling of a placed graph over a topology."""

from __future__ import annotations

import heapq
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
        n_dev = len(devices)
        p = self.params
        self._node_time = [[(c * p.compute_scale / d.op_speed.get(op, d.speed)) + d.overhead + p.node_overhead
                            for c, op in zip(problem.costs, problem.ops, strict=True)] for d in devices]
        # links flattened to ``src * n_dev + dst``: a list index is cheaper than a tuple-keyed dict lookup in the
        # event loop, which runs once per event
        self._latency = [0.0] * (n_dev * n_dev)
        self._bandwidth = [1.0] * (n_dev * n_dev)
        for a in range(n_dev):
            for b in range(n_dev):
                if a != b:
                    link = topology.link(a, b)
                    self._latency[a * n_dev + b] = link.latency + p.transfer_overhead
                    self._bandwidth[a * n_dev + b] = link.bandwidth * p.bandwidth_scale
        self._t_prod = [t.producer for t in problem.tensors]
        self._t_cons = [t.consumers for t in problem.tensors]
        self._t_bytes = [t.nbytes for t in problem.tensors]
        self._t_out = [1 if t.is_output else 0 for t in problem.tensors]
        self._graph_inputs = [t for t, prod in enumerate(self._t_prod) if prod < 0]
        names = sorted({w for ws in problem.weights for w, _ in ws})
        column = {w: i for i, w in enumerate(names)}
        self._weight_bytes = np.zeros(len(names))
        pairs = []
        for node, ws in enumerate(problem.weights):
            for w, nbytes in ws:
                pairs.append((node, column[w]))
                self._weight_bytes[column[w]] = nbytes
        # (node, weight) reads as two index arrays: a device holds a weight when any of its nodes reads it
        self._read_node = np.array([n for n, _ in pairs], dtype=np.intp)
        self._read_weight = np.array([w for _, w in pairs], dtype=np.intp)
        self._out_bytes = [sum(self._t_bytes[t] for t in outs) for outs in problem.outputs_of]
        self._unsupported: list[list[int]] = [[] for _ in devices]
        self._pending0 = [len(ins) for ins in problem.inputs_of]
        self._capacity = [float("inf")] * n_dev
        self.footprint = self.run([0] * problem.size).peak_memory[0]
        """Peak bytes of the whole model on one device: what ``memory_fraction`` is a fraction of."""
        self._capacity = [d.capacity(self.footprint) for d in devices]
        self._unsupported = [[u for u, op in enumerate(problem.ops) if not d.supports(op)] for d in devices]

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
        wrong = [u for d, nodes in enumerate(self._unsupported) for u in nodes if plan[u] == d]
        if not wrong:
            return ""
        node = min(wrong)
        return f"{self.problem.ops[node]} is not supported on {self.topology.devices[plan[node]].name}"

    def _weights_held(self, plan: np.ndarray, n_dev: int) -> list[float]:
        """Bytes of the weights each device holds: every weight read by a node placed there, once."""
        held = np.zeros((len(self._weight_bytes), n_dev), dtype=bool)
        held[self._read_weight, plan[self._read_node]] = True
        return [float(x) for x in self._weight_bytes @ held]

    def _readers(self, plan: list[int], n_dev: int) -> tuple[list[int], list[tuple[int, ...]]]:
        """Per tensor copy, how many readers it has (``refs[t * n_dev + d]``: the consumers of tensor t on device
        d, plus outgoing transfers and graph-output status at the source; the copy is freed when they are
        done), and per tensor the devices it is sent to."""
        t_prod, t_cons, t_out = self._t_prod, self._t_cons, self._t_out
        n_t = len(t_prod)
        refs = [0] * (n_t * n_dev)
        targets: list[tuple[int, ...]] = [()] * n_t
        for t in range(n_t):
            prod = t_prod[t]
            src = plan[prod] if prod >= 0 else 0
            base = t * n_dev
            cons = t_cons[t]
            if len(cons) == 1:  # most values: one reader, at most one transfer
                d = plan[cons[0]]
                refs[base + d] += 1
                if d != src:
                    targets[t] = (d,)
                    refs[base + src] += 1 + t_out[t]
                else:
                    refs[base + src] += t_out[t]
                continue
            remote = set()
            for c in cons:
                d = plan[c]
                refs[base + d] += 1
                if d != src:
                    remote.add(d)
            targets[t] = tuple(remote)
            refs[base + src] += len(remote) + t_out[t]
        return refs, targets

    def run(self, plan: Sequence[int]) -> SimResult:
        """Simulate ``plan`` (device index per node) and report time, feasibility and peak memory.

        The event loop below is written out in one function (no helper calls, list-indexed links, no
        ``max``; the reader counts before it and the memory check after it are methods): it runs once per node and
        transfer, and on a 900-node graph it is where planning spends
        its time (REINFORCE samples and improvement moves are one simulated run each)."""
        plan = plan.tolist() if isinstance(plan, np.ndarray) else list(plan)
        reason = self.check(plan)
        n_dev = len(self.topology.devices)
        if reason:
            return SimResult(float("inf"), False, (0.0,) * n_dev, reason)
        live = self._weights_held(np.asarray(plan, dtype=np.intp), n_dev) if len(self._weight_bytes) else [0.0] * n_dev
        refs, targets = self._readers(plan, n_dev)
        t_prod, t_cons, t_bytes = self._t_prod, self._t_cons, self._t_bytes
        node_time = self._node_time
        per_segment = self.params.segment_overhead
        opens_segment = segment_starts(self.problem, plan) if per_segment > 0 else None
        latency, bandwidth = self._latency, self._bandwidth
        outputs_of, inputs_of = self.problem.outputs_of, self.problem.inputs_of
        out_bytes = self._out_bytes
        pending = list(self._pending0)
        ready: list[list[int]] = [[] for _ in range(n_dev)]
        busy = [False] * n_dev
        link_free = [0.0] * (n_dev * n_dev)
        events: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, device, node or tensor)
        seq = 0  # ties in time resolve in the order events were pushed
        push, pop = heapq.heappush, heapq.heappop
        peak = list(live)
        arrivals: list[tuple[int, int]] = []  # (tensor, device) copies that have just become available

        for node in range(self.problem.size):
            if pending[node] == 0:
                push(ready[plan[node]], node)
        for t in self._graph_inputs:
            live[0] += t_bytes[t]
            for dst in targets[t]:  # graph inputs start on device 0
                end = link_free[dst] + latency[dst] + t_bytes[t] / bandwidth[dst]
                link_free[dst] = end
                push(events, (end, seq, 1, dst, t))
                seq += 1
            arrivals.append((t, 0))
        now = 0.0
        for dev in range(n_dev):
            if live[dev] > peak[dev]:
                peak[dev] = live[dev]
        dev = -1
        while True:
            # make the consumers of every copy that just arrived ready, then start the device if it is idle
            for t, where in arrivals:
                for c in t_cons[t]:
                    if plan[c] == where:
                        pending[c] -= 1
                        if pending[c] == 0:
                            push(ready[where], c)
            arrivals.clear()
            for d in (range(n_dev) if dev < 0 else (dev,)):
                if not busy[d] and ready[d]:
                    node = pop(ready[d])
                    busy[d] = True
                    grown = live[d] + out_bytes[node]
                    live[d] = grown
                    if grown > peak[d]:
                        peak[d] = grown
                    took = node_time[d][node]
                    if opens_segment is not None and opens_segment[node]:
                        took += per_segment
                    push(events, (now + took, seq, 0, d, node))  # node done
                    seq += 1
            if not events:
                break
            now, _, kind, dev, item = pop(events)
            if kind == 0:  # node ``item`` done on ``dev``: free the inputs it was the last reader of, send outputs
                busy[dev] = False
                for t in inputs_of[item]:
                    key = t * n_dev + dev
                    refs[key] -= 1
                    if refs[key] == 0:
                        live[dev] -= t_bytes[t]
                row = dev * n_dev
                for t in outputs_of[item]:
                    nbytes = t_bytes[t]
                    for dst in targets[t]:
                        li = row + dst
                        free = link_free[li]
                        end = (now if now >= free else free) + latency[li] + nbytes / bandwidth[li]
                        link_free[li] = end
                        push(events, (end, seq, 1, dst, t))  # arrives at dst
                        seq += 1
                    for c in t_cons[t]:
                        if plan[c] == dev:
                            pending[c] -= 1
                            if pending[c] == 0:
                                push(ready[dev], c)
                    if refs[t * n_dev + dev] == 0:
                        live[dev] -= nbytes
            else:  # tensor ``item`` arrived on ``dev``; its source copy has one reader less
                grown = live[dev] + t_bytes[item]
                live[dev] = grown
                if grown > peak[dev]:
                    peak[dev] = grown
                arrivals.append((item, dev))
                prod = t_prod[item]
                src = plan[prod] if prod >= 0 else 0
                key = item * n_dev + src
                refs[key] -= 1
                if refs[key] == 0:
                    live[src] -= t_bytes[item]
        return self._result(now, peak)

    def _result(self, seconds: float, peak: list[float]) -> SimResult:
        """The result of a run that took ``seconds`` with this peak memory per device: infeasible where a device's
        peak is over its capacity."""
        for d, need in enumerate(peak):
            if need > self._capacity[d]:
                name = self.topology.devices[d].name
                return SimResult(seconds, False, tuple(peak),
                                 f"{name} needs {need / 1e6:.1f} MB, has {self._capacity[d] / 1e6:.1f} MB")
        return SimResult(seconds, True, tuple(peak))
