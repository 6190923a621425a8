"""Heuristic placements every report shows beside RL: single devices, round-robin, min-cut, m-ETF/HEFT."""

from __future__ import annotations

import numpy as np

from xflow.placement.groups import Grouping
from xflow.placement.simulator import Simulator


def single_device(grouping: Grouping, device: int) -> list[int] | None:
    """Everything on ``device`` (pinned groups stay where they must), or None if it cannot run there."""
    allowed = grouping.allowed
    if not allowed[:, device].any():
        return None
    groups = np.where(allowed[:, device], device, allowed.argmax(axis=1))
    return grouping.expand(groups)


def round_robin(grouping: Grouping) -> list[int]:
    """Groups dealt to devices in turn, in topological order (skipping devices a group cannot use)."""
    devices = grouping.allowed.shape[1]
    groups = []
    turn = 0
    for g in range(grouping.count):
        while not grouping.allowed[g, turn % devices]:
            turn += 1
        groups.append(turn % devices)
        turn += 1
    return grouping.expand(groups)


def min_cut(grouping: Grouping, sim: Simulator, balance: float = 0.1, passes: int = 8) -> list[int]:
    """A METIS-style partition of the group graph: contiguous topological blocks sized by device speed,
    then Kernighan-Lin-style moves of boundary groups that cut fewer bytes while every device's load
    stays within ``balance`` of its share."""
    devices = len(sim.topology.devices)
    speed = np.array([d.speed for d in sim.topology.devices], dtype=float)
    cost = np.zeros(grouping.count)
    for g, members in enumerate(grouping.members):
        cost[g] = sum(sim.problem.costs[u] for u in members)
    share = speed / speed.sum() * cost.sum()
    groups = np.zeros(grouping.count, dtype=np.int64)
    acc, dev = 0.0, 0
    for g in range(grouping.count):
        if acc >= share[:dev + 1].sum() and dev < devices - 1:
            dev += 1
        groups[g] = dev if grouping.allowed[g, dev] else int(grouping.allowed[g].argmax())
        acc += cost[g]
    neighbours: list[list[tuple[int, float]]] = [[] for _ in range(grouping.count)]
    for a, b, nbytes in grouping.edges:
        neighbours[a].append((b, nbytes))
        neighbours[b].append((a, nbytes))
    load = np.array([cost[groups == d].sum() for d in range(devices)])
    limit = share * (1 + balance) + 1e-15
    for _ in range(passes):
        moved = False
        for g in range(grouping.count):
            here = groups[g]
            gain = {d: 0.0 for d in range(devices)}
            for other, nbytes in neighbours[g]:
                gain[int(groups[other])] += nbytes
            best = max((d for d in range(devices) if grouping.allowed[g, d] and d != here
                        and load[d] + cost[g] <= limit[d]), key=lambda d: gain[d], default=None)
            if best is not None and gain[best] > gain[here]:
                load[here] -= cost[g]
                load[best] += cost[g]
                groups[g] = best
                moved = True
        if not moved:
            break
    return grouping.expand(groups)


def heft(grouping: Grouping, sim: Simulator, memory_aware: bool = True, reserve: float = 1.0) -> list[int]:
    """HEFT / m-ETF list scheduling over groups: groups by decreasing upward rank (mean compute + mean
    transfer to the exit), each to the device where it finishes earliest; with ``memory_aware`` (m-ETF,
    Baechi) a device is skipped once its weights plus the group's outputs would exceed its capacity
    less ``reserve`` x the model's peak activation bytes (headroom for activations)."""
    topo = sim.topology
    devices = len(topo.devices)
    prob = sim.problem
    times = np.array(sim.node_times)  # (devices, nodes)
    g_time = np.array([[times[d, list(m)].sum() for d in range(devices)] for m in grouping.members])
    g_weights = [dict(w for u in m for w in prob.weights[u]) for m in grouping.members]
    g_out = np.zeros(grouping.count)
    succs: list[list[tuple[int, float]]] = [[] for _ in range(grouping.count)]
    preds: list[list[tuple[int, float]]] = [[] for _ in range(grouping.count)]
    for a, b, nbytes in grouping.edges:
        succs[a].append((b, nbytes))
        preds[b].append((a, nbytes))
        g_out[a] = max(g_out[a], nbytes)
    pairs = [(a, b) for a in range(devices) for b in range(devices) if a != b]
    mean_link = [np.mean([topo.link(a, b).latency for a, b in pairs]) if pairs else 0.0,
                 np.mean([1 / topo.link(a, b).bandwidth for a, b in pairs]) if pairs else 0.0]
    rank = np.zeros(grouping.count)
    for g in reversed(range(grouping.count)):
        tail = max((rank[b] + mean_link[0] + nbytes * mean_link[1] for b, nbytes in succs[g] if b > g), default=0.0)
        rank[g] = g_time[g].mean() + tail
    order = sorted(range(grouping.count), key=lambda g: (-rank[g], g))
    # a group may only be scheduled after its predecessors: stable topological fix-up of the rank order
    placed = np.full(grouping.count, -1)
    finish = np.zeros(grouping.count)
    free = np.zeros(devices)
    used = [dict() for _ in range(devices)]
    # room left for activations: as much as the whole model needs live at once on one device
    headroom = reserve * (sim.footprint - float(sim.problem.weight_bytes))
    capacity = [d.capacity(sim.footprint) - headroom for d in topo.devices]
    remaining = set(range(grouping.count))
    while remaining:
        # highest rank whose predecessors are placed (merged groups can form cycles: then highest rank)
        g = next((x for x in order if x in remaining and all(placed[p] >= 0 for p, _ in preds[x] if p != x)),
                 next(x for x in order if x in remaining))
        remaining.discard(g)
        best: tuple[float, int] | None = None
        for d in np.flatnonzero(grouping.allowed[g]):
            if memory_aware:
                need = sum(b for w, b in g_weights[g].items() if w not in used[d]) + g_out[g]
                if sum(used[d].values()) + need > capacity[d]:
                    continue
            ready = max((finish[p] + (0.0 if placed[p] == d else topo.link(placed[p], d).seconds(nbytes))
                         for p, nbytes in preds[g]), default=0.0)
            end = max(ready, free[d]) + g_time[g, d]
            if best is None or end < best[0]:
                best = (end, int(d))
        if best is None:  # nothing has room: the device with the most free memory
            d = int(np.argmax([capacity[x] - sum(used[x].values()) if grouping.allowed[g, x] else -np.inf
                               for x in range(devices)]))
            ready = max((finish[p] for p, _ in preds[g]), default=0.0)
            best = (max(ready, free[d]) + g_time[g, d], d)
        finish[g], placed[g] = best
        free[best[1]] = best[0]
        used[best[1]].update(g_weights[g])
    return grouping.expand(placed)


def all_baselines(grouping: Grouping, sim: Simulator) -> dict[str, list[int]]:
    """Every baseline placement by name (``single:<device>``, ``round-robin``, ``min-cut``, ``m-etf``)."""
    plans: dict[str, list[int]] = {}
    for d, device in enumerate(sim.topology.devices):
        plan = single_device(grouping, d)
        if plan is not None:
            plans[f"single:{device.name}"] = plan
    plans["round-robin"] = round_robin(grouping)
    plans["min-cut"] = min_cut(grouping, sim)
    plans["m-etf"] = m_etf(grouping, sim)
    return plans


def m_etf(grouping: Grouping, sim: Simulator,
          reserves: tuple[float, ...] = (4.0, 3.0, 2.0, 1.5, 1.0, 0.5, 0.25, 0.0)) -> list[int]:
    """m-ETF with its activation headroom tuned: the fastest feasible of ``heft`` runs with each reserve
    (the fastest overall when none fits)."""
    plans = [heft(grouping, sim, reserve=r) for r in reserves]
    results = [sim.run(p) for p in plans]
    best = min(range(len(plans)), key=lambda i: (not results[i].feasible, results[i].seconds))
    return plans[best]
